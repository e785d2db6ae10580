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
:class:`~pyharvest.core.transactions.exactly_once.ExactlyOnce`: the main loop marks and hands
the records to its :class:`~pyharvest.core.transactions.window.TransactionWindow`; the
engine's delivery thread runs :meth:`TransactionalPublisher.serve`, which takes over,
publishes and purges, taking its jobs from the window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import cast

from pyharvest.core.config.choices import PoisonPolicy
from pyharvest.core.config.settings import Config
from pyharvest.core.delivery.failures import FailedAttempts, settle
from pyharvest.core.errors import HarvestError, KafkaAuthorizationError
from pyharvest.core.outbox.identity import RECORD_ID_HEADER, identity_stamp
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.database import DatabaseBinding, QuarantineBinding
from pyharvest.core.ports.kafka import (
    DeliveryError,
    KafkaClients,
    ProduceError,
    TopicError,
    TransactionalProducer,
    TransactionError,
)
from pyharvest.core.telemetry.events import Event
from pyharvest.core.telemetry.logs import log, one_line
from pyharvest.core.telemetry.metrics import HarvestMetrics
from pyharvest.core.telemetry.spans import BatchSpans
from pyharvest.core.transactions.progress import (
    TRANSACTION_CALL_SECONDS,
    decode_progress,
    encode_progress,
    transactional_clients,
    transactional_config,
)
from pyharvest.core.transactions.window import Job, TransactionWindow

__all__ = ["TransactionalPublisher"]

# The longest pause before a key held behind a poison record is tried again.
MAX_POISON_BACKOFF = 10.0


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
    ) -> None:
        self._config = config
        self._spans = spans
        self._kafka = transactional_clients(kafka)
        self._metrics = metrics
        self._shard = shard
        self._emit = emit
        self._deadline = deadline
        self._window = window
        limits = config.limits
        self._backoff: float = limits.io_error_backoff or 0.0
        self._producer_config = transactional_config(config, shard)
        self._stamp = identity_stamp(config.leader_group_id, config.outbox_table, config.identity_headers)
        self._producer: TransactionalProducer | None = None
        self._failures = FailedAttempts(config, metrics, emit)
        self._quarantine_binding: QuarantineBinding | None = None
        #: Consecutive aborts caused by a poison record: the retry's pause grows with it.
        self.poison_streak = 0

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
                job = window.next_job(done)
                if job is None:
                    return
                if job is Job.TAKE_OVER:
                    self._take_over(binding)
                elif job is Job.PURGE:
                    self._purge_committed(binding)
                else:
                    committed: list[int] | None = None
                    try:
                        committed = self._transact(binding, job)
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
            self._pause()
            return
        self._producer = producer
        self._window.fenced()
        ids = self._progress_ids(value)
        if ids and not self._purge(binding, ids, "the last committed transaction's records"):
            return  # not leading any more, or shutting down: the next takeover does it
        self._window.taken_over()
        log.info(
            "took over the transactions of shard %d in %.2fs (%d committed records purged)",
            self._shard,
            time.monotonic() - started,
            len(ids),
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
                self._abort(producer, batch, [], [], 0, "the previous transaction's rows could not be purged")
                return None
            left = producer.flush(TRANSACTION_CALL_SECONDS)
            if failures or progress_failed or left:
                self._abort(producer, batch, failures, progress_failed, left)
                return None
            self._commit(producer)
        except TransactionError as e:
            self._failed(e, len(batch))
            return None
        except ProduceError as e:  # the progress record itself was refused
            self._abort(producer, batch, failures, [e.error], 0)
            return None
        metrics = self._metrics
        metrics.transactions_committed += 1
        metrics.records_published += len(batch)
        metrics.observe(metrics.transaction_seconds, time.monotonic() - started)
        metrics.publish_latency.observe(batch)
        self._failures.settled(ids)
        self.poison_streak = 0
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
        stamp = self._stamp
        for rec in batch:
            headers = rec.headers
            if stamp is not None:
                headers = [*headers, stamp, (RECORD_ID_HEADER, str(rec.id))]

            def reported(err: DeliveryError | None, rec: OutboxRecord = rec) -> None:
                if err is not None:
                    failures.append((rec, err))

            try:
                producer.produce(rec.topic, rec.key, rec.value, headers, reported)
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
        first = failures[0] if failures else None
        log.warning(
            "aborted a transaction of %d records (%s); remarking them",
            len(batch),
            f"record {first[0].id} key {first[0].key!r}: {first[1]}"
            if first
            else f"progress record: {progress_failed[0]}"
            if progress_failed
            else why or f"{left} deliveries unanswered",
        )
        if failures:
            self._triage(failures)

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
        self._pause()

    def _triage(self, failures: list[tuple[OutboxRecord, DeliveryError]]) -> None:
        """Hold the keys of records Kafka refused for good out of the next transactions, or
        quarantine those past ``maxDeliveryAttempts``."""
        quarantine_on = self._config.poison_policy == PoisonPolicy.QUARANTINE and self._quarantine_binding is not None
        verdicts = self._failures.judge(failures, quarantine_on)
        if not verdicts.poison:
            return
        quarantined = {id(q.record) for q in verdicts.quarantine}
        self.poison_streak += 1
        backoff = min(MAX_POISON_BACKOFF, (self._backoff or 0.01) * 2 ** min(self.poison_streak - 1, 10))
        held = {rec.key for rec, err in failures if not err.retriable and id(rec) not in quarantined}
        self._window.hold(held, time.monotonic() + backoff)
        binding = self._quarantine_binding
        if verdicts.quarantine and binding is not None:
            stored = settle(
                "quarantine",
                binding.quarantine,
                verdicts.quarantine,
                metrics=self._metrics,
                pause=self._pause,
                may_retry=self._may_retry,
                giving_up="the key stays held and is tried again",
            )
            if stored is not None:
                self._failures.quarantined(verdicts.quarantine)

    def use_binding(self, binding: DatabaseBinding) -> None:
        self._quarantine_binding = binding if isinstance(binding, QuarantineBinding) else None

    def _purge(self, binding: DatabaseBinding, ids: list[int], what: str) -> bool:
        """Purge ``ids``, retrying while this process leads and is not past its shutdown
        deadline; return whether they went."""
        metrics = self._metrics
        started = time.monotonic()
        with self._spans.purge(len(ids)):
            purged = settle(
                f"purge of {what}",
                binding.purge,
                ids,
                metrics=metrics,
                pause=self._pause,
                may_retry=self._may_retry,
                giving_up="the next takeover purges them",
            )
        if purged is None:
            return False
        metrics.observe(metrics.purge_seconds, time.monotonic() - started)
        metrics.purge_statements += 1
        metrics.records_purged += purged
        return True

    def _may_retry(self) -> bool:
        deadline = self._deadline()
        if deadline is not None and time.monotonic() > deadline:
            return False
        return self._window.leading

    def _pause(self) -> None:
        self._window.pause(self._backoff)

    def _retire_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close()
            except Exception as e:  # noqa: BLE001 - it is being discarded anyway
                log.debug("closing a transactional producer: %s", one_line(e))
