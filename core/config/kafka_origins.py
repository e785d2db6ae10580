"""Which YAML key a Kafka client property came from, for when librdkafka refuses its value.

librdkafka names the property it refuses (``session.timeout.ms``), which the user may never
have written: the harvester derives some properties from its limits, and librdkafka reports
some properties under another name. :func:`explain_refusal` turns the refusal into a
:class:`~pyharvest.core.errors.ConfigError` naming the key the value came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from pyharvest.core.errors import ConfigError, KafkaPropertyError

if TYPE_CHECKING:
    from pyharvest.core.config.settings import Config

__all__ = ["explain_harvest_refusal", "explain_refusal", "property_origin"]

# librdkafka reports a refused property under its canonical name; these are set under another.
_ALIASES: dict[str, tuple[str, ...]] = {
    "message.timeout.ms": ("delivery.timeout.ms",),
    "request.required.acks": ("acks",),
    "queue.buffering.max.ms": ("linger.ms",),
    "topic.metadata.refresh.interval.ms": ("metadata.max.age.ms",),
    "max.in.flight.requests.per.connection": ("max.in.flight",),
    "compression.codec": ("compression.type",),
}


def _spellings(prop: str) -> set[str]:
    names = {prop, *_ALIASES.get(prop, ())}
    names.update(canonical for canonical, aliases in _ALIASES.items() if prop in aliases)
    return names


def property_origin(
    prop: str,
    sections: Iterable[tuple[str, Mapping[str, object]]],
    derived: Mapping[str, str] | None = None,
) -> str | None:
    """The key that set ``prop``: ``derived`` maps a property pyharvest computes to the key it is
    computed from (it wins: the computed value replaces the user's); ``sections`` are the
    ``(yaml path, properties)`` the user wrote, searched in order. ``None`` if none did."""
    names = _spellings(prop)
    for name in names:
        if derived and name in derived:
            return derived[name]
    for where, properties in sections:
        for key in properties:
            if key in names:
                return f"{where}[{key}]"
    return None


def explain_refusal(
    error: KafkaPropertyError,
    sections: Iterable[tuple[str, Mapping[str, object]]],
    derived: Mapping[str, str] | None = None,
) -> ConfigError | KafkaPropertyError:
    """A :class:`ConfigError` naming the key ``error``'s property came from, or ``error`` itself
    when no key did (a property librdkafka itself defaulted)."""
    origin = property_origin(error.property, sections, derived)
    if origin is None:
        return error
    return ConfigError(origin, f"sets Kafka's {error.property!r}, and librdkafka refuses it: {error.detail}")


def explain_harvest_refusal(error: KafkaPropertyError, config: Config) -> ConfigError | KafkaPropertyError:
    """:func:`explain_refusal` for a harvester's clients: its Kafka properties, and the leader
    group's session timeout, which is three times ``limits.heartbeatTimeout``."""
    return explain_refusal(
        error,
        (
            ("harvest.producerKafkaConfig", config.producer_kafka_config),
            ("harvest.baseKafkaConfig", config.base_kafka_config),
        ),
        {"session.timeout.ms": "harvest.limits.heartbeatTimeout"},
    )
