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
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from pyharvest.inbox.checkpoints import Checkpoints, TopicPartition
from pyharvest.inbox.deadletters import DeadLetters, describe_error, key_hash
from pyharvest.inbox.dedupe import Dedupe, Source
from pyharvest.inbox.errors import HandlerError, first_line
from pyharvest.inbox.message import InboxMessage
from pyharvest.inbox.partitions import Partitions
from pyharvest.inbox.ports import Handler, InboxConsumer
from pyharvest.inbox.recovery import connection_lost
from pyharvest.inbox.stats import Counters
from pyharvest.inbox.tables import DEAD, PARKED

__all__ = ["Batch", "Batches", "HandlerFailedError"]

log = logging.getLogger("pyharvest.inbox")


@dataclass(slots=True)
class Batch:
    """One open transaction and what it has done; discarded on rollback."""

    conn: sa.Connection
    txn: sa.RootTransaction
    started: float
    messages: list[InboxMessage] = field(default_factory=list)
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    seen: set[Source] = field(default_factory=set)
    identities: list[dict[str, object]] = field(default_factory=list)
    parked_added: dict[TopicPartition, set[str]] = field(default_factory=dict)
    applied: int = 0
    duplicates: int = 0
    dead: int = 0
    parked: int = 0


class HandlerFailedError(Exception):
    """The handler raised on ``message``; the error policy decides what follows."""

    def __init__(self, message: InboxMessage, error: Exception) -> None:
        super().__init__(message, error)
        self.message = message
        self.error = error


class Batches:
    """The open batch (at most one), and the messages waiting to be applied again (:attr:`redo`)."""

    def __init__(
        self,
        engine: sa.Engine,
        handler: Handler,
        *,
        partitions: Partitions,
        checkpoints: Checkpoints,
        dedupe: Dedupe,
        dead_letters: DeadLetters,
        consumer: InboxConsumer,
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
        self._engine = engine
        self._handler = handler
        self._partitions = partitions
        self._checkpoints = checkpoints
        self._dedupe = dedupe
        self._dead_letters = dead_letters
        self._consumer = consumer
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
                everything = batch.messages
                self.rollback()
                if self._stop_on_error:
                    raise HandlerError(h.message, h.error) from h.error
                m = h.message
                log.warning(
                    "handler failed on %s[%d]@%d (delivery %s): %s: %s; dead-lettered",
                    m.topic,
                    m.partition,
                    m.offset,
                    m.delivery_id,
                    type(h.error).__name__,
                    first_line(h.error),
                )
                self._forced_dead[((m.topic, m.partition), m.offset)] = describe_error(h.error)
                pending = everything

    def apply_redo(self) -> None:
        if self.redo:
            pending, self.redo = self.redo, []
            self.apply(pending)

    def _begin(self) -> Batch:
        conn = self._engine.connect()
        try:
            txn = conn.begin()
        except BaseException:
            conn.close()
            raise
        self.open = Batch(conn, txn, time.monotonic())
        return self.open

    def _apply(self, batch: Batch, messages: list[InboxMessage]) -> None:
        # The per-message path: everything it touches is a local.
        conn = batch.conn
        batch.messages.extend(messages)
        seen = batch.seen
        wanted = {m.source for m in messages if m.source is not None and m.source not in seen}
        known = self._dedupe.applied(conn, wanted) if wanted else set()
        owned = self._partitions.owned
        handler = self._handler
        forced_dead = self._forced_dead
        positions = batch.positions
        for m in messages:
            tp = (m.topic, m.partition)
            positions[tp] = m.offset + 1
            source = m.source
            if source is not None and (source in seen or source in known):
                batch.duplicates += 1
                continue
            if m.key is not None:
                parked, added = owned[tp].parked, batch.parked_added.get(tp)
                if parked or added:
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
                        batch.parked_added.setdefault(tp, set()).add(kh)
                    batch.dead += 1
                    continue
            try:
                handler(conn, m)
            except Exception as e:
                if connection_lost(e):
                    raise
                raise HandlerFailedError(m, e) from e
            batch.applied += 1
            if source is not None:
                seen.add(source)
                batch.identities.append(Dedupe.row(source, m.topic, m.partition, m.offset))

    # ------------------------------------------------------------------ ending a transaction

    def commit(self) -> None:
        """Commit the open batch, fenced; on a moved fence drop the partition and retry the rest."""
        owned = self._partitions.owned
        while (batch := self.open) is not None:
            conn = batch.conn
            self._dedupe.remember(conn, batch.identities)
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
            batch.txn.commit()
            conn.close()
            self.open = None
            self._forced_dead.clear()
            for tp, pos in batch.positions.items():
                o = owned[tp]
                o.committed = pos
                o.parked.update(batch.parked_added.get(tp, ()))
            self._counters.add(
                commits=1,
                applied=batch.applied,
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
        try:
            batch.txn.rollback()
        except SQLAlchemyError as e:
            log.debug("rollback failed (the connection is gone; the database rolls back): %s", first_line(e))
        finally:
            with contextlib.suppress(SQLAlchemyError):
                batch.conn.close()

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
