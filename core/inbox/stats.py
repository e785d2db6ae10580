"""The inbox's counters: written by its worker thread, read as snapshots from any thread.

Counters that describe committed work move only after the database commit they describe,
so a snapshot never claims more than the checkpoints do.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace

from pyharvest.core.inbox.ports import TopicPartition

__all__ = ["Counters", "InboxStats"]


@dataclass(slots=True)
class InboxStats:
    """Counters since start; a snapshot (see :attr:`Inbox.stats`)."""

    applied: int = 0
    duplicates_dropped: int = 0
    dead_lettered: int = 0
    parked: int = 0
    replayed: int = 0
    commits: int = 0
    rollbacks: int = 0
    fence_rejections: int = 0
    database_errors: int = 0
    assigned: tuple[TopicPartition, ...] = ()


class Counters:
    """The live :class:`InboxStats` behind a lock, so that a snapshot is never half-updated."""

    __slots__ = ("_lock", "_stats")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = InboxStats()

    @property
    def commits(self) -> int:
        return self._stats.commits  # only the worker thread writes it

    def add(self, **deltas: int) -> None:
        """Add ``deltas`` together, as one update (called once per transaction, not per message)."""
        s = self._stats
        with self._lock:
            for name, delta in deltas.items():
                setattr(s, name, getattr(s, name) + delta)

    def snapshot(self, assigned: Iterable[TopicPartition]) -> InboxStats:
        with self._lock:
            return replace(self._stats, assigned=tuple(sorted(assigned)))
