"""The per-key gate: one record per key in flight, the others parked behind it.

Upholds invariant 1 of the engine (:mod:`pyharvest.core.engine.harvest`): a record whose key already
has a record in flight is parked instead of sent, and when that record is settled the gate
hands back the key's next record, which takes over the key's place in flight. goharvest
blocks its sender on a busy key; parking lets every other key carry on meanwhile.

The gate also keeps the in-flight window's accounting. Parked records count against the
window as well as sent ones, so memory stays bounded by ``maxInFlightRecords`` however hot
a key and however large the backlog.

The gate has no lock of its own. Whether a record may be sent depends on the gate *and* on
whether a remark is pending, at the same instant (invariant 3), so its owner,
:class:`~pyharvest.core.delivery.dispatch.Dispatcher`, calls every mutating method under the one
condition that guards both; a second lock would cost an acquisition per batch and still not
make that decision atomic. The counters may be read without the lock: a stale value only
delays a decision to the next pass.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from pyharvest.core.outbox.records import OutboxRecord

__all__ = ["KeyGate"]


class KeyGate:
    """Barriers per key, records parked behind them, and how full the window is."""

    __slots__ = ("_in_flight_keys", "_parked", "_parked_since", "in_flight", "limit", "parked_count")

    def __init__(self, limit: int) -> None:
        #: ``maxInFlightRecords``: records in flight plus parked ones never exceed it.
        self.limit = limit
        self.in_flight = 0
        self.parked_count = 0
        self._in_flight_keys: set[str] = set()
        self._parked: dict[str, deque[OutboxRecord]] = {}
        # When each parked queue last moved: a key that stops moving forces a remark.
        self._parked_since: dict[str, float] = {}

    @property
    def free(self) -> int:
        """Room left in the window for newly marked records."""
        return self.limit - self.in_flight - self.parked_count

    def in_flight_keys(self) -> list[str]:
        return list(self._in_flight_keys)

    def admit(self, records: Sequence[OutboxRecord], now: float) -> list[OutboxRecord]:
        """Take newly marked records, oldest first; return the ones to send now. The others
        are parked behind their keys' in-flight records, in the order they came."""
        to_send: list[OutboxRecord] = []
        in_flight_keys, parked = self._in_flight_keys, self._parked
        for rec in records:
            key = rec.key
            if key in in_flight_keys:
                queue = parked.get(key)
                if queue is None:
                    parked[key] = queue = deque()
                    self._parked_since[key] = now
                queue.append(rec)
                self.parked_count += 1
            else:
                in_flight_keys.add(key)
                to_send.append(rec)
        self.in_flight += len(to_send)
        return to_send

    def release(self, keys: Iterable[str], dispatching: bool, now: float) -> list[OutboxRecord]:
        """Settle the in-flight record of each key (its row is purged, reset or quarantined);
        return the successors to send, which keep their keys' barriers up.

        Not ``dispatching`` (a remark is pending, or leadership was lost), a key's barrier
        drops even with records parked behind it: they are no longer sent from here, and
        :meth:`drop_parked` forgets them before anything is dispatched again.
        """
        to_send: list[OutboxRecord] = []
        in_flight_keys, parked, parked_since = self._in_flight_keys, self._parked, self._parked_since
        for key in keys:
            queue = parked.get(key) if dispatching else None
            if queue:
                to_send.append(queue.popleft())
                self.parked_count -= 1
                if queue:
                    parked_since[key] = now
                else:
                    del parked[key]
                    del parked_since[key]
            else:
                in_flight_keys.discard(key)
                self.in_flight -= 1
        return to_send

    def drop_parked(self) -> None:
        """Forget every parked record. Their rows stay marked; the remark under a new leader
        id (or the next leader) takes them again, behind whatever is still in flight."""
        self._parked.clear()
        self._parked_since.clear()
        self.parked_count = 0

    def oldest_parked(self) -> float | None:
        """When the longest-stuck parked queue last moved, or ``None`` with nothing parked."""
        return min(self._parked_since.values(), default=None)
