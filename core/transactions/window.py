"""The exactly-once publisher's window, and the flags the main loop and its thread share
under one condition: what is queued, in the running transaction and committed but not yet
purged; whether it leads, a remark is due, a takeover is due or done; which keys are held
behind a poison record.

The main loop uses it as it would a :class:`~pyharvest.core.delivery.dispatch.Dispatcher` (``lead``,
``dispatch``, ``quiesce``, ...); :meth:`TransactionWindow.begin_term` at each election
schedules the takeover, and :attr:`TransactionWindow.ready` says when marking may start. The
thread's side is :class:`~pyharvest.core.transactions.publisher.TransactionalPublisher`, its subclass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from pyharvest.core.telemetry.logs import log
from pyharvest.core.outbox.records import OutboxRecord

__all__ = ["TransactionWindow"]


class TransactionWindow:
    """Records marked for transactions, bounded by ``limit`` (``maxInFlightRecords``)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[OutboxRecord] = []
        self._running = 0
        # The ids of the last committed transaction, until purged: purged while the next
        # transaction's records are on their way, and before it commits (rule 2).
        self._unpurged: list[int] = []
        self._leading = False
        #: Read without the lock by the main loop, which remarks when it sees it set.
        self.force_remark = False
        # Set at each election and whenever the producer's state is in doubt: the next thing
        # the thread does is fence, read the progress record and purge (rule 3).
        self._takeover = True
        #: The takeover of this term is done: the main loop may mark.
        self.ready = False
        # Keys held behind a poison record (poisonPolicy: block, or before quarantine): their
        # records stay marked and out of transactions until the retry.
        self._held: set[str] = set()

    @property
    def in_flight(self) -> int:
        return len(self._queue) + self._running + len(self._unpurged)

    parked_count = 0

    @property
    def free(self) -> int:
        return self._limit - self.in_flight

    def in_flight_keys(self) -> list[str]:
        with self._cond:
            return sorted({r.key for r in self._queue})

    def begin_term(self) -> None:
        """Elected: take over (fence, read progress, purge) before anything is marked."""
        with self._cond:
            self._takeover = True
            self.ready = False
            self._cond.notify_all()

    def lead(self) -> None:
        """Publish under a new leader id (elected, or a remark). Keys held behind a poison
        record stay held until their retry is due: a remark comes after every abort."""
        with self._cond:
            self._leading = True
            self.force_remark = False
            self._cond.notify_all()

    def stop_leading(self) -> None:
        with self._cond:
            self._leading = False
            self._queue.clear()

    def raise_remark(self) -> None:
        with self._cond:
            self.force_remark = True
            self._queue.clear()
            self._cond.notify_all()

    def dispatch(self, records: Sequence[OutboxRecord]) -> None:
        with self._cond:
            if self.force_remark or not self._leading:
                return
            self._queue.extend(records)
            self._cond.notify_all()

    def wait_for_room(self, threshold: int, timeout: float) -> None:
        with self._cond:
            if self.free < threshold and not self.force_remark:
                self._cond.wait(timeout)

    def wait_ready(self, timeout: float) -> None:
        with self._cond:
            if not self.ready:
                self._cond.wait(timeout)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def check_parked(self, timeout: float) -> None:
        """Nothing parks here: a transaction that hangs fails on its own timeouts."""

    def may_hold_acks(self) -> bool:
        return False

    def quiesce(self, reason: str, deadline: float | None, delivering: Callable[[], bool]) -> None:
        """Stop publishing, drop what is queued (it stays marked) and wait for the running
        transaction to end (committed and purged, or aborted)."""
        with self._cond:
            self._leading = False
            self._queue.clear()
            self._cond.notify_all()
            waited_from = time.monotonic()
            while self._running or self._unpurged:
                if deadline is not None and time.monotonic() > deadline:
                    break
                if not delivering():
                    break
                self._cond.wait(0.1)
            running = self._running + len(self._unpurged)
        if running:
            log.warning("a transaction of %d records still runs after %s; the next leader settles it", running, reason)
        else:
            log.debug("quiesced for %s in %.3fs", reason, time.monotonic() - waited_from)
