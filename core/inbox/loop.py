"""The worker thread's loop: poll Kafka, apply to the open batch, commit when it is due;
and the inbox's side of consumer-group rebalances.

Guarantee: messages flow only from partitions whose fence this consumer claimed, and a
revoked partition's open work is committed (under the fence, which is still ours) before
the partition is handed over; a lost one's is rolled back. A batch commits once it holds
``maxBatchSize`` messages or has been open ``maxBatchDuration``, so no message waits in an
open transaction longer than that plus one poll.

The data path: :meth:`InboxConsumer.poll` → :meth:`Batches.apply` (dedupe, parking, the
handler) → :meth:`Batches.commit` (identities, fenced checkpoints, commit) →
:meth:`InboxConsumer.commit` (Kafka's offsets, for monitoring).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from pyharvest.core.inbox.batch import Batches
from pyharvest.core.inbox.partitions import Partitions
from pyharvest.core.inbox.ports import InboxPorts, TopicPartition
from pyharvest.core.inbox.recovery import Recovery
from pyharvest.core.inbox.replay import Replayer

__all__ = ["ConsumeLoop"]

log = logging.getLogger("pyharvest.inbox")


class ConsumeLoop:
    """One :meth:`step` per poll; a :class:`~pyharvest.core.inbox.ports.RebalanceListener`."""

    def __init__(
        self,
        ports: InboxPorts,
        *,
        partitions: Partitions,
        batches: Batches,
        recovery: Recovery,
        replayer: Replayer,
        max_batch: int,
        max_duration: float,
        poll: float,
    ) -> None:
        self._consumer = ports.consumer
        self._db = ports.database
        self._partitions = partitions
        self._batches = batches
        self._recovery = recovery
        self._replayer = replayer
        self._max_batch = max_batch
        self._max_duration = max_duration
        self._poll = poll

    def step(self) -> None:
        batches = self._batches
        try:
            batches.apply_redo()
            batch = batches.open
            if batch is None:
                # Only between transactions: a replay's transaction runs on this thread too, and
                # would wait forever for locks an open batch holds (SQLite's writer lock, rows
                # its handler wrote).
                self._replayer.maybe_replay()
                want, timeout = self._max_batch, self._poll
            else:
                want = max(1, self._max_batch - len(batch.messages))
                timeout = max(0.0, batch.started + self._max_duration - time.monotonic())
            fresh = self._consumer.poll(want, timeout)
            if fresh:
                batches.apply(fresh)
            batch = batches.open
            if batch is not None and (
                len(batch.messages) >= self._max_batch or time.monotonic() - batch.started >= self._max_duration
            ):
                batches.commit()
        except self._db.failures as e:
            self._recovery.after_database_error(e)

    def finish(self) -> None:
        """On a graceful stop."""
        self._recovery.on_stop()

    def abandon(self) -> None:
        """After an error that stops the inbox (already reported)."""
        self._recovery.on_fatal_error()

    # ------------------------------------------------------------------ rebalances

    def assigned(self, partitions: list[TopicPartition]) -> Mapping[TopicPartition, int | None]:
        return self._partitions.claim(partitions)

    def revoked(self, partitions: list[TopicPartition]) -> None:
        try:
            self._recovery.before_revocation()
            self._partitions.release(partitions)
            self._batches.forget_unowned()
            if partitions:
                log.info("revoked %s", ", ".join(f"{t}[{p}]" for t, p in partitions))
        except BaseException:
            self._batches.rollback()
            raise

    def lost(self, partitions: list[TopicPartition]) -> None:
        self._recovery.after_loss()
        self._partitions.release(partitions)
        log.warning(
            "lost %s (session expired); uncommitted work rolled back",
            ", ".join(f"{t}[{p}]" for t, p in partitions),
        )
