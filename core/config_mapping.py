"""How a configuration dataclass meets its YAML mapping: camelCase keys, Go durations, masked secrets.

The harvester's configuration (:mod:`pyharvest.core.config`) and the inbox's
(:mod:`pyharvest.inbox.config`) follow the same conventions; this is their one
implementation. Fields are recognised by the names both configurations use:
``limits`` (a nested section with its own ``to_mapping()``), ``*_kafka_config``
(Kafka properties) and ``data_source``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pyharvest.core.durations import format_duration, parse_duration
from pyharvest.core.errors import ConfigError
from pyharvest.core.masking import mask_data_source, mask_kafka_config

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "config_to_mapping",
    "limits_from_mapping",
    "limits_to_mapping",
    "masked_repr",
    "yaml_items",
    "yaml_key",
]


def yaml_key(name: str) -> str:
    """The YAML key of attribute ``name``: camelCase, with ``id`` spelt ``ID`` as goharvest's Go
    names are (``leader_group_id`` -> ``leaderGroupID``)."""
    head, *rest = name.split("_")
    return head + "".join("ID" if part == "id" else part.capitalize() for part in rest)


def yaml_items(data: Mapping[str, Any], cls: type[DataclassInstance], prefix: str) -> Iterator[tuple[str, str, Any]]:
    """``(attribute, where, value)`` for each key of ``data`` that has a value, ``where`` being
    ``prefix.key`` for error messages; a key ``cls`` has no field for is a :class:`ConfigError`."""
    known = {yaml_key(f.name): f.name for f in fields(cls)}
    for key, value in data.items():
        where = f"{prefix}.{key}"
        attr = known.get(key)
        if attr is None:
            raise ConfigError(where, f"unknown key; expected one of: {', '.join(sorted(known))}")
        if value is not None:
            yield attr, where, value


_L = TypeVar("_L", bound="DataclassInstance")


def limits_from_mapping(cls: type[_L], data: Mapping[str, Any] | None, prefix: str, ints: Collection[str]) -> _L:
    """Build a limits dataclass from camelCase keys: whole numbers for the fields in ``ints``,
    Go-style durations (or seconds) for the rest; errors name ``prefix.key``."""
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError(prefix, f"expected a mapping, got {data!r}")
    out = cls()
    for attr, where, value in yaml_items(data or {}, cls, prefix):
        if attr in ints:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(where, f"expected a whole number, got {value!r}")
            setattr(out, attr, value)
        else:
            try:
                setattr(out, attr, parse_duration(value, where))
            except ValueError as e:
                raise ConfigError("", str(e)) from None
    return out


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
        else:
            out[key] = list(v) if isinstance(v, list) else v
    return out


class _MaskableConfig(Protocol):
    def to_mapping(self, mask_secrets: bool = True) -> dict[str, object]: ...


def masked_repr(config: _MaskableConfig) -> str:
    """``Name({...})`` from the masked mapping: a configuration's ``__repr__`` and ``__str__``, so
    that no password reaches a log line through ``repr()`` or an f-string."""
    return f"{type(config).__name__}({config.to_mapping(mask_secrets=True)!r})"
