"""Fast NELI: leader election piggy-backed on a Kafka consumer group, written once.

The leader topic has one partition per shard, and shard ``p`` is led by the member of the
group that owns partition ``p``: with ``shards: 1`` that is goharvest's single leader, the
owner of partition 0. The group assigns incrementally and stickily, for one shard too
(cooperative-sticky under the classic group protocol; the broker's assignor under KIP-848's
consumer protocol, :mod:`~pyharvest.core.election.group_protocol`): a member joining takes no
shard from a healthy leader, and a member leaving moves only its own shards, once.

For each partition it owns, a member publishes heartbeats to that partition and consumes them;
a shard whose heartbeats do not come back within ``heartbeat_timeout`` is fenced on its own (the
group may be reassigning it), and a heartbeat that arrives later while the member still owns it
restores it.

:class:`ShardGroup` is the process's member of the group and :class:`~pyharvest.core.election.lease.ShardLease`
one shard's leadership as its engine sees it. A sharded harvester (:mod:`~pyharvest.core.engine.sharded`) pulses
the group on a thread of its own; the single leader (:class:`Neli`) is the one-shard group,
pulsed on its engine's main loop.

A member with an ``instance_id`` is static (Kafka's ``group.instance.id``): restarted with the
same id it takes its shards straight back (no wait for the group to expire the dead process).
A second live process with the same id takes them too, and the broker fences the older one
at its next group heartbeat; so a static member leads the shards of its first assignment only
once two heartbeat intervals (and a poll) have passed, by when an older live holder has been
told and stepped down; counted from the shard's last heartbeat when no other process's
heartbeat shows (:mod:`~pyharvest.core.election.static_hold`).

Why order holds across a move: a revocation is served inside the group's poll, and
:meth:`~pyharvest.core.election.lease.ShardLease.lose` steps the engine down and waits for its in-flight records before
returning, so the next owner is not assigned the partition until nothing of this one's is in
the air (classic: the member rejoins only after its callback; consumer protocol: the broker
assigns a revoked partition only once the member's next heartbeat, sent after the callback,
no longer lists it). The next owner then leads under a new leader id and remarks, as after any leader
change. Acquisitions reach the engine on its own thread, at its next pulse.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from pyharvest.core.config.choices import GroupProtocol
from pyharvest.core.config.settings import Config
from pyharvest.core.election.group_protocol import (
    CLIENT_SESSION_SETTINGS,
    GroupSessions,
    choose_session,
    leader_client_configs,
    session_setting_note,
    shard_client_configs,
    wanted_session,
)
from pyharvest.core.election.heartbeats import Heartbeats
from pyharvest.core.election.leader_watch import LeaderSeen, LeaderWatch
from pyharvest.core.election.lease import LeaderStatus, ShardLease, StatusHandler
from pyharvest.core.election.static_hold import StaticHold
from pyharvest.core.errors import KafkaAuthorizationError, TopicError
from pyharvest.core.ports.kafka import (
    HeartbeatConsumer,
    KafkaClients,
    KafkaConfigMap,
    LeaderConsumer,
    LeaderTopicReader,
    Producer,
)

__all__ = ["Neli", "ShardConsumer", "ShardGroup", "group_settings"]

log = logging.getLogger("pyharvest.neli")


def group_settings(config: Config) -> dict[str, Any]:
    """A resolved config's leader group, as the keyword arguments of :class:`ShardGroup` and
    :class:`Neli` (all but the clients, the shards and the callback)."""
    limits = config.limits
    return {
        "kafka_config": config.base_kafka_config,
        "leader_topic": config.leader_topic,
        "group_id": config.leader_group_id,
        "name": config.name,
        "heartbeat_timeout": limits.heartbeat_timeout,
        "min_poll_interval": limits.min_poll_interval,
        "poll_duration": limits.poll_duration,
        "group_protocol": config.group_protocol,
        "instance_id": config.instance_id,
    }


@runtime_checkable
class ShardConsumer(LeaderConsumer, Protocol):
    def poll_partitions(self, timeout: float) -> list[int]:
        """:meth:`poll`, returning the partition of every message read."""
        ...


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
        group_protocol: str = GroupProtocol.CLASSIC,
        instance_id: str = "",
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if group_protocol not in tuple(GroupProtocol):
            raise ValueError(f"group_protocol must be one of {', '.join(GroupProtocol)}, got {group_protocol!r}")
        self.group_protocol = group_protocol
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
        self._polled = False
        self._consumer: LeaderConsumer | None = None
        self._producer: Producer | None = None
        self._heartbeats = Heartbeats(leader_topic, name, kafka_config, clock, instance_id)
        self.instance_id = instance_id
        # Who leads the shards this member does not (the status page's "led by").
        self._watch = (
            LeaderWatch(clients, kafka_config, leader_topic, shards, min(heartbeat_timeout, 5.0), wall_clock)
            if isinstance(clients, LeaderTopicReader) else None
        )
        # A static member's first assignment may be a live namesake's shards: led only from this
        # time on (see the module's docstring); None once the first assignment has come.
        # Two group heartbeat intervals: the namesake's next heartbeat may wait behind its last
        # answer (seen on a loaded machine: fenced 0.55 s after the newcomer's assignment with
        # heartbeats every 0.4 s), and a poll for it to hear of it.
        self._static_grace = (
            2 * wanted_session(heartbeat_timeout).heartbeat_ms / 1000 + min_poll_interval if instance_id else None
        )
        # A live namesake pulses (and sends a heartbeat) every minPollInterval: five would show.
        self._held = StaticHold(
            self._static_grace or 0.0, 5 * min_poll_interval, self._heartbeats.token, self._watch, clock, wall_clock
        )

    @property
    def owned(self) -> frozenset[int]:
        return frozenset(self._owned)

    @property
    def since_last_poll(self) -> float:
        return self._clock() - self._last_poll

    @property
    def broker_connected(self) -> bool | None:
        return getattr(self._consumer, "connected", None)

    @property
    def broker_error(self) -> str | None:
        """Why this member cannot lead although the broker answers (:meth:`Heartbeats.refusal`)."""
        return self._heartbeats.refusal(self._heartbeat_timeout)

    def poll_due(self) -> float:
        """Seconds until the next poll is due (0 if it is due now, or has never run)."""
        if not self._polled:
            return 0.0
        return max(0.0, self._last_poll + self.min_poll_interval - self._clock())

    def topic_problem(self) -> str | None:
        """Why the leader topic (created if missing) does not fit ``shards``; None if it does."""
        cfg = self._kafka_config
        self._clients.ensure_topic(cfg, self.leader_topic, partitions=self.shards)
        counted = getattr(self._clients, "topic_partitions", None)
        found = counted(cfg, self.leader_topic) if counted is not None else self.shards
        if found != self.shards:
            return (
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
        return None

    def start(self) -> None:
        cfg = self._kafka_config
        if problem := self.topic_problem():
            raise TopicError(problem)
        if self.group_protocol == GroupProtocol.CONSUMER:
            self._configure_consumer_group()
        elif note := session_setting_note(cfg, self._heartbeat_timeout):
            log.warning("%s", note)
        # One shard assigns cooperative-sticky too (a joining member took the eager assignor's
        # single partition from a healthy leader); the sharded group's rebalance timeout is its own.
        configs = leader_client_configs if self.shards == 1 else shard_client_configs
        consumer_cfg, producer_cfg = configs(
            cfg, self.group_id, self._heartbeat_timeout, self.group_protocol, self.instance_id
        )
        consumer = self._clients.leader_consumer(consumer_cfg)
        if self.shards > 1 and not hasattr(consumer, "poll_partitions"):
            consumer.close()
            raise TopicError("the Kafka client's leader consumer cannot say which partition a heartbeat came from")
        self._consumer = consumer
        try:
            self._producer = self._clients.producer(producer_cfg)
            if self._static_grace is not None:
                self._held.begin(isinstance(consumer, HeartbeatConsumer))
            consumer.subscribe(self.leader_topic, self._assigned, self._revoked)
        except BaseException:
            self.close()
            raise
        log.info("joined leader group %r on topic %r (%d shard%s, %s protocol) as %s%s", self.group_id,
                 self.leader_topic, self.shards, "" if self.shards == 1 else "s", self.group_protocol, self.name,
                 f" (static member, group.instance.id {self.instance_id!r})" if self.instance_id else "")

    def leaders(self) -> dict[int, LeaderSeen | None]:
        """Who leads each shard this member does not, as the leader topic's last heartbeats say
        (None: not known yet); the shards it leads are left out, and every shard when the
        Kafka client cannot read them."""
        if self._watch is None:
            return {}
        seen = self._watch.leaders()
        return {p: seen.get(p) for p in range(self.shards) if not self.leases[p].is_leader}

    def _configure_consumer_group(self) -> None:
        """Under the consumer protocol the broker holds the session: give the group the one
        ``heartbeatTimeout`` asks for, within the broker's bounds, or say at start what applies."""
        cfg = self._kafka_config
        ignored = sorted(k for k in CLIENT_SESSION_SETTINGS if k in cfg)
        if ignored:
            log.warning("groupProtocol consumer: %s in the Kafka configuration not sent to the leader consumer "
                        "(the broker holds the group's session and assigns); heartbeatTimeout sets the session",
                        ", ".join(ignored))
        if not isinstance(self._clients, GroupSessions):
            log.warning("groupProtocol consumer: the Kafka client cannot set the group's session; the broker's "
                        "group.consumer.session.timeout.ms applies (45 s by default)")
            return
        self._clients.check_consumer_protocol(cfg)
        bounds = self._clients.session_bounds(cfg)
        session, note = choose_session(self._heartbeat_timeout, bounds)
        if note:
            log.warning("groupProtocol consumer: %s", note)
        try:
            self._clients.set_group_session(cfg, self.group_id, session)
        except KafkaAuthorizationError:
            raise
        except TopicError as e:
            shown = "unknown" if bounds is None else f"{bounds.default_session_ms / 1000:g}s"
            if bounds is not None and bounds.default_session_ms < session.heartbeat_timeout_ms:
                raise TopicError(f"{e}; the broker's default session ({shown}) is shorter than heartbeatTimeout: "
                                 "the group could hand a shard over while its leader still publishes") from None
            log.warning("groupProtocol consumer: %s; the group keeps the broker's session "
                        "(group.consumer.session.timeout.ms: %s), so a process that dies without leaving has its "
                        "shards taken over after that long", e, shown)
            return
        log.info("leader group %r: session %gs, heartbeats every %gs (group configuration)", self.group_id,
                 session.session_ms / 1000, session.heartbeat_ms / 1000)

    def pulse(self) -> None:
        """Poll the group (serving rebalances), note which shards' heartbeats came back, fence
        those whose deadline passed, and send the next heartbeats."""
        assert self._consumer is not None and self._producer is not None
        beats = self._poll(self._consumer)
        received = [p for p, _ in beats]
        self._producer.poll(0)
        now = self._last_poll = self._clock()
        self._polled = True
        self._held.note(beats)
        for p in self._held.due():
            if p in self._owned:
                self._last_received[p] = now
                self.leases[p].acquire()
        for p in set(received) & self._owned:
            self._last_received[p] = now
            lease = self.leases[p]
            if not lease.is_leader and p not in self._held:
                log.info("shard %d: leading again, a heartbeat came back", p)
                lease.acquire()
        for p in sorted(self._owned):
            lease = self.leases[p]
            if lease.is_leader and now - self._last_received.get(p, now) > self._heartbeat_timeout:
                log.warning("shard %d fenced: no heartbeat came back within %.1fs", p, self._heartbeat_timeout)
                lease.lose(LeaderStatus.FENCED)
            if not (p in self._held and self._held.reading):
                self._heartbeats.send(self._producer, p)

    def _poll(self, consumer: LeaderConsumer) -> list[tuple[int, bytes | None]]:
        if isinstance(consumer, HeartbeatConsumer):
            return consumer.poll_heartbeats(self._poll_duration)
        if isinstance(consumer, ShardConsumer):
            return [(p, None) for p in consumer.poll_partitions(self._poll_duration)]
        # A client that only counts what it read (checked at start: one shard): all of it is partition 0's.
        return [(0, None)] * consumer.poll(self._poll_duration)

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
            held = self._held.hold(p) if self._static_grace is not None else ""
            if self.shards == 1:
                log.info("acquired leader status (partition 0 of %r assigned)%s", self.leader_topic, held)
            else:
                log.info("shard %d assigned (partition %d of %r)%s", p, p, self.leader_topic, held)
            self._on_assigned(p)
            if self._static_grace is None:
                self.leases[p].acquire()
        # Later assignments come through rebalances, each shard revoked (its leader quiesced) first.
        self._static_grace = None

    def _revoked(self, partitions: list[int]) -> None:
        for p in sorted(partitions):
            if p not in self._owned:
                continue
            self._owned.discard(p)
            self._held.drop(p)
            if self.shards == 1:
                log.info("lost leader status (partition 0 of %r revoked)", self.leader_topic)
            else:
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
            self._held.clear()
            if producer is not None:
                producer.flush(1.0)
                producer.close()


class Neli:
    """The single leader (``shards: 1``): the one-shard :class:`ShardGroup`, pulsed on the
    engine's main loop (so rebalance callbacks, and the status changes they bring, run there
    too); the :class:`~pyharvest.core.election.lease.Leadership` of an engine that harvests the whole outbox."""

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
        on_status: StatusHandler,
        clock: Callable[[], float] = time.monotonic,
        group_protocol: str = GroupProtocol.CLASSIC,
        instance_id: str = "",
    ) -> None:
        self._group = ShardGroup(
            clients, kafka_config, leader_topic, group_id, name, 1,
            heartbeat_timeout=heartbeat_timeout, min_poll_interval=min_poll_interval,
            poll_duration=poll_duration, clock=clock, group_protocol=group_protocol, instance_id=instance_id,
        )
        self._lease = self._group.leases[0].bind(on_status)

    @property
    def is_leader(self) -> bool:
        return self._lease.is_leader

    @property
    def broker_connected(self) -> bool | None:
        return self._group.broker_connected

    @property
    def broker_error(self) -> str | None:
        return self._group.broker_error

    @property
    def since_last_poll(self) -> float:
        return self._group.since_last_poll

    def start(self) -> None:
        self._group.start()

    def leaders(self) -> dict[int, LeaderSeen | None]:
        """Who leads the shard while this process does not (:meth:`ShardGroup.leaders`)."""
        return self._group.leaders()

    def poll_due(self) -> float:
        return self._group.poll_due()

    def pulse(self) -> bool:
        """Poll the group if a poll is due, and return whether this process leads."""
        if self._group.poll_due() <= 0:
            self._group.pulse()
        return self._lease.pulse()

    def close(self) -> None:
        """Leave the group (a graceful departure lets the next leader take over at once)."""
        self._group.close()
