"""What :class:`~pyharvest.core.config.settings.Config` and :class:`~pyharvest.core.config.settings.Limits`
refuse when they are built: values of the wrong type.

Python callers pass values directly, not through the YAML readers of
:mod:`~pyharvest.core.config.mapping`; a wrong type must fail where it is written, naming the
field, not later as an ``AttributeError`` in ``repr()`` or a ``TypeError`` in arithmetic.
Ranges and defaults stay with ``resolve()``. Errors name the Python attribute the caller
wrote (``limits.heartbeat_timeout``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from pyharvest.core.config.durations import parse_duration
from pyharvest.core.config.mapping import did_you_mean, yaml_key
from pyharvest.core.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["check_config_types", "check_limits_types", "limits_keywords"]

_STRINGS = (
    "leader_topic", "leader_group_id", "data_source", "outbox_table", "name", "poison_policy", "group_protocol",
    "delivery", "progress_topic", "instance_id",
)


def check_limits_types(limits: DataclassInstance, ints: Collection[str]) -> None:
    """Whole numbers stay whole numbers; a duration is seconds (a number) or a Go-style string
    (``'5s'``, ``'500ms'``), converted here to seconds."""
    for f in fields(limits):
        value = getattr(limits, f.name)
        if value is None:
            continue
        where = f"limits.{f.name}"
        if f.name in ints:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(where, f"expected a whole number, got {value!r}")
        elif isinstance(value, str):
            try:
                setattr(limits, f.name, parse_duration(value, where))
            except ValueError as e:
                raise ConfigError("", str(e)) from None
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(where, f"expected seconds (a number) or a duration like '500ms' or '5s', got {value!r}")


def limits_keywords(data: Mapping[Any, Any], known: Collection[str]) -> dict[str, Any]:
    """``Limits`` keyword arguments from a mapping keyed by attribute (``heartbeat_timeout``) or
    by YAML key (``heartbeatTimeout``)."""
    by_yaml = {yaml_key(name): name for name in known}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key if key in known else by_yaml.get(key) if isinstance(key, str) else None
        if name is None:
            raise ConfigError(
                f"limits.{key}", f"unknown limit; {did_you_mean(key, known)}expected one of: {', '.join(sorted(known))}"
            )
        out[name] = value
    return out


def check_config_types(config: DataclassInstance) -> None:
    """Kafka properties are mappings (``None`` is none), names are strings, flags are booleans
    (of a :class:`~pyharvest.core.config.settings.Config`, whose fields it reads by name)."""
    for name in ("base_kafka_config", "producer_kafka_config"):
        value = getattr(config, name)
        if value is None:
            value = {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            hint = " such as {'bootstrap.servers': 'localhost:9092'}" if isinstance(value, str) else ""
            raise ConfigError(name, f"expected a mapping of Kafka properties{hint}, got {value!r}")
        setattr(config, name, dict(value))
    for name in _STRINGS:
        value = getattr(config, name)
        if not isinstance(value, str):
            raise ConfigError(name, f"expected a string, got {value!r}")
    binding, identity_headers, shards = (getattr(config, n) for n in ("binding", "identity_headers", "shards"))
    if binding is not None and not isinstance(binding, str):
        raise ConfigError("binding", f"expected the name of a dialect, got {binding!r}")
    if not isinstance(identity_headers, bool):
        raise ConfigError("identity_headers", f"expected True or False, got {identity_headers!r}")
    if isinstance(shards, bool) or not isinstance(shards, int):
        raise ConfigError("shards", f"expected a whole number, got {shards!r}")
