"""Recovery: what becomes of uncommitted work when the database fails, a partition is
revoked or lost, or the inbox stops.

Guarantee: uncommitted work is either committed under a fence this consumer still holds, or
rolled back and left to whoever owns the partition next, who resumes at its committed
checkpoint; it is never committed on a guess. After a database error the outcome of the
last commit may be unknown, so the checkpoints are read again once the database answers
and only messages past them are applied again; a partition whose fence moved meanwhile is
dropped. A handler error that is really the connection going away is such a database
error: retried, never dead-lettered or allowed to stop the inbox.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from pyharvest.core.inbox.batch import Batches
from pyharvest.core.inbox.errors import first_line
from pyharvest.core.inbox.partitions import Partitions
from pyharvest.core.inbox.ports import InboxPorts, TopicPartition
from pyharvest.core.inbox.stats import Counters

__all__ = ["Recovery"]

log = logging.getLogger("pyharvest.inbox")


class Recovery:
    def __init__(
        self,
        ports: InboxPorts,
        *,
        partitions: Partitions,
        batches: Batches,
        counters: Counters,
        stop: threading.Event,
        backoff: float,
    ) -> None:
        self._db = ports.database
        self._checkpoints = ports.checkpoints
        self._partitions = partitions
        self._batches = batches
        self._counters = counters
        self._stop = stop
        self._backoff = backoff

    def after_database_error(self, error: BaseException) -> None:
        """Roll back, wait for the database, re-read the checkpoints and queue what lies past
        them to be applied again."""
        batches = self._batches
        everything = batches.held()
        batches.discard()
        batches.forget_failures()  # a handler that failed because of the outage gets another go
        self._counters.add(database_errors=1)
        log.warning("database error, retrying in %.1fs: %s: %s", self._backoff, type(error).__name__, first_line(error))
        owned = self._partitions.owned
        lost: list[TopicPartition] = []
        while not self._stop.wait(self._backoff):
            lost = []
            try:
                with self._db.connect() as conn:
                    for tp, mine in owned.items():
                        claim = self._checkpoints.read(conn, tp)
                        if claim is None or claim.fence != mine.fence:
                            lost.append(tp)
                        else:
                            # The commit whose outcome was lost may in fact have happened.
                            mine.committed = claim.next_offset
                break
            except self._db.failures as e:
                log.warning("database still failing: %s", first_line(e))
        else:
            return  # stopping: nothing was committed, the next owner re-applies
        if lost:
            batches.drop(lost, "its fence moved while the database was failing")
        keep = []
        for m in everything:
            partition = owned.get((m.topic, m.partition))
            if partition is not None and (partition.committed is None or m.offset >= partition.committed):
                keep.append(m)
        batches.redo = keep

    def before_revocation(self) -> None:
        """The fence is still ours: finish the open work rather than make the next owner redo it."""
        batches = self._batches
        if batches.open is None and not batches.redo:
            return
        try:
            batches.finish()
        except self._db.failures as e:
            log.warning("commit on revocation failed, the next owner re-applies: %s", first_line(e))
            batches.discard()

    def after_loss(self) -> None:
        """The group moved on without us: our fences are (or soon will be) stale; commit nothing."""
        self._batches.discard()

    def on_stop(self) -> None:
        """On a graceful stop: commit what is open; if the database fails now, the messages
        are simply redelivered to the next owner."""
        try:
            self._batches.finish()
        except self._db.failures as e:
            log.warning("final commit failed, the next owner re-applies: %s", first_line(e))
            self._batches.rollback()

    def on_fatal_error(self) -> None:
        self._batches.redo = []
        with contextlib.suppress(Exception):  # shutting down after an error already reported
            self._batches.rollback()
