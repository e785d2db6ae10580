"""The exactly-once window: what the main loop hands over, what is in the running transaction
and committed but not yet purged, and where the shard's publishing stands, as one explicit
state under one lock.

The main loop uses it through the window operations every delivery mode offers
(:class:`~pyharvest.core.publishing.contract.Window`: ``lead``, ``dispatch``, ``quiesce``, ...);
the publisher's thread (:class:`~pyharvest.core.publishing.transactional.TransactionalPublisher`)
takes its jobs from :meth:`TransactionWindow.next_job` and reports what became of them. The
state is the window's alone: the two threads change it only through the methods here, each a
transition of :class:`WindowState`, under the window's condition.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import cast

from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.telemetry.logs import log

__all__ = ["Job", "Publish", "Purge", "TakeOver", "TransactionWindow", "WindowState"]


class WindowState(Enum):
    """Where a shard's exactly-once publishing stands: leading or not, and what is due first.

    Each event moves the state by its own table below; an event a state does not name leaves
    it unchanged (a remark raised while not leading is moot: leading again starts afresh)."""

    #: Not leading; when it leads again, a takeover comes first.
    STANDBY = "standby"
    #: Not leading for a while (a remark's quiesce); the takeover of this term still stands.
    PAUSED = "paused"
    #: Leading; fencing the shard's earlier producers and purging what their last committed
    #: transaction carried (rule 3). Nothing is marked until it is done.
    TAKING_OVER = "taking over"
    #: Leading and taken over: marked records go out in transactions.
    PUBLISHING = "publishing"
    #: Leading; a transaction aborted: nothing more goes out under this leader id until the
    #: main loop remarks.
    REMARKING = "remarking"
    #: Leading; the producer was given up (fenced, or a commit of unknown outcome): the main
    #: loop remarks while the thread takes over afresh.
    RECOVERING = "recovering"

    @property
    def leading(self) -> bool:
        return self not in (WindowState.STANDBY, WindowState.PAUSED)

    @property
    def remark_due(self) -> bool:
        return self in (WindowState.REMARKING, WindowState.RECOVERING)

    @property
    def takeover_due(self) -> bool:
        return self in (WindowState.STANDBY, WindowState.TAKING_OVER, WindowState.RECOVERING)


_S = WindowState
#: Elected, or the producer's state in doubt: a takeover before anything more is published.
_TAKEOVER_DUE: Mapping[WindowState, WindowState] = {
    _S.PAUSED: _S.STANDBY, _S.PUBLISHING: _S.TAKING_OVER, _S.REMARKING: _S.RECOVERING,
}
#: The takeover is done (in whatever state leadership is now).
_TAKEN_OVER: Mapping[WindowState, WindowState] = {
    _S.STANDBY: _S.PAUSED, _S.TAKING_OVER: _S.PUBLISHING, _S.RECOVERING: _S.REMARKING,
}
#: Stop publishing under this leader id: a remark follows.
_REMARK_DUE: Mapping[WindowState, WindowState] = {_S.TAKING_OVER: _S.RECOVERING, _S.PUBLISHING: _S.REMARKING}
#: Lead under a new leader id (elected, or a remark): the remark that was due starts.
_LEAD: Mapping[WindowState, WindowState] = {
    _S.STANDBY: _S.TAKING_OVER, _S.PAUSED: _S.PUBLISHING, _S.REMARKING: _S.PUBLISHING, _S.RECOVERING: _S.TAKING_OVER,
}
#: Stop leading (leadership lost, a quiesce).
_STOP: Mapping[WindowState, WindowState] = {
    _S.TAKING_OVER: _S.STANDBY, _S.RECOVERING: _S.STANDBY, _S.PUBLISHING: _S.PAUSED, _S.REMARKING: _S.PAUSED,
}


@dataclass(frozen=True, slots=True)
class TakeOver:
    """Fence the shard's earlier producers and purge what their last transaction carried."""


@dataclass(frozen=True, slots=True)
class Purge:
    """Purge the last committed transaction's rows, with no batch to overlap the purge with."""


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish this batch (marked records, oldest first) in one transaction."""

    batch: list[OutboxRecord]


#: What the publisher's thread is to do next.
Job = TakeOver | Purge | Publish
_TAKE_OVER, _PURGE = TakeOver(), Purge()


class TransactionWindow:
    """Records marked for transactions, bounded by ``limit`` (``maxInFlightRecords``)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._cond = threading.Condition(threading.Lock())
        self._state = WindowState.STANDBY
        self._queue: list[OutboxRecord] = []
        self._running = 0
        # What this leader holds, by id, so that no id goes out twice: another process that
        # still believes it leads the shard (a failover's overlap, before its fence) marks
        # rows under its own leader id, and this leader's next mark takes them back, though
        # they may be queued, in the running transaction, or committed already.
        self._queued_ids: set[int] = set()
        self._running_ids: frozenset[int] = frozenset()
        # Ids purged since the running mark began: that mark may have read them before the
        # purge deleted them. Ids are never reused (the dialects' DDL), so holding an id a
        # moment too long can drop no other record.
        self._purged_since_mark: set[int] = set()
        # The ids of the last committed transaction, until purged: purged while the next
        # transaction's records are on their way, and before it commits (rule 2). Written only
        # by the publisher's thread, always under the lock (a quiesce waits for it to empty);
        # the main loop reads its length for ``in_flight`` alone.
        self._unpurged: list[int] = []
        self._unpurged_ids: frozenset[int] = frozenset()
        # Keys parked behind a poison record (poisonPolicy: block, or before quarantine): their
        # records stay marked and out of transactions until the retry at _retry_parked_at.
        self._parked: set[str] = set()
        self._retry_parked_at = 0.0

    @property
    def state(self) -> WindowState:
        return self._state

    def _move(self, table: Mapping[WindowState, WindowState]) -> None:
        """One transition, under the lock; wakes both threads."""
        self._state = table.get(self._state, self._state)
        self._cond.notify_all()

    # ------------------------------------------------------------------ the main loop's side

    @property
    def in_flight(self) -> int:
        return len(self._queue) + self._running + len(self._unpurged)

    @property
    def parked(self) -> int:
        """A transaction takes whole marks: no record waits in memory behind its key (a key
        parked behind a poison record keeps its records in the table)."""
        return 0

    @property
    def free(self) -> int:
        return self._limit - self.in_flight

    @property
    def force_remark(self) -> bool:
        """Read without the lock by the main loop, which remarks when it sees it set."""
        return self._state.remark_due

    def in_flight_keys(self) -> list[str]:
        with self._cond:
            return sorted({r.key for r in self._queue})

    def begin_term(self) -> None:
        """Elected: take over (fence, read progress, purge) before anything is marked."""
        with self._cond:
            self._move(_TAKEOVER_DUE)

    def lead(self) -> None:
        """Publish under a new leader id (elected, or a remark). Keys parked behind a poison
        record stay parked until their retry is due: a remark comes after every abort."""
        with self._cond:
            self._move(_LEAD)

    def stop_leading(self) -> None:
        with self._cond:
            self._move(_STOP)
            self._drop_queue()

    def raise_remark(self) -> None:
        with self._cond:
            self._move(_REMARK_DUE)
            self._drop_queue()

    def _drop_queue(self) -> None:
        """Under the lock: what is queued stays marked, for the remark or the next leader."""
        self._queue.clear()
        self._queued_ids.clear()

    def may_mark(self, wait: float) -> bool:
        """Whether the takeover of this term is done; waits up to ``wait`` for it (it runs
        on the publisher's thread)."""
        with self._cond:
            if self._state.takeover_due:
                self._cond.wait(wait)
            return not self._state.takeover_due

    def begin_mark(self) -> None:
        with self._cond:
            self._purged_since_mark.clear()

    def dispatch(self, records: Sequence[OutboxRecord]) -> None:
        """Queue marked records for the next transaction; none while not leading or a remark
        is due. Records queued while a takeover runs go out once it is done. A record this
        leader holds already (queued, in the running transaction, or committed) is not
        queued again: another process marked its row meanwhile, and the mark took it back."""
        with self._cond:
            state = self._state
            if not state.leading or state.remark_due:
                return
            held = (self._queued_ids, self._running_ids, self._unpurged_ids, self._purged_since_mark)
            fresh = [r for r in records if not any(r.id in ids for ids in held)]
            if len(fresh) < len(records):
                log.info(
                    "%d marked records are already in this leader's transactions (another process marked "
                    "their rows meanwhile, as a leader that has not yet noticed its successor does); not "
                    "published again",
                    len(records) - len(fresh),
                )
            self._queue.extend(fresh)
            self._queued_ids.update(cast("int", r.id) for r in fresh)
            self._cond.notify_all()

    def wait_for_room(self, threshold: int, timeout: float) -> None:
        with self._cond:
            if self.free < threshold and not self._state.remark_due:
                self._cond.wait(timeout)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def quiesce(self, reason: str, deadline: float | None, delivering: Callable[[], bool]) -> None:
        """Stop publishing, drop what is queued (it stays marked) and wait for the running
        transaction to end (committed and purged, or aborted)."""
        with self._cond:
            self._move(_STOP)
            self._drop_queue()
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

    # ------------------------------------------------------------------ the publisher's side

    @property
    def leading(self) -> bool:
        return self._state.leading

    @property
    def unpurged(self) -> list[int]:
        """The ids of the last committed transaction that are not purged yet."""
        return self._unpurged

    def next_job(self, done: threading.Event) -> Job | None:
        """The thread's next job: a takeover, a purge with nothing to overlap it with, or a
        batch to publish; None once ``done`` is set and nothing is due."""
        with self._cond:
            while True:
                state = self._state
                if state.leading and state.takeover_due:
                    return _TAKE_OVER
                publishing = state is WindowState.PUBLISHING and bool(self._queue)
                if self._unpurged and not publishing:
                    return _PURGE
                if publishing:
                    batch, self._queue = self._queue, []
                    self._queued_ids = set()
                    if self._parked:
                        batch = [r for r in batch if r.key not in self._parked]
                        if not batch:
                            continue
                    self._running = len(batch)
                    self._running_ids = frozenset(cast("int", r.id) for r in batch)
                    return Publish(batch)
                if done.is_set():
                    return None
                timeout = 0.1
                if self._parked and state.leading:
                    due = self._retry_parked_at - time.monotonic()
                    if due <= 0:
                        parked = ", ".join(sorted(self._parked)[:5])
                        log.info("retrying the keys parked behind a poison record: %s", parked)
                        self._move(_REMARK_DUE)
                        self._drop_queue()
                        self._parked.clear()
                        continue
                    timeout = min(timeout, due)
                self._cond.wait(timeout)

    def ended(self, committed: list[int] | None) -> None:
        """The running batch ended: committed (its ids now wait to be purged) or not (None)."""
        with self._cond:
            self._running = 0
            self._running_ids = frozenset()
            if committed is not None:
                self._unpurged = committed
                self._unpurged_ids = frozenset(committed)
            self._cond.notify_all()

    def fenced(self) -> None:
        """The takeover's fence is up: ids still unpurged belong to the last committed
        transaction, which the progress record names and the takeover purges."""
        with self._cond:
            self._unpurged = []
            self._unpurged_ids = frozenset()

    def taken_over(self) -> None:
        """The takeover is done: the last committed transaction's rows are purged."""
        with self._cond:
            self._move(_TAKEN_OVER)

    def purged(self, ok: bool) -> None:
        """The last committed transaction's rows were purged; if not (not leading any more, or
        shutting down), nothing commits until a takeover has purged them (rule 2), whichever
        process makes it."""
        with self._cond:
            # Purged or not, they were committed: no mark may send them again.
            self._purged_since_mark.update(self._unpurged_ids)
            self._unpurged = []
            self._unpurged_ids = frozenset()
            if not ok:
                self._move(_TAKEOVER_DUE)
            else:
                self._cond.notify_all()

    def in_doubt(self) -> None:
        """The producer was given up: drop what is queued, remark, and take over afresh."""
        with self._cond:
            self._move(_TAKEOVER_DUE)
            self._move(_REMARK_DUE)
            self._drop_queue()

    def park(self, keys: Collection[str], retry_at: float) -> None:
        """Keep ``keys`` out of the next transactions until a remark at ``retry_at``."""
        with self._cond:
            self._parked.update(keys)
            self._retry_parked_at = retry_at

    def pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the window changes meanwhile."""
        with self._cond:
            self._cond.wait(seconds)
