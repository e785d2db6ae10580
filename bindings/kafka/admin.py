"""What every confluent-kafka client of the binding is built with: its configuration (librdkafka's
logs routed into Python logging; the producer-type clients without the consumer-only
properties), the error for a configuration librdkafka refuses, the admin client of a
configuration, and the cluster's metadata asked with a deadline that names a refused login."""

from __future__ import annotations

import re
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from pyharvest.bindings.kafka.librdkafka_logs import librdkafka_logger
from pyharvest.core.config.kafka_acls import describe_principal
from pyharvest.core.errors import KafkaPropertyError
from pyharvest.core.ports.kafka import KafkaConfigMap, TopicError

__all__ = [
    "CONSUMER_ONLY_PROPERTIES",
    "admin_client",
    "client_config",
    "metadata_within",
    "producer_side",
    "refused_configuration",
]


# librdkafka's consumer-only properties: a producer (or admin client) given one logs a
# CONFWARN and ignores it. baseKafkaConfig reaches every client, so they are left out of the
# producer-type ones (the leader group's consumer keeps them).
CONSUMER_ONLY_PROPERTIES = frozenset((
    "session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy", "group.protocol",
    "group.remote.assignor", "group.id", "group.instance.id", "group.protocol.type", "max.poll.interval.ms",
    "enable.auto.commit", "auto.commit.interval.ms", "enable.auto.offset.store", "auto.offset.reset",
    "isolation.level", "fetch.wait.max.ms", "fetch.min.bytes", "fetch.max.bytes", "fetch.message.max.bytes",
    "fetch.error.backoff.ms", "fetch.queue.backoff.ms", "queued.min.messages", "queued.max.messages.kbytes",
    "enable.partition.eof", "check.crcs", "coordinator.query.interval.ms", "consume.callback.max.messages",
))


def producer_side(config: KafkaConfigMap) -> dict[str, object]:
    """``config`` without the consumer-only properties a producer or admin client would warn about."""
    return {k: v for k, v in config.items() if k not in CONSUMER_ONLY_PROPERTIES}


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


def admin_client(
    config: KafkaConfigMap, leave_out: tuple[str, ...] = (), errors: list[KafkaError] | None = None
) -> AdminClient:
    """An admin client with ``config``'s producer-side settings (but for those starting with a
    prefix in ``leave_out``); with ``errors``, its ``error_cb`` collects why no broker answers,
    for :func:`metadata_within`."""
    kept = {k: v for k, v in producer_side(config).items() if not leave_out or not k.startswith(leave_out)}
    cfg = client_config(kept)
    if errors is not None:
        cfg["error_cb"] = errors.append
    try:
        # The stub admits only scalar values; librdkafka's Python clients also take a `logger`.
        return AdminClient(cfg)  # type: ignore[arg-type]
    except KafkaException as e:
        raise refused_configuration("admin client", e) from None


def metadata_within(config: KafkaConfigMap, client: Any, errors: list[KafkaError], timeout: float) -> Any:
    """The cluster's metadata, asked by ``client`` (built with ``errors`` as its ``error_cb``)
    for up to ``timeout`` seconds. A login or a TLS handshake the broker refuses ends the wait
    at once, named with what to check; a broker that never answers, at the deadline."""
    deadline = time.monotonic() + timeout
    servers = config.get("bootstrap.servers")
    while True:
        try:
            return client.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except KafkaException as e:
            client.poll(0)  # serves error_cb
            for err in errors:
                if err.code() == KafkaError._AUTHENTICATION:
                    raise TopicError(
                        f"Kafka at bootstrap.servers={servers!r} refused the login of {describe_principal(config)}: "
                        f"{err.str()}; check sasl.username, sasl.password and sasl.mechanisms"
                    ) from None
                if err.code() == KafkaError._SSL:
                    raise TopicError(
                        f"the TLS handshake with Kafka at bootstrap.servers={servers!r} failed: {err.str()}; check "
                        "ssl.ca.location (the CA that signed the brokers' certificates) and the brokers' host names"
                    ) from None
            if time.monotonic() >= deadline:
                detail = e.args[0].str() if e.args and isinstance(e.args[0], KafkaError) else str(e)
                raise TopicError(
                    f"cannot reach Kafka at bootstrap.servers={servers!r} within {timeout:g}s: {detail}"
                ) from None
