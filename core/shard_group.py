"""Sharded Fast NELI: one group member leading the shards whose leader-topic partitions it owns.

With ``shards: N`` the leader topic has N partitions and shard ``p`` is led by the member that
owns partition ``p``, as goharvest's single leader is the owner of partition 0. One consumer per
process joins the group with cooperative-sticky assignment, so a member joining or leaving
moves only the partitions that change owner and the others keep publishing through the
rebalance. For each partition it owns, the member publishes heartbeats to that partition and
consumes them; a shard whose heartbeats do not come back within ``heartbeat_timeout`` is fenced
on its own, and a late heartbeat restores it, exactly as :mod:`pyharvest.core.neli` does for
the one leader.

A shard's engine (:class:`~pyharvest.core.harvest.HarvestEngine`) sees its :class:`ShardLease`
as its leadership. Why order holds across a move: a revocation is served inside the group's
poll, and :meth:`ShardLease.revoke` steps the engine down and waits for its in-flight records
before returning, so the next owner is not assigned the partition until nothing of this one's
is in the air. The next owner then leads under a new leader id and remarks, as after any
leader change. Acquisitions reach the engine on its own thread, at its next pulse.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from pyharvest.core.errors import TopicError
from pyharvest.core.kafka import KafkaClients, KafkaConfigMap, LeaderConsumer, Producer
from pyharvest.core.neli import Heartbeats, LeaderStatus, leader_client_configs

__all__ = ["ShardConsumer", "ShardGroup", "ShardLease", "shard_client_configs"]

log = logging.getLogger("pyharvest.shards")

StatusHandler = Callable[[LeaderStatus], None]

REBALANCE_TIMEOUT_MS = 30_000


def shard_client_configs(
    config: KafkaConfigMap, group_id: str, heartbeat_timeout: float
) -> tuple[dict[str, object], dict[str, object]]:
    """The sharded leader group's consumer configuration, and its heartbeat producer's: those
    of :func:`~pyharvest.core.neli.leader_client_configs`, with incremental rebalancing."""
    consumer, producer = leader_client_configs(config, group_id, heartbeat_timeout)
    consumer.update({
        # Incremental: a member joining or leaving moves only the shards that change owner.
        "partition.assignment.strategy": "cooperative-sticky",
        # Also the rebalance timeout: how long a rebalance waits for a member that does not
        # rejoin. librdkafka's 5 minutes left shards unowned that long after members left
        # mid-rebalance (seen on the embedded broker); the group thread polls every
        # minPollInterval, and a revocation waits at most for the in-flight records.
        "max.poll.interval.ms": max(int(consumer["session.timeout.ms"]), REBALANCE_TIMEOUT_MS),  # type: ignore[call-overload]
    })
    return consumer, producer


class ShardConsumer(LeaderConsumer, Protocol):
    def poll_partitions(self, timeout: float) -> list[int]:
        """:meth:`poll`, returning the partition of every message read."""
        ...


class ShardLease:
    """Leadership of one shard as its engine sees it (the protocol of :class:`Neli`)."""

    def __init__(self, group: ShardGroup, shard: int) -> None:
        self.group = group
        self.shard = shard
        self._on_status: StatusHandler = lambda status: None
        self._state = threading.Lock()
        # Status changes reach the engine one at a time and in order, from either thread.
        self._delivering = threading.RLock()
        self._leading = False
        self._announced = False
        self._last_pulse = float("-inf")

    def bind(self, on_status: StatusHandler) -> ShardLease:
        self._on_status = on_status
        return self

    # -- what the engine calls, on its main thread --------------------------------------

    def start(self) -> None:
        """The group is started by its owner; nothing to join here."""

    def pulse(self) -> bool:
        self._last_pulse = time.monotonic()
        with self._delivering:
            with self._state:
                due = self._leading and not self._announced
                self._announced = self._announced or due
            if due:
                self._on_status(LeaderStatus.ACQUIRED)
        return self._leading

    def poll_due(self) -> float:
        return max(0.0, self._last_pulse + self.group.min_poll_interval - time.monotonic())

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def since_last_poll(self) -> float:
        return self.group.since_last_poll

    @property
    def broker_connected(self) -> bool | None:
        return self.group.broker_connected

    def close(self) -> None:
        """The group is closed by its owner."""

    # -- what the group calls, on its thread --------------------------------------------

    def acquire(self) -> None:
        with self._state:
            self._leading = True

    def lose(self, status: LeaderStatus) -> None:
        """Stop leading: the engine steps down and quiesces before this returns."""
        with self._delivering:
            with self._state:
                was_announced, self._leading, self._announced = self._announced, False, False
            if was_announced:
                self._on_status(status)


class ShardGroup:
    """The process's member of the leader group; :meth:`pulse` is called from one thread."""

    def __init__(
        self,
        clients: KafkaClients,
        kafka_config: KafkaConfigMap,
        leader_topic: str,
        group_id: str,
        name: str,
        shards: int,
        *,
        heartbeat_timeout: float,
        min_poll_interval: float,
        poll_duration: float,
        on_assigned: Callable[[int], None] = lambda shard: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clients = clients
        self._kafka_config = dict(kafka_config)
        self.leader_topic = leader_topic
        self.group_id = group_id
        self.name = name
        self.shards = shards
        self.min_poll_interval = min_poll_interval
        self._heartbeat_timeout = heartbeat_timeout
        self._poll_duration = poll_duration
        self._on_assigned = on_assigned
        self._clock = clock
        self.leases = [ShardLease(self, p) for p in range(shards)]
        self._owned: set[int] = set()
        self._last_received: dict[int, float] = {}
        self._last_poll = clock()
        self._consumer: ShardConsumer | None = None
        self._producer: Producer | None = None
        self._heartbeats = Heartbeats(leader_topic, name)

    @property
    def owned(self) -> frozenset[int]:
        return frozenset(self._owned)

    @property
    def since_last_poll(self) -> float:
        return self._clock() - self._last_poll

    @property
    def broker_connected(self) -> bool | None:
        return getattr(self._consumer, "connected", None)

    def start(self) -> None:
        cfg = self._kafka_config
        self._clients.ensure_topic(cfg, self.leader_topic, partitions=self.shards)
        counted = getattr(self._clients, "topic_partitions", None)
        found = counted(cfg, self.leader_topic) if counted is not None else self.shards
        if found != self.shards:
            raise TopicError(
                f"leader topic {self.leader_topic!r} has {found} partition(s) but shards is {self.shards}: "
                f"each shard is one partition. Stop every reaper of group {self.group_id!r}, then name a new "
                f"leaderTopic (created with {self.shards} partitions)"
                + (
                    f" or add partitions to this one (kafka-topics --alter --partitions {self.shards})"
                    if found < self.shards
                    else " (Kafka cannot remove partitions)"
                )
                + "; see 'Changing the number of shards' in the docs"
            )
        consumer_cfg, producer_cfg = shard_client_configs(cfg, self.group_id, self._heartbeat_timeout)
        consumer = self._clients.leader_consumer(consumer_cfg)
        if not hasattr(consumer, "poll_partitions"):
            consumer.close()
            raise TopicError("the Kafka client's leader consumer cannot say which partition a heartbeat came from")
        self._consumer = consumer  # type: ignore[assignment]  # checked just above
        try:
            self._producer = self._clients.producer(producer_cfg)
            consumer.subscribe(self.leader_topic, self._assigned, self._revoked)
        except BaseException:
            self.close()
            raise
        log.info("joined leader group %r on topic %r (%d shards) as %s", self.group_id, self.leader_topic,
                 self.shards, self.name)

    def pulse(self) -> None:
        """Poll the group (serving rebalances), note which shards' heartbeats came back, fence
        those whose deadline passed, and send the next heartbeats."""
        assert self._consumer is not None and self._producer is not None
        received = self._consumer.poll_partitions(self._poll_duration)
        self._producer.poll(0)
        now = self._last_poll = self._clock()
        for p in set(received) & self._owned:
            self._last_received[p] = now
            lease = self.leases[p]
            if not lease.is_leader:
                log.info("shard %d: leading again, a heartbeat came back", p)
                lease.acquire()
        for p in sorted(self._owned):
            lease = self.leases[p]
            if lease.is_leader and now - self._last_received.get(p, now) > self._heartbeat_timeout:
                log.warning("shard %d fenced: no heartbeat came back within %.1fs", p, self._heartbeat_timeout)
                lease.lose(LeaderStatus.FENCED)
            self._heartbeats.send(self._producer, p)

    def _assigned(self, partitions: list[int]) -> None:
        now = self._clock()
        for p in sorted(partitions):
            if p >= self.shards:
                raise TopicError(
                    f"assigned partition {p} of {self.leader_topic!r}, but shards is {self.shards}: another reaper "
                    f"of group {self.group_id!r} runs with more shards; every reaper of a group needs the same number"
                )
            if p in self._owned:
                continue
            self._owned.add(p)
            self._last_received[p] = now
            log.info("shard %d assigned (partition %d of %r)", p, p, self.leader_topic)
            self._on_assigned(p)
            self.leases[p].acquire()

    def _revoked(self, partitions: list[int]) -> None:
        for p in sorted(partitions):
            if p not in self._owned:
                continue
            self._owned.discard(p)
            log.info("shard %d revoked; waiting for its in-flight records", p)
            self.leases[p].lose(LeaderStatus.REVOKED)

    def close(self) -> None:
        """Leave the group: every owned shard is revoked (and quiesced) on the way out."""
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        try:
            if consumer is not None:
                consumer.close()
        finally:
            for p in sorted(self._owned):
                self.leases[p].lose(LeaderStatus.REVOKED)
            self._owned.clear()
            if producer is not None:
                producer.flush(1.0)
                producer.close()
