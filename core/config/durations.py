"""Go-style durations (``1s``, ``500ms``, ``1m30s``) as goharvest's YAML writes them.

A duration always carries its unit, as Go's do: a bare number is refused (``0`` aside),
because ``heartbeatTimeout: 5000`` meant as milliseconds would otherwise silently become
83 minutes. Python code passes seconds as floats and never comes through here.
"""

from __future__ import annotations

import re

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_BARE_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_FORM = "expected a duration like '500ms', '1s' or '1m30s'"


def _no_unit(field: str, shown: str) -> ValueError:
    return ValueError(
        f"{field}: {shown} has no unit; durations carry one (ns, us, ms, s, m, h): "
        f"write '{shown}ms' for milliseconds or '{shown}s' for seconds"
    )


def parse_duration(value: object, field: str = "duration") -> float:
    """Return seconds from a Go duration string (``'500ms'``, ``'1m30s'``); ``0`` needs no unit.

    Raises ``ValueError`` naming ``field`` and the expected form; a bare number other than 0
    is refused with the units to choose from.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{field}: {_FORM}, got {value!r}")
    if isinstance(value, int | float):
        if value == 0:
            return 0.0
        if value < 0:
            raise ValueError(f"{field}: must not be negative, got {value!r}")
        raise _no_unit(field, f"{value:g}")
    text = value.strip()
    if text == "":
        raise ValueError(f"{field}: {_FORM}, got an empty string")
    if _BARE_NUMBER.fullmatch(text):
        if float(text) == 0:
            return 0.0
        raise _no_unit(field, text)
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(
            f"{field}: {value!r} is not a duration; expected a number with a unit "
            "(ns, us, ms, s, m, h), e.g. '500ms', '1s', '1m30s'"
        )
    return total


def format_duration(seconds: float) -> str:
    if seconds == 0:
        return "0s"
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:g}ms"
    return f"{seconds:g}s"
