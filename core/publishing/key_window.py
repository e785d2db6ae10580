"""The at-least-once window: the per-key gate (one record per key in flight, the others parked
behind it) and whether records may go out now, decided under one lock.

Upholds invariants 1 and 3 of the engine (:mod:`pyharvest.core.engine.harvest`):

* a record whose key already has a record in flight is parked instead of sent, and when that
  record is settled the gate hands back the key's next record, which takes over the key's
  place in flight. goharvest blocks its sender on a busy key; parking lets every other key
  carry on meanwhile. Parked records count against the window as well as sent ones, so
  memory stays bounded by ``maxInFlightRecords`` however hot a key and however large the
  backlog;
* once ``force_remark`` is raised, nothing more is dispatched, neither newly marked records
  nor the records parked behind a key whose barrier drops.

Whether a record may be sent depends on the gate *and* on whether a remark is pending, at the
same instant, so :class:`KeyGate` has no lock of its own: its one owner, :class:`KeyWindow`,
calls every mutating method under the one condition that guards both (a second lock would
cost an acquisition per batch and still not make that decision atomic). The counters may be
read without the lock: a stale value only delays a decision to the next pass.

The engine decides when to lead, stop leading or remark; the window holds what those
decisions set, and waits on the condition for room or for the window to empty.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.telemetry.logs import log

__all__ = ["KeyGate", "KeyWindow", "Outlet"]


class Outlet(Protocol):
    """Where the window sends the records it lets through (the sender)."""

    def send(self, records: Sequence[OutboxRecord]) -> None: ...


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


class KeyWindow:
    """Sends what the gate lets through to the ``outlet`` while leading with no remark pending."""

    def __init__(self, gate: KeyGate, outlet: Outlet, *, queue_timeout: float = 30.0) -> None:
        self.gate = gate
        self._outlet = outlet
        self._queue_timeout = queue_timeout
        self._cond = threading.Condition(threading.Lock())
        self._leading = False
        #: Read without the lock by the main loop, which remarks when it sees it set.
        self.force_remark = False

    @property
    def in_flight(self) -> int:
        return self.gate.in_flight

    @property
    def parked(self) -> int:
        """Marked records parked in memory behind their key's in-flight record."""
        return self.gate.parked_count

    @property
    def free(self) -> int:
        return self.gate.free

    def lead(self) -> None:
        """Dispatch under a new leader id: it starts the remark that was due, if any."""
        with self._cond:
            self._leading = True
            self.force_remark = False

    def stop_leading(self) -> None:
        with self._cond:
            self._leading = False

    def raise_remark(self) -> None:
        with self._cond:
            self.force_remark = True

    def begin_mark(self) -> None:
        """Nothing to note: at least once, a record another process marked again while it
        was in flight here is published again, a duplicate its contract allows."""

    def dispatch(self, records: Sequence[OutboxRecord]) -> None:
        """Send newly marked records through the gate; none if dispatching has stopped (they
        stay marked, and the remark or the next leader takes them again)."""
        now = time.monotonic()
        with self._cond:
            if self.force_remark or not self._leading:
                return
            to_send = self.gate.admit(records, now)
        if to_send:
            self._outlet.send(to_send)

    def release(self, keys: list[str]) -> None:
        """Lower the barriers of keys whose records are settled in the database, sending
        their parked successors while dispatching; wakes whoever waits on the window."""
        now = time.monotonic()
        with self._cond:
            to_send = self.gate.release(keys, self._leading and not self.force_remark, now)
            self._cond.notify_all()
        if to_send:
            self._outlet.send(to_send)

    def in_flight_keys(self) -> list[str]:
        with self._cond:
            return self.gate.in_flight_keys()

    def may_hold_acks(self) -> bool:
        """Whether acknowledgements may wait to be purged together: not while a key is parked
        behind one of them, nor while a remark waits for the window to empty."""
        return not self.gate.parked_count and not self.force_remark

    def wait_for_room(self, threshold: int, timeout: float) -> None:
        """Wait until the window has ``threshold`` free, a remark is raised, or ``timeout``."""
        with self._cond:
            if self.gate.free < threshold and not self.force_remark:
                self._cond.wait(timeout)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def may_mark(self, wait: float) -> bool:
        """Marking may always go on here; first, a key parked too long (``queueTimeout``)
        raises a remark. ``wait`` is not needed: nothing is waited for."""
        self.check_parked(self._queue_timeout)
        return True

    def check_parked(self, timeout: float) -> None:
        """Raise a remark if a parked key has not moved for ``timeout`` seconds: its
        in-flight record's report may never come."""
        if not self.gate.parked_count:
            return
        with self._cond:
            oldest = self.gate.oldest_parked()
            stuck = oldest is not None and time.monotonic() - oldest > timeout
            if stuck:
                self.force_remark = True
        if stuck:
            log.warning("a record waited over %.1fs behind its key's in-flight record; remarking", timeout)

    def quiesce(self, reason: str, deadline: float | None, delivering: Callable[[], bool]) -> None:
        """Stop dispatching, forget parked records (they stay marked, and a remark under a new
        leader id takes them again) and wait until nothing is in flight, or until the
        ``deadline`` passes or the delivery thread is gone (nothing would settle them)."""
        gate = self.gate
        with self._cond:
            self._leading = False
            gate.drop_parked()
            waited_from = time.monotonic()
            while gate.in_flight > 0:
                if deadline is not None and time.monotonic() > deadline:
                    break
                if not delivering():
                    break
                self._cond.wait(0.1)
        if gate.in_flight:
            log.warning(
                "%d records still in flight after %s; the next leader will remark them", gate.in_flight, reason
            )
        else:
            log.debug("quiesced for %s in %.3fs", reason, time.monotonic() - waited_from)
