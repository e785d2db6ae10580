"""Exactly-once publishing (``delivery: exactly-once``): each batch in one Kafka transaction.

At least once, a leader that dies after Kafka acknowledged a record but before it purged the
row leaves the row to its successor, which publishes it again. Here a batch of marked records
goes out in a Kafka transaction together with a **progress record** naming their outbox ids,
and Kafka makes the batch and its progress record visible together or not at all. Three rules
make every record visible to ``read_committed`` consumers exactly once:

1. **One transactional producer per shard**, ``transactional.id`` =
   ``pyharvest.<leaderGroupID>.<shard>``. A new leader's ``init_transactions`` fences every
   earlier producer of its shard: Kafka aborts (or completes) the transaction that producer
   left open and refuses its later produces and commits, however long it was paused.
2. **A leader commits a transaction only once the rows of its previous committed transaction
   are purged.** So at any moment only the shard's *last* committed transaction can have rows
   left in the table.
3. **A new leader takes over before it marks**: once its fence is up, it reads the shard's
   last committed progress record (``read_committed``, partition = shard of the compacted
   ``progressTopic``) and purges the ids it names.

A row is purged only after a commit that carried it (by its leader, or by the next leader on
reading the progress record), and marked again only when no committed transaction carried it;
docs/algorithm.md gives the argument in full. Order per key: a transaction holds the records
of a mark in id order, and transactions of a shard follow one another; a failed transaction
is aborted and its records remarked from the head of the table, as a failed delivery is.

The engine (:mod:`pyharvest.core.engine.harvest`) delivers through
:class:`~pyharvest.core.publishing.exactly_once.ExactlyOnce`: the main loop marks and hands
the records to its :class:`~pyharvest.core.publishing.transaction_window.TransactionWindow`;
the engine's delivery thread runs :meth:`TransactionalPublisher.serve`, which takes over,
publishes and purges, taking its jobs from the window, and settles through the
:class:`~pyharvest.core.publishing.settlement.Settlement` both modes share.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import cast

from pyharvest.core.config.settings import Config
from pyharvest.core.errors import HarvestError, KafkaAuthorizationError
from pyharvest.core.outbox.identity import IdentityStamp
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.database import DatabaseBinding
from pyharvest.core.ports.kafka import (
    DeliveryError,
    KafkaClients,
    ProduceError,
    TopicError,
    TransactionalProducer,
    TransactionError,
)
from pyharvest.core.publishing.blocked_keys import BlockedKeys
from pyharvest.core.publishing.failures import name_failures
from pyharvest.core.publishing.progress import (
    TRANSACTION_CALL_SECONDS,
    decode_progress,
    encode_progress,
    transactional_clients,
    transactional_config,
)
from pyharvest.core.publishing.settlement import Settlement
from pyharvest.core.publishing.transaction_window import Publish, Purge, TakeOver, TransactionWindow
from pyharvest.core.telemetry.events import Event
from pyharvest.core.telemetry.logs import log, one_line
from pyharvest.core.telemetry.metrics import HarvestMetrics
from pyharvest.core.telemetry.spans import BatchSpans

__all__ = ["TransactionalPublisher"]


class TransactionalPublisher:
    """Publishes a shard's marked records in Kafka transactions, taking its jobs from
    ``window`` (which the main loop fills); everything here happens on the thread that runs
    :meth:`serve`."""

    def __init__(
        self,
        window: TransactionWindow,
        config: Config,
        kafka: KafkaClients,
        metrics: HarvestMetrics,
        *,
        shard: int,
        emit: Callable[[Event], None],
        deadline: Callable[[], float | None],
        spans: BatchSpans,
        blocked: BlockedKeys | None = None,
    ) -> None:
        self._config = config
        self._spans = spans
        self._kafka = transactional_clients(kafka)
        self._metrics = metrics
        self._shard = shard
        self._deadline = deadline
        self._window = window
        limits = config.limits
        self._backoff: float = limits.io_error_backoff or 0.0
        self._producer_config = transactional_config(config, shard)
        self._stamp = IdentityStamp(config.leader_group_id, config.outbox_table, config.identity_headers)
        self._producer: TransactionalProducer | None = None
        # Its statements are retried while this publisher leads and is not past the shutdown
        # deadline (it is its own Patience).
        self._settlement = Settlement(config, metrics, spans, emit, self, blocked=blocked)

    def abandon(self) -> None:
        """Fenced by leader election: the running transaction fails (its messages are
        purged) and is aborted. Kafka's fence would refuse its commit anyway, once a
        successor has initialised; this stops it sooner."""
        producer = self._producer
        if producer is not None:
            producer.abandon()

    # ------------------------------------------------------------------ the thread's side

    def serve(self, binding: DatabaseBinding, done: threading.Event) -> None:
        """Run takeovers and transactions until ``done`` is set and nothing is queued."""
        window = self._window
        try:
            while True:
                match window.next_job(done):
                    case None:
                        return
                    case TakeOver():
                        self._take_over(binding)
                    case Purge():
                        self._purge_committed(binding)
                    case Publish(batch):
                        committed: list[int] | None = None
                        try:
                            committed = self._transact(binding, batch)
                        finally:
                            window.ended(committed)
        finally:
            self._retire_producer()

    def _take_over(self, binding: DatabaseBinding) -> None:
        """Rule 3: fence every earlier producer of the shard, then purge what the last
        committed transaction carried. Retried while leading; marking waits for it."""
        self._retire_producer()
        kafka, cfg = self._kafka, self._config
        producer = kafka.transactional_producer(self._producer_config)
        started = time.monotonic()
        try:
            producer.init_transactions(TRANSACTION_CALL_SECONDS)
            value = kafka.last_committed(
                cfg.base_kafka_config, cfg.progress_topic, self._shard, TRANSACTION_CALL_SECONDS
            )
        except KafkaAuthorizationError:
            producer.close()  # an ACL missing: no retry will get through
            raise
        except (TransactionError, TopicError) as e:
            producer.close()
            log.warning("taking over the shard's transactions failed, retrying: %s", one_line(e))
            self.pause()
            return
        self._producer = producer
        self._window.fenced()
        ids = self._progress_ids(value)
        purged = 0
        if ids:
            found = self._settlement.purge(
                binding, ids, "the last committed transaction's records", "the next takeover purges them"
            )
            if found is None:
                return  # not leading any more, or shutting down: the next takeover does it
            purged = found
        self._window.taken_over()
        # The rows purged, not the ids the progress record names: its leader had purged most of
        # them already, unless it died between the commit and the purge.
        log.info(
            "took over the transactions of shard %d in %.2fs (the last committed transaction named %d records; "
            "%d were still in the outbox and are purged)",
            self._shard,
            time.monotonic() - started,
            len(ids),
            purged,
        )

    def _progress_ids(self, value: bytes | None) -> list[int]:
        if value is None:
            return []
        try:
            return decode_progress(value)
        except ValueError as e:
            raise HarvestError(
                f"the progress topic {self._config.progress_topic!r} holds a record this version cannot read ({e}); "
                "is another program writing to it?"
            ) from None

    def _transact(self, binding: DatabaseBinding, batch: list[OutboxRecord]) -> list[int] | None:
        """Publish ``batch`` and its progress record in one transaction; purge the previous
        transaction's rows while the records are on their way, and before the commit (rule 2).
        Returns the ids committed, or None."""
        with self._spans.publish(batch):  # one span from the transaction's begin to its commit
            return self._transact_batch(binding, batch)

    def _transact_batch(self, binding: DatabaseBinding, batch: list[OutboxRecord]) -> list[int] | None:
        producer = self._producer
        assert producer is not None
        failures: list[tuple[OutboxRecord, DeliveryError]] = []
        progress_failed: list[DeliveryError] = []
        started = time.monotonic()
        ids = cast("list[int]", [r.id for r in batch])
        leader_id = batch[0].leader_id or ""
        try:
            producer.begin_transaction()
            self._produce(producer, batch, failures)
            producer.produce(
                self._config.progress_topic,
                str(self._shard),
                encode_progress(leader_id, ids),
                [],
                lambda err: progress_failed.append(err) if err is not None else None,
                self._shard,
            )
            if self._window.unpurged and not self._purge_committed(binding):
                self._abort(binding, producer, batch, [], [], 0, "the previous transaction's rows could not be purged")
                return None
            left = producer.flush(TRANSACTION_CALL_SECONDS)
            if failures or progress_failed or left:
                self._abort(binding, producer, batch, failures, progress_failed, left)
                return None
            self._commit(producer)
        except TransactionError as e:
            self._failed(e, len(batch))
            return None
        except ProduceError as e:  # the progress record itself was refused
            self._abort(binding, producer, batch, failures, [e.error], 0)
            return None
        metrics = self._metrics
        metrics.transactions_committed += 1
        metrics.records_published += len(batch)
        metrics.observe(metrics.transaction_seconds, time.monotonic() - started)
        metrics.publish_latency.observe(batch)
        self._settlement.delivered(ids)
        self._settlement.clean()
        return ids

    def _purge_committed(self, binding: DatabaseBinding) -> bool:
        """Purge the last committed transaction's rows; if that cannot be done now (not
        leading any more, or shutting down), no further commit until a takeover has purged
        them (rule 2), whichever process makes it."""
        purged = self._purge(binding, self._window.unpurged, "committed records")
        self._window.purged(purged)
        return purged

    def _produce(
        self,
        producer: TransactionalProducer,
        batch: list[OutboxRecord],
        failures: list[tuple[OutboxRecord, DeliveryError]],
    ) -> None:
        headers = self._stamp.headers
        for rec in batch:

            def reported(err: DeliveryError | None, rec: OutboxRecord = rec) -> None:
                if err is not None:
                    failures.append((rec, err))

            try:
                producer.produce(rec.topic, rec.key, rec.value, headers(rec), reported)
            except ProduceError as e:
                failures.append((rec, e.error))
                return  # the transaction aborts: producing the rest would be wasted

    def _commit(self, producer: TransactionalProducer) -> None:
        deadline = time.monotonic() + TRANSACTION_CALL_SECONDS
        while True:
            try:
                producer.commit_transaction(TRANSACTION_CALL_SECONDS)
                return
            except TransactionError as e:
                if e.kind != "retriable" or time.monotonic() > deadline:
                    raise
                log.warning("committing a transaction: %s; retrying", one_line(e))

    def _abort(
        self,
        binding: DatabaseBinding,
        producer: TransactionalProducer,
        batch: list[OutboxRecord],
        failures: list[tuple[OutboxRecord, DeliveryError]],
        progress_failed: list[DeliveryError],
        left: int,
        why: str = "",
    ) -> None:
        self._metrics.transactions_aborted += 1
        self._window.raise_remark()  # before anything else: nothing of this batch may be published under this id
        try:
            producer.abort_transaction(TRANSACTION_CALL_SECONDS)
        except TransactionError as e:
            self._failed(e, len(batch))
        log.warning(
            "aborted a transaction of %d records (%s); remarking them",
            len(batch),
            name_failures(failures)
            if failures
            else f"progress record: {progress_failed[0]}"
            if progress_failed
            else why or f"{left} deliveries unanswered",
        )
        if failures:
            self._triage(binding, failures)

    def _failed(self, e: TransactionError, size: int) -> None:
        """The producer's state is in doubt (fenced, fatal, a commit of unknown outcome):
        give it up; the next takeover learns from the progress record what committed."""
        if e.kind == "fenced":
            self._metrics.producer_fencings += 1
            log.warning("a newer leader of shard %d fenced this producer: %s", self._shard, one_line(e))
        else:
            log.warning("a transaction of %d records failed: %s; taking over afresh", size, one_line(e))
        self._metrics.transactions_aborted += 1
        self._window.in_doubt()
        self._retire_producer()
        self.pause()

    def _triage(self, binding: DatabaseBinding, failures: list[tuple[OutboxRecord, DeliveryError]]) -> None:
        """Park the keys of records Kafka refused for good out of the next transactions, or
        quarantine those past ``maxDeliveryAttempts``."""
        settlement = self._settlement
        verdicts = settlement.judge(binding, failures)
        if not verdicts.poison:
            return
        quarantined = {id(q.record) for q in verdicts.quarantine}
        parked = {rec.key for rec, err in failures if not err.retriable and id(rec) not in quarantined}
        self._window.park(parked, time.monotonic() + settlement.poison_backoff())
        if verdicts.quarantine:
            settlement.quarantine(binding, verdicts.quarantine, "the key stays parked and is tried again")

    def _purge(self, binding: DatabaseBinding, ids: list[int], what: str) -> bool:
        """Purge ``ids``, retrying while this process leads and is not past its shutdown
        deadline; return whether they went."""
        return self._settlement.purge(binding, ids, what, "the next takeover purges them") is not None

    # ------------------------------------------------------------------ its Patience

    def may_retry(self) -> bool:
        deadline = self._deadline()
        if deadline is not None and time.monotonic() > deadline:
            return False
        return self._window.leading

    def pause(self) -> None:
        self._window.pause(self._backoff)

    def _retire_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close()
            except Exception as e:  # noqa: BLE001 - it is being discarded anyway
                log.debug("closing a transactional producer: %s", one_line(e))
