"""Go-style durations (``1s``, ``500ms``, ``1m30s``) as goharvest's YAML writes them."""

from __future__ import annotations

import re

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: object, field: str = "duration") -> float:
    """Return seconds. Accepts a Go duration string or a plain number of seconds.

    Raises ``ValueError`` naming ``field`` and the expected form.
    """
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a duration like '500ms', '1s' or '1m30s', got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{field}: must not be negative, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{field}: expected a duration like '500ms', '1s' or '1m30s', got {value!r}")
    text = value.strip()
    if text in ("0", ""):
        if text == "":
            raise ValueError(f"{field}: expected a duration like '500ms', '1s' or '1m30s', got an empty string")
        return 0.0
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
