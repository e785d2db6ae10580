"""How a configuration dataclass meets its YAML mapping: camelCase keys, Go durations, masked secrets.

The harvester's configuration (:mod:`pyharvest.core.config.settings`) and the inbox's
(:mod:`pyharvest.inbox.config`) follow the same conventions; this is their one
implementation. Fields are recognised by the names both configurations use:
``limits`` (a nested section with its own ``to_mapping()``), ``*_kafka_config``
(Kafka properties) and ``data_source``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import fields
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pyharvest.core.config.durations import format_duration, parse_duration
from pyharvest.core.config.masking import mask_data_source, mask_kafka_config
from pyharvest.core.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "ValueReader",
    "config_to_mapping",
    "did_you_mean",
    "limits_from_mapping",
    "limits_to_mapping",
    "masked_repr",
    "read_bool",
    "read_duration",
    "read_kafka_properties",
    "read_str",
    "read_whole_number",
    "section_from_mapping",
    "yaml_key",
]


def yaml_key(name: str) -> str:
    """The YAML key of attribute ``name``: camelCase, with ``id`` spelt ``ID`` as goharvest's Go
    names are (``leader_group_id`` -> ``leaderGroupID``)."""
    head, *rest = name.split("_")
    return head + "".join("ID" if part == "id" else part.capitalize() for part in rest)


def did_you_mean(key: object, known: Collection[str]) -> str:
    """``"did you mean 'leaderGroupID'? "`` for a key that is a near miss of one in ``known``
    (case aside), or ``""``."""
    if not isinstance(key, str):
        return ""
    import difflib

    by_lower = {k.lower(): k for k in known}
    close = by_lower.get(key.lower().replace("_", "")) or next(
        iter(difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.75)), None
    )
    if close is None:
        return ""
    return f"did you mean {by_lower.get(close, close)!r}? "


#: Checks and converts the value of one key; ``where`` (``section.key``) names it in a
#: :class:`ConfigError`. A nested section's ``from_mapping(data, prefix)`` is one too.
ValueReader = Callable[[Any, str], object]


def read_str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(where, f"expected a string, got {value!r}")
    return value


def read_bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(where, f"expected true or false, got {value!r}")
    return value


def read_whole_number(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(where, f"expected a whole number, got {value!r}")
    return value


def read_duration(value: object, where: str) -> float:
    """Seconds, from a Go duration (``500ms``, ``1m30s``); a bare number other than 0 is refused."""
    try:
        return parse_duration(value, where)
    except ValueError as e:
        raise ConfigError("", str(e)) from None


def read_kafka_properties(value: object, where: str) -> dict[str, object]:
    if not isinstance(value, Mapping):
        raise ConfigError(where, f"expected a mapping of Kafka properties, got {value!r}")
    return dict(value)


_C = TypeVar("_C", bound="DataclassInstance")


def section_from_mapping(cls: type[_C], data: object, prefix: str, readers: Mapping[str, ValueReader]) -> _C:
    """A ``cls`` built from the YAML section ``data`` (named ``prefix`` in errors): each key that
    has a value sets its attribute through the attribute's reader in ``readers``, or
    :func:`read_str` if it has none. A ``data`` that is not a mapping, or a key ``cls`` has no
    field for, is a :class:`ConfigError`."""
    if not isinstance(data, Mapping):
        raise ConfigError(prefix, f"expected a mapping, got {type(data).__name__}")
    known = {yaml_key(f.name): f.name for f in fields(cls)}
    out = cls()
    for key, value in data.items():
        where = f"{prefix}.{key}"
        attr = known.get(key)
        if attr is None:
            expected = ", ".join(sorted(known))
            raise ConfigError(where, f"unknown key; {did_you_mean(key, known)}expected one of: {expected}")
        if value is not None:
            setattr(out, attr, readers.get(attr, read_str)(value, where))
    return out


def limits_from_mapping(cls: type[_C], data: object, prefix: str, ints: Collection[str]) -> _C:
    """Build a limits dataclass from camelCase keys: whole numbers for the fields in ``ints``,
    Go-style durations for the rest; no section at all leaves every limit unset."""
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError(prefix, f"expected a mapping, got {data!r}")
    readers = {f.name: read_whole_number if f.name in ints else read_duration for f in fields(cls)}
    return section_from_mapping(cls, data or {}, prefix, readers)


def limits_to_mapping(limits: DataclassInstance, ints: Collection[str]) -> dict[str, object]:
    """The camelCase mapping of a limits dataclass, durations in Go's form; unset fields left out."""
    return {
        yaml_key(f.name): (v if f.name in ints else format_duration(v))
        for f in fields(limits)
        if (v := getattr(limits, f.name)) is not None
    }


def config_to_mapping(config: DataclassInstance, mask_secrets: bool) -> dict[str, object]:
    """The camelCase mapping of a configuration, ``limits`` nested, copies of its dicts and lists;
    with ``mask_secrets`` the password of ``data_source`` and secret Kafka properties are ``***``."""
    out: dict[str, object] = {}
    for f in fields(config):
        v = getattr(config, f.name)
        key = yaml_key(f.name)
        if f.name == "limits":
            out[key] = v.to_mapping()
        elif f.name.endswith("_kafka_config"):
            out[key] = mask_kafka_config(v) if mask_secrets else dict(v)
        elif f.name == "data_source" and mask_secrets:
            out[key] = mask_data_source(v)
        elif isinstance(v, Enum):
            out[key] = v.value  # the string a YAML file writes
        else:
            out[key] = list(v) if isinstance(v, list) else v
    return out


class _MaskableConfig(Protocol):
    def to_mapping(self, mask_secrets: bool = True) -> dict[str, object]: ...


def masked_repr(config: _MaskableConfig) -> str:
    """``Name({...})`` from the masked mapping: a configuration's ``__repr__`` and ``__str__``, so
    that no password reaches a log line through ``repr()`` or an f-string."""
    return f"{type(config).__name__}({config.to_mapping(mask_secrets=True)!r})"
