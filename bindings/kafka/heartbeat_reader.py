"""The leader topic's last heartbeats, read by a consumer of no group
(:class:`~pyharvest.core.ports.kafka.LeaderTopicReader`): who leads each shard, for a standby's
status page and a static member's start (:mod:`pyharvest.core.election.leader_watch`).

A plain consumer that assigns itself the partitions and reads one message each: it joins no
group, commits nothing and takes no admin request (librdkafka's admin client aborted the
process under some broker faults, see ``cluster_probes``); it is closed after each read."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pyharvest.bindings.kafka.admin import client_config, refused_configuration
from pyharvest.core.ports.kafka import KafkaConfigMap

__all__ = ["last_heartbeats"]

# Settings of the leader group's consumer or of producers that this reader must not take.
_NOT_FOR_THE_READER = ("group.", "enable.auto", "auto.offset", "isolation", "transaction", "partition.assignment",
                       "session.timeout", "heartbeat.interval", "max.poll", "enable.idempotence", "linger",
                       "delivery.timeout", "retries", "acks", "message.send")


def last_heartbeats(config: KafkaConfigMap, topic: str, partitions: int, timeout: float) -> dict[int, bytes | None]:
    """The value of the last message of each of ``topic``'s partitions ``0 .. partitions-1``;
    an empty partition, or one not read within ``timeout`` seconds, is left out."""
    cfg = {k: v for k, v in config.items() if not k.startswith(_NOT_FOR_THE_READER)}
    cfg.update({
        # Never used to join: librdkafka wants a group id for a consumer all the same.
        "group.id": f"pyharvest-leader-watch-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 10,
    })
    try:
        consumer = Consumer(client_config(cfg))
    except KafkaException as e:
        raise refused_configuration("consumer", e) from None
    deadline = time.monotonic() + timeout
    found: dict[int, bytes | None] = {}
    try:
        wanted: list[TopicPartition] = []
        for p in range(partitions):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return found
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=remaining, cached=False)
            if high > low:
                wanted.append(TopicPartition(topic, p, high - 1))
        if not wanted:
            return found
        consumer.assign(wanted)
        left = {tp.partition for tp in wanted}
        while left and (remaining := deadline - time.monotonic()) > 0:
            msg = consumer.poll(min(remaining, 0.5))
            if msg is None:
                continue
            p = msg.partition() or 0
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    left.discard(p)
                elif err.fatal() or err.code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                                   KafkaError.UNKNOWN_TOPIC_OR_PART):
                    raise KafkaException(err)
                continue
            value = msg.value()
            # The last message wins: the partition may have grown since its end was read.
            found[p] = value if isinstance(value, bytes) or value is None else str(value).encode()
        return found
    finally:
        consumer.close()
