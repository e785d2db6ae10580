"""The leader group's protocol: Kafka's classic group protocol, or KIP-848's consumer protocol.

Fast NELI's promise is the same under both: a member whose heartbeats stop coming back fences
itself within ``heartbeatTimeout``, and the group expires a silent member only well after that
(three heartbeat timeouts), so a live member is never expired before it fenced itself. What
differs is who holds the session:

* ``classic``: the client (``session.timeout.ms``, ``heartbeat.interval.ms``, the assignor);
  the broker bounds the session with ``group.min.session.timeout.ms`` (6 s by default).
* ``consumer`` (KIP-848; Apache Kafka 4.0+, librdkafka 2.12+): the broker. librdkafka refuses
  the three client settings, the broker assigns (always incrementally) and the session and
  heartbeat interval are the group's own configuration (``consumer.session.timeout.ms``,
  ``consumer.heartbeat.interval.ms``), which the harvester sets through the admin API within
  the broker's bounds (``group.consumer.min.session.timeout.ms``: 45 s by default).

This module holds the choice and the arithmetic; the binding talks to the broker
(:class:`GroupSessions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pyharvest.core.config.choices import GroupProtocol
from pyharvest.core.errors import TopicError
from pyharvest.core.ports.kafka import KafkaConfigMap

__all__ = [
    "CLIENT_SESSION_SETTINGS",
    "GroupSession",
    "GroupSessions",
    "SessionBounds",
    "choose_session",
    "leader_client_configs",
    "session_setting_note",
    "shard_client_configs",
    "wanted_session",
]

#: What librdkafka refuses with ``group.protocol=consumer``: the broker owns them.
CLIENT_SESSION_SETTINGS = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")


@dataclass(frozen=True, slots=True)
class GroupSession:
    """A group's session and heartbeat interval, and the heartbeat timeout that fences its
    members (milliseconds)."""

    session_ms: int
    heartbeat_ms: int
    heartbeat_timeout_ms: int


@dataclass(frozen=True, slots=True)
class SessionBounds:
    """The broker's bounds on a consumer-protocol group's session (milliseconds), and what a
    group without a session of its own gets. The defaults are Apache Kafka's."""

    min_session_ms: int = 45_000
    max_session_ms: int = 60_000
    min_heartbeat_ms: int = 5_000
    max_heartbeat_ms: int = 15_000
    default_session_ms: int = 45_000
    default_heartbeat_ms: int = 5_000


def wanted_session(heartbeat_timeout: float) -> GroupSession:
    """What ``heartbeatTimeout`` asks of the group, under either protocol: a session of three
    heartbeat timeouts (a live member fences itself well before the group expires it), and a
    heartbeat interval of a fifteenth of that, 1 s by default (survivors hear of a rebalance at
    their next heartbeat to the coordinator)."""
    hb_ms = max(1, int(heartbeat_timeout * 1000))
    session_ms = hb_ms * 3
    return GroupSession(session_ms, max(1, session_ms // 15), hb_ms)


def choose_session(heartbeat_timeout: float, bounds: SessionBounds | None) -> tuple[GroupSession, str | None]:
    """The session to give a consumer-protocol group: :func:`wanted_session` within the broker's
    ``bounds`` (unknown: as asked), and what the bounds changed, for the start-up log.

    A longer session than asked only delays the takeover of a dead member's shards; a session
    shorter than ``heartbeatTimeout`` would let the group give a shard away while its leader
    still publishes, so that is refused."""
    wanted = wanted_session(heartbeat_timeout)
    if bounds is None:
        return wanted, None
    session_ms = min(max(wanted.session_ms, bounds.min_session_ms), bounds.max_session_ms)
    if session_ms < wanted.heartbeat_timeout_ms:
        raise TopicError(
            f"the broker caps a consumer group's session at {bounds.max_session_ms} ms "
            f"(group.consumer.max.session.timeout.ms), below heartbeatTimeout ({wanted.heartbeat_timeout_ms} ms): "
            "the group could hand a shard over while its leader still publishes. Lower limits.heartbeatTimeout "
            "or raise the broker's maximum"
        )
    # Below the session: the broker refuses an interval that is not.
    heartbeat_ms = min(max(wanted.heartbeat_ms, bounds.min_heartbeat_ms), bounds.max_heartbeat_ms, session_ms - 1)
    chosen = GroupSession(session_ms, heartbeat_ms, wanted.heartbeat_timeout_ms)
    if session_ms == wanted.session_ms:
        return chosen, None  # a heartbeat interval moved into the bounds changes the takeover by a fraction
    if session_ms > wanted.session_ms:  # the broker's minimum raised it
        consequence = (
            f"so a process that dies without leaving has its shards taken over after up to {session_ms / 1000:g}s. "
            "Lower the broker's minimums for a faster takeover"
        )
    else:  # its maximum capped it
        consequence = (
            f"a shorter session than asked: a member that stops heartbeating is expired after {session_ms / 1000:g}s "
            f"(still after heartbeatTimeout, once it has fenced itself), so a broker or network hiccup longer than "
            "that moves its shards. Raise group.consumer.max.session.timeout.ms for the session asked, or lower "
            "limits.heartbeatTimeout"
        )
    return chosen, (
        f"heartbeatTimeout {wanted.heartbeat_timeout_ms / 1000:g}s asks for a group session of "
        f"{wanted.session_ms / 1000:g}s and heartbeats every {wanted.heartbeat_ms / 1000:g}s, but the broker allows "
        f"sessions of {bounds.min_session_ms / 1000:g}-{bounds.max_session_ms / 1000:g}s and heartbeats every "
        f"{bounds.min_heartbeat_ms / 1000:g}-{bounds.max_heartbeat_ms / 1000:g}s "
        "(group.consumer.min/max.session.timeout.ms, group.consumer.min/max.heartbeat.interval.ms): the group gets "
        f"{session_ms / 1000:g}s and {heartbeat_ms / 1000:g}s, {consequence}"
    )


@runtime_checkable
class GroupSessions(Protocol):
    """What a Kafka client factory offers for the consumer protocol: whether the broker speaks
    it, its bounds on a group's session, and setting a group's session."""

    def check_consumer_protocol(self, config: KafkaConfigMap) -> None:
        """Raise :class:`TopicError` when the broker does not speak KIP-848's consumer protocol."""
        ...

    def session_bounds(self, config: KafkaConfigMap) -> SessionBounds | None:
        """The broker's bounds, or ``None`` when they cannot be read (no permission, say)."""
        ...

    def set_group_session(self, config: KafkaConfigMap, group_id: str, session: GroupSession) -> None:
        """Set the group's session and heartbeat interval; raise :class:`TopicError` if refused."""
        ...


def leader_client_configs(
    config: KafkaConfigMap,
    group_id: str,
    heartbeat_timeout: float,
    group_protocol: str = GroupProtocol.CLASSIC,
    instance_id: str = "",
) -> tuple[dict[str, object], dict[str, object]]:
    """The leader group's consumer configuration, and its heartbeat producer's.

    What leadership waits on: a leader that dies is replaced once the group expires it
    (``session.timeout.ms``, 3 x ``heartbeatTimeout``) and the broker completes the join;
    the survivors learn that a rebalance began at their next heartbeat to the group
    coordinator (``heartbeat.interval.ms``: librdkafka's 3 s would add up to 3 s to every
    handover, so it is a fifteenth of the session, 1 s by default; a value in the Kafka
    configuration wins).

    Under the ``consumer`` protocol the broker holds the session and the heartbeat interval
    (the group's own configuration, set by :class:`~pyharvest.core.election.neli.ShardGroup`
    at start) and assigns, so the client settings librdkafka refuses there are left out, the
    Kafka configuration's included.

    Sticky under either protocol: the classic group assigns with ``cooperative-sticky`` (the
    eager ``range`` assignor gave a single-partition group's partition to whichever member id
    sorted first, and revoked it on every rebalance: each member joining took leadership from a
    healthy leader), and KIP-848's broker assignors keep a member's partitions. ``instance_id``
    makes the member static (``group.instance.id``): a restart with the same id takes the
    member's partitions straight back.
    """
    session = wanted_session(heartbeat_timeout)
    if group_protocol == GroupProtocol.CONSUMER:
        base = {k: v for k, v in config.items() if k not in CLIENT_SESSION_SETTINGS}
        consumer: dict[str, object] = {**base, "group.protocol": GroupProtocol.CONSUMER.value}
    else:
        # The group must not expire a live member before the member fences itself.
        consumer = {"heartbeat.interval.ms": session.heartbeat_ms, **config, "session.timeout.ms": session.session_ms}
        # Incremental: a member joining or leaving moves only the partitions that change owner,
        # and nothing is revoked from a member that keeps it.
        consumer["partition.assignment.strategy"] = "cooperative-sticky"
    if instance_id:
        consumer["group.instance.id"] = instance_id
    consumer.update({"group.id": group_id, "enable.auto.commit": False, "auto.offset.reset": "latest"})
    producer: dict[str, object] = {**config, "linger.ms": 0, "delivery.timeout.ms": session.heartbeat_timeout_ms}
    if not producer.get("enable.idempotence") and "message.send.max.retries" not in producer:
        # A heartbeat is not retried: the next pulse sends another, and a refused one then
        # reports the broker's own reason (NOT_ENOUGH_REPLICAS below min.insync.replicas,
        # which readiness shows) rather than a local timeout.
        producer.setdefault("retries", 0)
    return consumer, producer


def session_setting_note(config: KafkaConfigMap, heartbeat_timeout: float) -> str | None:
    """What becomes of a ``session.timeout.ms`` in the Kafka configuration under the classic
    protocol (goharvest's YAML has users put it in ``baseKafkaConfig``): the leader group's
    session is three heartbeat timeouts whatever it says, and the producers never read it.
    None when it is absent or already that."""
    given = config.get("session.timeout.ms")
    session = wanted_session(heartbeat_timeout)
    if given is None or str(given) == str(session.session_ms):
        return None
    try:
        asks = f" (limits.heartbeatTimeout: {int(str(given)) / 3000:g}s would give it)"
    except ValueError:
        asks = ""
    return (
        f"session.timeout.ms={given} in the Kafka configuration is not the leader group's session: that is 3 x "
        f"limits.heartbeatTimeout, {session.session_ms} ms, so that a live leader fences itself before the group "
        f"expires it; set limits.heartbeatTimeout to change it{asks}. The producers do not use it"
    )


REBALANCE_TIMEOUT_MS = 30_000


def shard_client_configs(
    config: KafkaConfigMap,
    group_id: str,
    heartbeat_timeout: float,
    group_protocol: str = GroupProtocol.CLASSIC,
    instance_id: str = "",
) -> tuple[dict[str, object], dict[str, object]]:
    """The sharded leader group's consumer configuration, and its heartbeat producer's: those
    of :func:`leader_client_configs`, with a bounded rebalance timeout."""
    consumer, producer = leader_client_configs(config, group_id, heartbeat_timeout, group_protocol, instance_id)
    # The rebalance timeout: how long a rebalance waits for a member that does not
    # rejoin (or, under the consumer protocol, revoke). librdkafka's 5 minutes left shards
    # unowned that long after members left mid-rebalance (seen on the embedded broker); the
    # group thread polls every minPollInterval, and a revocation waits at most for the
    # in-flight records.
    consumer["max.poll.interval.ms"] = max(wanted_session(heartbeat_timeout).session_ms, REBALANCE_TIMEOUT_MS)
    return consumer, producer
