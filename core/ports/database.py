"""The contract between the engine and a database: mark, purge, reset.

The engine depends on nothing else of a database. A binding must be safe to call from two
threads at once: the mark loop calls :meth:`DatabaseBinding.mark` while the delivery
thread calls :meth:`DatabaseBinding.purge` and :meth:`DatabaseBinding.reset`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pyharvest.core.outbox.records import OutboxRecord

__all__ = ["ChangeFeed", "DatabaseBinding", "QuarantineBinding", "QuarantineEntry", "ShardableBinding"]


@runtime_checkable
class DatabaseBinding(Protocol):
    def mark(self, leader_id: str, limit: int) -> list[OutboxRecord]:
        """Atomically mark up to ``limit`` of the oldest rows whose leader id is null or differs
        from ``leader_id``, setting it to ``leader_id``; return them sorted by id.

        A mark that raises may still have committed on the server; the engine then forces a
        remark under a fresh leader id, so marked-but-unseen rows are picked up again.
        """
        ...

    def purge(self, ids: Sequence[int]) -> int:
        """Delete the rows with these ids (published and acknowledged); return how many went."""
        ...

    def reset(self, ids: Sequence[int], leader_id: str | None = None) -> int:
        """Clear the leader id of these rows so that they are marked again; return how many.

        With ``leader_id``, only rows still marked by that leader are reset: a deposed
        leader's late reset must not unmark a row its successor has marked since (the
        successor could then take it twice, once behind its own later records)."""
        ...

    def dispose(self) -> None:
        """Release connections. Called once, when the harvester stops."""
        ...


@dataclass(frozen=True, slots=True)
class QuarantineEntry:
    """A record Kafka refused for a reason that will not go away, and why."""

    record: OutboxRecord
    error: str
    attempts: int


@runtime_checkable
class QuarantineBinding(Protocol):
    """Optional: a binding that can park a key behind a poison record.

    A quarantined record stays in the outbox; its key is recorded in a quarantine table and
    :meth:`DatabaseBinding.mark` skips every row of a quarantined key, so the key's order is
    never broken while every other key keeps flowing. Replaying the key lifts the quarantine
    and its records flow again, oldest first.
    """

    def quarantine(self, entries: Sequence[QuarantineEntry]) -> int:
        """Park the keys of these records; return how many entries were recorded."""
        ...


@runtime_checkable
class ShardableBinding(DatabaseBinding, Protocol):
    """A binding whose outbox can be harvested in shards (``shards`` > 1)."""

    def for_shard(self, shards: int, shard: int) -> DatabaseBinding:
        """A binding on the same database whose marks take only ``shard``'s rows; disposing it
        leaves the shared resources to this binding."""
        ...


@runtime_checkable
class ChangeFeed(Protocol):
    """Optional: a binding that hears when rows may have been added to its outbox (PostgreSQL's
    ``LISTEN``), so that an idle engine marks at once instead of at the end of its pause.

    A binding without one, or whose :meth:`watch` returns None, is polled
    (:mod:`pyharvest.core.engine.idle`). A notification may be lost (the feed reconnecting); polling
    finds those rows within one ``maxMarkBackoff``.
    """

    def watch(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``wake`` (from any thread, cheaply) whenever rows may have been added, and once
        after the feed (re)connects, since a notification may have been missed while it was
        down. Returns the function that stops the calls, or None when this binding cannot
        hear changes after all (a database or driver without them)."""
        ...

    @property
    def feed_connected(self) -> bool | None:
        """Whether the feed is listening now; None when nothing watches (or it cannot)."""
        ...
