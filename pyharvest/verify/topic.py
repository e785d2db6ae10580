"""Reading a topic back from the beginning, to check it against what was stashed.

Guarantee: the read changes nothing for anyone: partitions are assigned (no group is
joined) and, unless ``consumer_config`` says otherwise, no offset is committed. Reading
stops only once at least as many messages as expected arrived and the topic went quiet, or
at the timeout; what is missing then is reported as lost, never silently ignored.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.verify.check import verify
from pyharvest.verify.identity_spec import Identity, IdentitySpec, Key, VerifyError, expected_pair, parse_identity
from pyharvest.verify.report import VerifyReport

__all__ = ["verify_topic"]

log = logging.getLogger("pyharvest.verify")


def verify_topic(
    bootstrap_servers: str,
    topic: str,
    expected: Iterable[tuple[Key, Identity]] | Iterable[OutboxRecord],
    identity: IdentitySpec = "value",
    timeout: float = 30.0,
    *,
    idle: float = 2.0,
    consumer_config: Mapping[str, object] | None = None,
) -> VerifyReport:
    """Read all of ``topic`` from the beginning and :func:`verify` it against ``expected``.

    Reading stops once at least as many messages as expected were read and none came for
    ``idle`` seconds (duplicates may trail), or after ``timeout`` seconds, whichever comes
    first — what is missing then is reported as lost. The end of a partition is judged by
    counting messages, never by the high watermark (the embedded broker's lags).

    Message keys are decoded as UTF-8 (outbox keys are strings); ``str`` identities in
    ``expected`` are encoded as UTF-8 to compare with the bytes read from Kafka.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    from pyharvest.bindings.kafka.librdkafka_logs import librdkafka_logger

    get_identity = parse_identity(identity)
    exp = [expected_pair(item, identity) for item in expected]
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"pyharvest-verify-{uuid.uuid4().hex[:8]}",  # never joined: partitions are assigned
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        # librdkafka's default, stated: records of aborted transactions (delivery: exactly-once
        # after a failover) are never read, and what is read is what consumers see.
        "isolation.level": "read_committed",
        **(consumer_config or {}),
        "logger": librdkafka_logger(),
    }
    consumer = Consumer(config)
    try:
        deadline = time.monotonic() + timeout
        partitions = _partitions(consumer, topic, deadline, KafkaException, config)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        received: list[tuple[Key, Identity]] = []
        last = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.consume(1000, 0.2)
            for m in batch:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                        raise VerifyError(_refused(config, topic, err.str()))
                    if err.fatal() or err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise VerifyError(f"cannot read topic {topic!r}: {err}")
                    # Refusals of the group are expected: the read joins none (no group ACL needed).
                    log.debug("consumer error (retried): %s", err)
                    continue
                received.append((_decode_key(m.key()), get_identity(m)))
            if batch:
                last = time.monotonic()
            elif len(received) >= len(exp) and time.monotonic() - last >= idle:
                break
    finally:
        consumer.close()
    return verify(exp, received)


def _refused(config: Mapping[str, object], topic: str, detail: str) -> str:
    from pyharvest.core.config.kafka_acls import refused, verify_acls

    return str(refused(config, verify_acls(topic)[0], detail))


def _partitions(
    consumer: Any, topic: str, deadline: float, kafka_exception: type[Exception], config: Mapping[str, object]
) -> list[int]:
    """The topic's partition ids, waiting a little for a just-created topic's metadata."""
    error: object = None
    while True:
        try:
            md = consumer.list_topics(topic, timeout=max(0.5, min(5.0, deadline - time.monotonic())))
            t = md.topics.get(topic)
            if t is not None and t.error is None and t.partitions:
                return sorted(t.partitions)
            if t is not None and t.error is not None and "AUTHORIZATION_FAILED" in (t.error.name() or ""):
                raise VerifyError(_refused(config, topic, t.error.str()))
            error = t.error if t is not None else "not in metadata"
        except kafka_exception as e:
            error = e
        if time.monotonic() >= deadline:
            raise VerifyError(f"topic {topic!r} is not readable: {error}")
        time.sleep(0.2)


def _decode_key(key: bytes | None) -> Key:
    if key is None:
        return None
    try:
        return key.decode()
    except UnicodeDecodeError:
        return key
