"""Start-up checks against Kafka: fail fast, in one line, when the broker cannot serve us.

librdkafka never gives up on an unreachable broker: a consumer retries its connection for as
long as the process lives. A command about to consume checks first, within a deadline, that
librdkafka accepts the consumer's configuration and that a broker answers.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from pyharvest.bindings.kafka.admin import metadata_within, refused_configuration
from pyharvest.bindings.kafka.librdkafka_logs import librdkafka_logger
from pyharvest.core.errors import KafkaPropertyError

__all__ = ["DEFAULT_TIMEOUT", "check_consumer", "check_properties"]

#: How long a broker has to answer: the harvester's start-up deadline for reaching Kafka.
DEFAULT_TIMEOUT = 10.0


def check_consumer(config: Mapping[str, object], timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """The topics of the cluster a consumer with ``config`` reaches, once a broker answered.

    The consumer joins no group. Raises :class:`~pyharvest.core.errors.KafkaPropertyError`
    when librdkafka refuses a property, and :class:`~pyharvest.core.errors.TopicError` when no
    broker answers within ``timeout`` seconds.
    """
    errors: list[KafkaError] = []
    try:
        consumer = Consumer({**config, "logger": librdkafka_logger(), "error_cb": errors.append})
    except KafkaException as e:
        raise refused_configuration("consumer", e) from None
    try:
        metadata = metadata_within(config, consumer, errors, timeout)
    finally:
        consumer.close()
    return sorted(metadata.topics)


class _Silent:
    """A ``logger`` for a client that is built only to have its configuration checked."""

    def log(self, level: int, msg: str, *args: object) -> None:
        pass


def check_properties(what: str, config: Mapping[str, object], consumer: bool = False) -> None:
    """Raise :class:`~pyharvest.core.errors.KafkaPropertyError` if librdkafka refuses the value
    of a property of ``config`` for a producer (or, with ``consumer``, a consumer) named
    ``what``. The client is built and dropped at once, never polled: nothing is produced or
    joined. A refusal that names no property (a certificate file that is not on this machine)
    is left for the command to meet where it runs."""
    client = Consumer if consumer else Producer
    try:
        built = client({**config, "logger": _Silent()})
    except KafkaException as e:
        error = refused_configuration(what, e)
        if isinstance(error, KafkaPropertyError):
            raise error from None
        return
    if consumer:
        built.close()
