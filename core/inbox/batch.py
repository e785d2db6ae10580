"""The batch: one database transaction of messages, applied under the error policy and
committed with the checkpoints, fenced.

Guarantee: a batch's handler effects, the source identities it applied (dedupe), the dead
letters and parked messages it stored and, last, the fenced move of each of its partitions'
checkpoints commit in one transaction, or none of them do. A checkpoint whose fence moved
(another consumer claimed the partition) refuses the move and the whole transaction rolls
back; the partition is dropped and the rest is applied again in a new transaction, so a
zombie's effects never commit. The in-memory view of committed offsets and parked keys, and
the counters of applied work, move only once the commit succeeded; Kafka's own offsets are
written after it, for monitoring only.

Handler failures under ``errorPolicy``:

* ``stop``: roll back and raise :class:`HandlerError`; nothing of the batch commits.
* ``dead-letter``: roll back and apply the same messages again in a new transaction, with the
  failing one stored as a dead letter instead of applied (and its key parked from then on):
  the effects of the messages before it were rolled back with the failure.

With a batch handler the messages that pass dedupe and parking are gathered and handed to it
at commit, all of a transaction's at once. If it raises, which message failed is unknown: the
transaction rolls back and is applied again with the handler's part done by
:func:`~pyharvest.core.inbox.bisection.first_failure` (halves in savepoints), which names the
failing message; from there the error policy goes on as for a per-message handler.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyharvest.core.inbox.bisection import first_failure
from pyharvest.core.inbox.errors import HandlerError, first_line
from pyharvest.core.inbox.letters import DEAD, PARKED, describe_error, key_hash
from pyharvest.core.inbox.message import InboxMessage, Source
from pyharvest.core.inbox.partitions import Partitions
from pyharvest.core.inbox.ports import BatchHandler, Handler, InboxPorts, TopicPartition, Transaction
from pyharvest.core.inbox.stats import Counters

__all__ = ["Batch", "BatchFailedError", "Batches", "HandlerFailedError"]

log = logging.getLogger("pyharvest.inbox")


@dataclass(slots=True)
class Batch:
    """One open transaction and what it has done; discarded on rollback."""

    tx: Transaction
    started: float
    messages: list[InboxMessage] = field(default_factory=list)
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    seen: set[Source] = field(default_factory=set)
    #: Applied messages; the identities of those from a harvester are remembered at commit.
    done: list[InboxMessage] = field(default_factory=list)
    #: With a batch handler: the messages it applies at commit, in arrival order.
    todo: list[InboxMessage] = field(default_factory=list)
    parked_added: dict[TopicPartition, set[str]] = field(default_factory=dict)
    duplicates: int = 0
    dead: int = 0
    parked: int = 0


class HandlerFailedError(Exception):
    """The handler raised on ``message``; the error policy decides what follows."""

    def __init__(self, message: InboxMessage, error: Exception) -> None:
        super().__init__(message, error)
        self.message = message
        self.error = error


class BatchFailedError(Exception):
    """The batch handler raised on ``count`` messages, on which one is not known yet."""

    def __init__(self, count: int, error: Exception) -> None:
        super().__init__(count, error)
        self.count = count
        self.error = error


class Batches:
    """The open batch (at most one), and the messages waiting to be applied again (:attr:`redo`)."""

    def __init__(
        self,
        ports: InboxPorts,
        handler: Handler | None,
        *,
        batch_handler: BatchHandler | None = None,
        partitions: Partitions,
        counters: Counters,
        error_policy: str,
        dedupe_window: int,
        prune_every: int,
    ) -> None:
        self.open: Batch | None = None
        #: Messages taken back from a rolled-back transaction, applied before anything new.
        self.redo: list[InboxMessage] = []
        # (partition, offset) → error of a message whose handler failed in this batch: stored
        # as a dead letter when the batch is applied again. Cleared when a batch commits, and
        # after a database error (the outage may have been why the handler failed).
        self._forced_dead: dict[tuple[TopicPartition, int], str] = {}
        # A batch handler failed in this batch: apply it again bisecting (whole_failed: the
        # whole list failed last time, so start with its halves). Cleared as _forced_dead is.
        self._bisecting = False
        self._whole_failed = False
        if (handler is None) == (batch_handler is None):
            raise ValueError("give either a handler or a batch handler")
        self._db = ports.database
        self._handler = handler
        self._batch_handler = batch_handler
        self._partitions = partitions
        self._checkpoints = ports.checkpoints
        self._dedupe = ports.dedupe
        self._dead_letters = ports.dead_letters
        self._consumer = ports.consumer
        self._counters = counters
        self._stop_on_error = error_policy == "stop"
        self._dedupe_window = dedupe_window
        self._prune_every = prune_every

    # ------------------------------------------------------------------ applying

    def apply(self, messages: list[InboxMessage]) -> None:
        """Apply ``messages`` in the open batch (opening one if needed), under the error policy."""
        pending = messages
        while pending:
            batch = self.open or self._begin()
            try:
                self._apply(batch, pending)
                return
            except HandlerFailedError as h:
                pending = self._failed(h)

    def _failed(self, failure: HandlerFailedError | BatchFailedError) -> list[InboxMessage]:
        """Roll the open batch back after a handler failure; return its messages, to be
        applied again (under ``stop``, raise :class:`HandlerError` once the message is known)."""
        assert self.open is not None
        everything = self.open.messages
        self.rollback()
        error = failure.error
        if isinstance(failure, BatchFailedError):
            log.info(
                "batch handler failed on %d message(s) (%s: %s); applying them again in savepoints to find which",
                failure.count,
                type(error).__name__,
                first_line(error),
            )
            self._bisecting = self._whole_failed = True
            return everything
        m = failure.message
        if self._stop_on_error:
            raise HandlerError(m, error) from error
        log.warning(
            "handler failed on %s[%d]@%d (delivery %s): %s: %s; dead-lettered",
            m.topic,
            m.partition,
            m.offset,
            m.delivery_id,
            type(error).__name__,
            first_line(error),
        )
        self._forced_dead[((m.topic, m.partition), m.offset)] = describe_error(error)
        return everything

    def apply_redo(self) -> None:
        if self.redo:
            pending, self.redo = self.redo, []
            self.apply(pending)

    def _begin(self) -> Batch:
        self.open = Batch(self._db.begin(), time.monotonic())
        return self.open

    def _apply(self, batch: Batch, messages: list[InboxMessage]) -> None:
        # The per-message path: everything it touches is a local.
        conn = batch.tx.connection
        batch.messages.extend(messages)
        seen = batch.seen
        wanted = {m.source for m in messages if m.source is not None and m.source not in seen}
        known = self._dedupe.applied(conn, wanted) if wanted else set()
        owned = self._partitions.owned
        handler = self._handler
        todo = batch.todo if handler is None else None
        done = batch.done
        forced_dead = self._forced_dead
        positions = batch.positions
        parked_added = batch.parked_added
        # Whether any key is parked: most of the time none is, and no key needs hashing.
        parking = bool(parked_added) or any(o.parked for o in owned.values())
        duplicates = 0
        for m in messages:
            tp = (m.topic, m.partition)
            positions[tp] = m.offset + 1
            source = m.source
            if source is not None and (source in seen or source in known):
                duplicates += 1
                continue
            if parking and m.key is not None:
                parked, added = owned[tp].parked, parked_added.get(tp)
                kh = key_hash(m.key)
                if kh in parked or (added is not None and kh in added):
                    self._dead_letters.store(conn, m, PARKED, None, kh)
                    batch.parked += 1
                    continue
            if forced_dead:
                error = forced_dead.get((tp, m.offset))
                if error is not None:
                    kh = key_hash(m.key)
                    self._dead_letters.store(conn, m, DEAD, error, kh)
                    if kh is not None:
                        parked_added.setdefault(tp, set()).add(kh)
                        parking = True
                    batch.dead += 1
                    continue
            if source is not None:
                seen.add(source)
            if todo is not None:
                todo.append(m)  # applied at commit, with the rest of the transaction's
                continue
            try:
                handler(conn, m)  # type: ignore[misc]  # None only with a batch handler
            except Exception as e:
                if self._db.connection_lost(e):
                    raise
                raise HandlerFailedError(m, e) from e
            done.append(m)
        batch.duplicates += duplicates

    def _apply_gathered(self, batch: Batch) -> None:
        """With a batch handler: apply what the transaction gathered, at its commit."""
        todo, batch.todo = batch.todo, []
        handler = self._batch_handler
        assert handler is not None
        conn = batch.tx.connection
        if not self._bisecting:
            try:
                handler(conn, list(todo))  # its own list: what it does to it changes nothing here
            except Exception as e:
                if self._db.connection_lost(e):
                    raise
                raise BatchFailedError(len(todo), e) from e
        else:
            # Savepoints need a transaction begun by a write (pysqlite begins one only then,
            # and releasing a savepoint that began it would commit it): lock the fences,
            # which the commit does anyway.
            owned = self._partitions.owned
            for tp in sorted(batch.positions):
                self._checkpoints.verify(conn, tp, owned[tp].fence)
            found = first_failure(self._db, conn, handler, todo, known_to_fail=self._whole_failed)
            self._whole_failed = False
            if found is not None:
                raise HandlerFailedError(todo[found[0]], found[1]) from found[1]
        batch.done.extend(todo)

    # ------------------------------------------------------------------ ending a transaction

    def commit(self) -> None:
        """Commit the open batch, fenced; on a moved fence drop the partition and retry the rest."""
        owned = self._partitions.owned
        while (batch := self.open) is not None:
            conn = batch.tx.connection
            if batch.todo:
                try:
                    self._apply_gathered(batch)
                except (HandlerFailedError, BatchFailedError) as failure:
                    self.apply(self._failed(failure))
                    continue
            self._dedupe.remember(conn, batch.done)
            # The fenced moves come last: each holds its checkpoint row's lock until the
            # commit, so a claimant of the partition waits for no more than the commit itself.
            lost = [
                tp
                for tp in sorted(batch.positions)
                if not self._checkpoints.advance(conn, tp, batch.positions[tp], owned[tp].fence)
            ]
            if lost:
                everything = batch.messages
                self.rollback()
                self._counters.add(fence_rejections=len(lost))
                self.drop(lost, "another consumer took it over (its fence moved); rolled back")
                self.apply([m for m in everything if (m.topic, m.partition) in owned])
                continue
            if (self._counters.commits + 1) % self._prune_every == 0:
                window = self._dedupe_window
                for tp, pos in batch.positions.items():
                    self._dedupe.prune(conn, tp[0], tp[1], pos - window)
            batch.tx.commit()
            batch.tx.close()
            self.open = None
            self._forced_dead.clear()
            self._bisecting = self._whole_failed = False
            for tp, pos in batch.positions.items():
                o = owned[tp]
                o.committed = pos
                o.parked.update(batch.parked_added.get(tp, ()))
            self._counters.add(
                commits=1,
                applied=len(batch.done),
                duplicates_dropped=batch.duplicates,
                dead_lettered=batch.dead,
                parked=batch.parked,
            )
            self._consumer.commit(batch.positions)

    def finish(self) -> None:
        """Apply what waits to be applied again and commit the open batch."""
        self.apply_redo()
        if self.open is not None:
            self.commit()

    def rollback(self) -> None:
        batch, self.open = self.open, None
        if batch is None:
            return
        self._counters.add(rollbacks=1)
        failures = self._db.failures
        try:
            batch.tx.rollback()
        except failures as e:
            log.debug("rollback failed (the connection is gone; the database rolls back): %s", first_line(e))
        finally:
            with contextlib.suppress(*failures):
                batch.tx.close()

    def discard(self) -> None:
        """Roll back and forget what waited to be applied again: the next owner applies it."""
        self.redo = []
        self.rollback()

    def held(self) -> list[InboxMessage]:
        """Every message not yet committed: the open batch's, then those waiting to be applied again."""
        return (self.open.messages if self.open is not None else []) + self.redo

    def forget_failures(self) -> None:
        """Give every message whose handler failed in this batch another go."""
        self._forced_dead.clear()
        self._bisecting = self._whole_failed = False

    # ------------------------------------------------------------------ partitions

    def drop(self, tps: Iterable[TopicPartition], why: str) -> None:
        """Stop consuming partitions whose fence moved; their uncommitted messages are the new owner's."""
        dropped = self._partitions.release(tps)
        for tp in dropped:
            log.warning("dropping partition %s[%d]: %s", tp[0], tp[1], why)
        self.forget_unowned()
        if dropped:
            self._consumer.pause(dropped)

    def forget_unowned(self) -> None:
        """Forget waiting messages of partitions this consumer no longer owns."""
        if self.redo:
            owned = self._partitions.owned
            self.redo = [m for m in self.redo if (m.topic, m.partition) in owned]
