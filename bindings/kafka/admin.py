"""What every confluent-kafka client of the binding is built with: its configuration (librdkafka's
logs routed into Python logging), the error for a configuration librdkafka refuses, and the
admin client of a configuration."""

from __future__ import annotations

import re

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from pyharvest.bindings.kafka.logs import librdkafka_logger
from pyharvest.core.errors import KafkaPropertyError
from pyharvest.core.ports.kafka import KafkaConfigMap, TopicError

__all__ = ["admin_client", "client_config", "refused_configuration"]


def client_config(config: KafkaConfigMap) -> dict[str, object]:
    # librdkafka logs through stderr by default; route its logs into Python logging instead,
    # its repeats collapsed.
    return {**config, "logger": librdkafka_logger()}


_REFUSED_PROPERTY = re.compile(r'property:? "([^"]+)"')


def refused_configuration(what: str, error: KafkaException) -> TopicError:
    """The error for a client ``what`` ("producer", "consumer"...) whose configuration librdkafka
    refused: a :class:`KafkaPropertyError` when it names the property, so that the caller can
    name the key the value came from."""
    detail = error.args[0].str().strip() if error.args and isinstance(error.args[0], KafkaError) else str(error)
    message = f"invalid Kafka {what} configuration: {detail}"
    found = _REFUSED_PROPERTY.search(detail)
    return KafkaPropertyError(message, found.group(1), detail) if found else TopicError(message)


def admin_client(config: KafkaConfigMap, leave_out: tuple[str, ...] = ()) -> AdminClient:
    """An admin client with ``config``'s settings, but for the consumer group's (and those
    starting with a prefix in ``leave_out``)."""
    prefixes = ("group.", "enable.auto", "auto.offset", *leave_out)
    admin_cfg = {k: v for k, v in config.items() if not k.startswith(prefixes)}
    try:
        # The stub admits only scalar values; librdkafka's Python clients also take a `logger`.
        return AdminClient(client_config(admin_cfg))  # type: ignore[arg-type]
    except KafkaException as e:
        raise refused_configuration("admin client", e) from None
