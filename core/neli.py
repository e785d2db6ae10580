"""Fast NELI: leader election piggy-backed on a Kafka consumer group.

The member that owns partition 0 of the leader topic is the leader. It publishes heartbeats
to that partition and consumes them; if none comes back within ``heartbeat_timeout`` it
assumes it has been cut off (the group may be reassigning the partition) and fences itself.
A heartbeat that arrives later while it still owns the partition restores leadership.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import Enum
from typing import Protocol

from pyharvest.core.kafka import DeliveryError, KafkaClients, KafkaConfigMap, LeaderConsumer, Producer

__all__ = ["Heartbeats", "LeaderStatus", "Leadership", "Neli", "leader_client_configs"]

log = logging.getLogger("pyharvest.neli")


class LeaderStatus(Enum):
    ACQUIRED = "acquired"
    REVOKED = "revoked"
    FENCED = "fenced"


def leader_client_configs(
    config: KafkaConfigMap, group_id: str, heartbeat_timeout: float
) -> tuple[dict[str, object], dict[str, object]]:
    """The leader group's consumer configuration, and its heartbeat producer's.

    What leadership waits on: a leader that dies is replaced once the group expires it
    (``session.timeout.ms``, 3 x ``heartbeatTimeout``) and the broker completes the join;
    the survivors learn that a rebalance began at their next heartbeat to the group
    coordinator (``heartbeat.interval.ms``: librdkafka's 3 s would add up to 3 s to every
    handover, so it is a fifteenth of the session, 1 s by default; a value in the Kafka
    configuration wins).
    """
    hb_ms = max(1, int(heartbeat_timeout * 1000))
    session_ms = hb_ms * 3
    consumer = {
        "heartbeat.interval.ms": max(1, session_ms // 15),
        **config,
        "group.id": group_id,
        "enable.auto.commit": False,
        # The group must not expire a live member before the member fences itself.
        "session.timeout.ms": session_ms,
        "auto.offset.reset": "latest",
    }
    return consumer, {**config, "linger.ms": 0, "delivery.timeout.ms": hb_ms}


class Heartbeats:
    """Publishes a member's heartbeats to its leader-topic partitions. A failed one is only
    counted and logged now and then: a lost heartbeat is what fencing is for."""

    def __init__(self, topic: str, name: str) -> None:
        self.topic = topic
        self.name = name
        self.errors = 0

    def send(self, producer: Producer | None, partition: int) -> None:
        assert producer is not None
        value = f"{time.time_ns()}%{self.name}".encode()
        try:
            producer.produce(self.topic, self.name, value, (), self._delivered, partition=partition)
        except Exception as e:  # noqa: BLE001
            self._delivered(DeliveryError("PRODUCE", str(e)))

    def _delivered(self, error: DeliveryError | None) -> None:
        if error is not None:
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.warning("heartbeat not delivered (%d so far): %s", self.errors, error)
        elif self.errors:
            log.info("heartbeats delivered again after %d failures", self.errors)
            self.errors = 0


class Leadership(Protocol):
    """What the engine needs of its leader election: :class:`Neli` for a single leader, a
    :class:`~pyharvest.core.shard_group.ShardLease` for one shard of a sharded outbox."""

    def start(self) -> None: ...

    def pulse(self) -> bool:
        """Poll if due, and return whether this process leads (now)."""
        ...

    def poll_due(self) -> float: ...

    @property
    def since_last_poll(self) -> float: ...

    @property
    def broker_connected(self) -> bool | None: ...

    def close(self) -> None: ...


class Neli:
    """Runs on one thread: every call of :meth:`pulse` comes from the harvester's main loop,
    and so do the callbacks (rebalance callbacks are served inside the consumer's poll)."""

    def __init__(
        self,
        clients: KafkaClients,
        kafka_config: KafkaConfigMap,
        leader_topic: str,
        group_id: str,
        name: str,
        *,
        heartbeat_timeout: float,
        min_poll_interval: float,
        poll_duration: float,
        on_status: Callable[[LeaderStatus], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clients = clients
        self._kafka_config = dict(kafka_config)
        self.leader_topic = leader_topic
        self.group_id = group_id
        self.name = name
        self._heartbeat_timeout = heartbeat_timeout
        self._min_poll_interval = min_poll_interval
        self._poll_duration = poll_duration
        self._on_status = on_status
        self._clock = clock
        self._consumer: LeaderConsumer | None = None
        self._producer: Producer | None = None
        self._assigned = False
        self._leader = False
        self._last_received = 0.0
        self._last_poll = float("-inf")
        self._heartbeats = Heartbeats(leader_topic, name)

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def broker_connected(self) -> bool | None:
        """Whether the group consumer reaches a broker, if its client can tell."""
        return getattr(self._consumer, "connected", None)

    @property
    def since_last_poll(self) -> float:
        """Seconds since the group was last polled: the harvester's max-poll-interval deadline."""
        return self._clock() - self._last_poll

    def start(self) -> None:
        cfg = self._kafka_config
        self._clients.ensure_topic(cfg, self.leader_topic, partitions=1)
        consumer_cfg, producer_cfg = leader_client_configs(cfg, self.group_id, self._heartbeat_timeout)
        self._consumer = self._clients.leader_consumer(consumer_cfg)
        try:
            self._producer = self._clients.producer(producer_cfg)
            self._consumer.subscribe(self.leader_topic, self._assigned_cb, self._revoked_cb)
        except BaseException:
            self.close()
            raise
        log.info("joined leader group %r on topic %r as %s", self.group_id, self.leader_topic, self.name)

    def poll_due(self) -> float:
        """Seconds until the next poll is due (0 if it is due now)."""
        return max(0.0, self._last_poll + self._min_poll_interval - self._clock())

    def pulse(self) -> bool:
        """Poll the group if a poll is due, publish a heartbeat if this member owns partition 0,
        and return whether this member is the leader."""
        if self.poll_due() > 0:
            return self._leader
        assert self._consumer is not None and self._producer is not None
        self._last_poll = self._clock()
        received = self._consumer.poll(self._poll_duration)
        self._producer.poll(0)
        if not self._assigned:
            return self._leader
        now = self._clock()
        if received:
            self._last_received = now
            if not self._leader:
                log.info("resumed leader status: a heartbeat came back")
                self._leader = True
                self._on_status(LeaderStatus.ACQUIRED)
        elif self._leader and now - self._last_received > self._heartbeat_timeout:
            log.warning(
                "fenced: no heartbeat came back within %.1fs; stopping publication until one does",
                self._heartbeat_timeout,
            )
            self._leader = False
            self._on_status(LeaderStatus.FENCED)
        if self._assigned:
            self._heartbeats.send(self._producer, 0)
        return self._leader

    def _assigned_cb(self, partitions: list[int]) -> None:
        log.debug("assigned partitions %s of %r", partitions, self.leader_topic)
        if 0 in partitions and not self._assigned:
            self._assigned = True
            self._leader = True
            self._last_received = self._clock()
            log.info("acquired leader status (partition 0 of %r assigned)", self.leader_topic)
            self._on_status(LeaderStatus.ACQUIRED)

    def _revoked_cb(self, partitions: list[int]) -> None:
        log.debug("revoked partitions %s of %r", partitions, self.leader_topic)
        if 0 in partitions and self._assigned:
            self._assigned = False
            was_leader, self._leader = self._leader, False
            log.info("lost leader status (partition 0 of %r revoked)", self.leader_topic)
            if was_leader:
                self._on_status(LeaderStatus.REVOKED)

    def close(self) -> None:
        """Leave the group (a graceful departure lets the next leader take over at once)."""
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        try:
            if consumer is not None:
                consumer.close()
        finally:
            if producer is not None:
                producer.flush(1.0)
                producer.close()
        if self._leader:
            self._leader = False
