"""Events a harvester emits to the handler given to :meth:`Harvest.set_event_handler`.

Handlers run on the harvester's own threads, synchronously: a handler of
:class:`LeaderRevoked` may block to wrap up leader-only work before a new leader is elected;
a handler of :class:`LeaderFenced` must return promptly, as another leader may already be
starting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DeliveryFailed",
    "Event",
    "EventHandler",
    "LeaderAcquired",
    "LeaderFenced",
    "LeaderRefreshed",
    "LeaderRevoked",
    "MeterRead",
    "MeterStats",
    "RecordQuarantined",
]


@dataclass(frozen=True, slots=True)
class LeaderAcquired:
    """This process became the leader (of ``shard``); ``leader_id`` marks the records it harvests."""

    leader_id: str
    #: The shard this concerns when the outbox is harvested in shards; None for a single leader.
    shard: int | None = None


@dataclass(frozen=True, slots=True)
class LeaderRefreshed:
    """A new leader id was generated to force a remark (after a delivery error, a failed mark or a missed deadline)."""

    leader_id: str
    #: The shard this concerns when the outbox is harvested in shards; None for a single leader.
    shard: int | None = None


@dataclass(frozen=True, slots=True)
class LeaderRevoked:
    """Leadership was handed over by a group rebalance. Publishing has stopped."""

    #: The shard this concerns when the outbox is harvested in shards; None for a single leader.
    shard: int | None = None


@dataclass(frozen=True, slots=True)
class LeaderFenced:
    """No heartbeat came back within the deadline: this process stopped publishing, on the
    assumption that another leader may be elected."""

    #: The shard this concerns when the outbox is harvested in shards; None for a single leader.
    shard: int | None = None


@dataclass(frozen=True, slots=True)
class DeliveryFailed:
    """Kafka did not take a record. ``retriable`` is false for a poison record (one that will
    fail however often it is sent: too large, invalid topic...). The record is reset and
    remarked, unless the quarantine policy parks its key. ``hint`` says what to do about a
    poison record (empty for a retriable failure)."""

    record_id: int | None
    key: str
    topic: str
    error: str
    retriable: bool
    attempts: int
    hint: str = ""


@dataclass(frozen=True, slots=True)
class RecordQuarantined:
    """A poison record exhausted ``limits.maxDeliveryAttempts``: its key is parked (its later
    records wait behind it) until an operator replays or discards it. ``hint`` says how."""

    record_id: int | None
    key: str
    topic: str
    error: str
    attempts: int
    hint: str = ""


@dataclass(frozen=True, slots=True)
class MeterStats:
    """Throughput over the last interval and since the start."""

    name: str
    total: int
    interval_count: int
    interval_seconds: float
    rate_per_second: float

    def __str__(self) -> str:
        return (
            f"{self.name}: total={self.total} last {self.interval_seconds:.1f}s: "
            f"{self.interval_count} ({self.rate_per_second:.1f}/s)"
        )


@dataclass(frozen=True, slots=True)
class MeterRead:
    """Periodic throughput statistics, at most once per ``limits.minMetricsInterval``."""

    stats: MeterStats


Event = LeaderAcquired | LeaderRefreshed | LeaderRevoked | LeaderFenced | MeterRead | DeliveryFailed | RecordQuarantined


class EventHandler(Protocol):
    """What receives a harvester's events: any callable taking one :data:`Event`, such as a
    function ``def on_event(event: Event) -> None``; pass it as ``on_event=`` to
    :class:`~pyharvest.Harvest` or to :meth:`~pyharvest.Harvest.set_event_handler`.

    It runs on the harvester's own threads, synchronously, one event at a time per thread:
    on :class:`LeaderRevoked` it may block to finish leader-only work before the next leader
    is elected; on :class:`LeaderFenced` it must return promptly (another leader may be
    starting). An exception it raises is logged and does not stop the harvester. Match on the
    event's type::

        def on_event(event: Event) -> None:
            if isinstance(event, LeaderAcquired):
                log.info("leading as %s", event.leader_id)
            elif isinstance(event, RecordQuarantined):
                alert(event.key, event.hint)
    """

    def __call__(self, event: Event, /) -> None: ...
