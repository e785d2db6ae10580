"""Dispatch control: whether marked records may go out now, decided under one lock with the gate.

Upholds invariant 3 of the engine (:mod:`pyharvest.core.engine.harvest`): once ``force_remark`` is
raised, nothing more is dispatched, neither newly marked records nor the records parked behind a
key whose barrier drops. The flags and the gate are read and changed under one condition:
a dispatch that read the flag a moment before a failure raised it could otherwise send a
record past a predecessor that is about to be reset.

The engine decides when to lead, stop leading or remark; this holds what those decisions
set, and waits on the condition for room in the window or for the window to empty.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from pyharvest.core.delivery.gate import KeyGate
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.telemetry.logs import log

__all__ = ["Dispatcher"]


class Dispatcher:
    """Sends what the gate lets through while leading with no remark pending."""

    def __init__(
        self, gate: KeyGate, send: Callable[[Sequence[OutboxRecord]], None], *, queue_timeout: float = 30.0
    ) -> None:
        self.gate = gate
        self._send = send
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
        """Marked records waiting in memory behind their key's in-flight record."""
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

    def dispatch(self, records: Sequence[OutboxRecord]) -> None:
        """Send newly marked records through the gate; none if dispatching has stopped (they
        stay marked, and the remark or the next leader takes them again)."""
        now = time.monotonic()
        with self._cond:
            if self.force_remark or not self._leading:
                return
            to_send = self.gate.admit(records, now)
        if to_send:
            self._send(to_send)

    def release(self, keys: list[str]) -> None:
        """Lower the barriers of keys whose records are settled in the database, sending
        their parked successors while dispatching; wakes whoever waits on the window."""
        now = time.monotonic()
        with self._cond:
            to_send = self.gate.release(keys, self._leading and not self.force_remark, now)
            self._cond.notify_all()
        if to_send:
            self._send(to_send)

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
