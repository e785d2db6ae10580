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

The engine (:mod:`pyharvest.core.harvest`) uses a :class:`TransactionalPublisher` where it
would use a :class:`~pyharvest.core.dispatch.Dispatcher`: the main loop marks and hands the
records over; the engine's delivery thread runs :meth:`TransactionalPublisher.serve`, which
takes over, publishes and purges.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import cast

from pyharvest.core.binding import DatabaseBinding, QuarantineBinding, QuarantineEntry
from pyharvest.core.config import Config
from pyharvest.core.errors import ConfigError, HarvestError
from pyharvest.core.events import DeliveryFailed, Event, RecordQuarantined
from pyharvest.core.identity import OUTBOX_HEADER, RECORD_ID_HEADER, outbox_identity
from pyharvest.core.kafka import (
    DeliveryError,
    KafkaClients,
    ProduceError,
    TopicError,
    TransactionalKafkaClients,
    TransactionalProducer,
    TransactionError,
)
from pyharvest.core.logs import log, one_line
from pyharvest.core.metrics import HarvestMetrics
from pyharvest.core.poison_hints import poison_hint, quarantine_hint
from pyharvest.core.records import OutboxRecord
from pyharvest.core.sender import producer_config

__all__ = [
    "TransactionalPublisher",
    "check_transactions",
    "decode_progress",
    "encode_progress",
    "transactional_config",
    "transactional_id",
]

PROGRESS_FORMAT = 1

# librdkafka's default. A leader that dies inside a transaction leaves it open until its
# successor's fence aborts it (within the group's session) or this passes; meanwhile
# read_committed consumers of the partitions it wrote to wait.
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000

# How long a commit, an abort or a fence may take before the producer is given up on.
TRANSACTION_CALL_SECONDS = 30.0

# The longest pause before a key held behind a poison record is tried again.
MAX_POISON_BACKOFF = 10.0


def transactional_id(leader_group_id: str, shard: int) -> str:
    """The ``transactional.id`` of a shard's producers: the same for every leader the shard
    ever has, so that each new one fences the last."""
    return f"pyharvest.{leader_group_id}.{shard}"


def transactional_config(config: Config, shard: int) -> dict[str, object]:
    cfg = producer_config(config)
    cfg["transactional.id"] = transactional_id(config.leader_group_id, shard)
    cfg.setdefault("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
    return cfg


def encode_progress(leader_id: str, ids: Sequence[int]) -> bytes:
    """A progress record: the outbox ids a transaction carries, as runs of consecutive ids
    (a mark takes the oldest rows, so a batch of thousands is usually one run)."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] + 1 == i:
            runs[-1][1] = i
        elif not runs or runs[-1][1] != i:
            runs.append([i, i])
    return json.dumps({"v": PROGRESS_FORMAT, "leader": leader_id, "ids": runs}, separators=(",", ":")).encode()


def decode_progress(value: bytes) -> list[int]:
    """The outbox ids a progress record names; raises :class:`ValueError` on a record this
    version cannot read (a newer format, or not a progress record at all)."""
    data = json.loads(value)
    if not isinstance(data, dict) or data.get("v") != PROGRESS_FORMAT or not isinstance(data.get("ids"), list):
        raise ValueError(f"not a progress record of format {PROGRESS_FORMAT}: {value[:80]!r}")
    ids: list[int] = []
    for run in data["ids"]:
        first, last = int(run[0]), int(run[1])
        ids.extend(range(first, last + 1))
    return ids


def check_transactions(kafka: KafkaClients, config: Config) -> None:
    """Refuse to start exactly-once publishing where it cannot work: clients without
    transactions, a cluster without them, or a progress topic too small for the shards."""
    if not isinstance(kafka, TransactionalKafkaClients):
        raise ConfigError(
            "delivery", f"exactly-once needs Kafka clients with transactions; {type(kafka).__name__} has none"
        )
    servers = config.base_kafka_config.get("bootstrap.servers")
    try:
        kafka.ensure_progress_topic(config.base_kafka_config, config.progress_topic, config.shards + 1)
    except TopicError as e:
        raise HarvestError(f"delivery: exactly-once: {e}") from None
    # An id of its own, never a shard's: initialising it fences no leader; and never another
    # process's, whose probe it would fence when both start at once (Kafka forgets an idle id
    # after transactional.id.expiration.ms, 7 days). Its partition is one past the shards': a
    # leader's open transaction there would hold the probe's read_committed read back.
    probe_id = f"pyharvest.{config.leader_group_id}.probe.{uuid.uuid4().hex[:12]}"
    probe_config = {**producer_config(config), "transactional.id": probe_id}
    try:
        kafka.probe_transactions(probe_config, config.progress_topic, config.shards, TRANSACTION_CALL_SECONDS)
    except TransactionError as e:
        raise HarvestError(
            f"delivery: exactly-once needs a Kafka cluster with transactions, and the one at "
            f"bootstrap.servers={servers!r} did not initialise a transactional producer ({e}). "
            "Use Apache Kafka (or another broker with transactions), or delivery: at-least-once; "
            "the embedded development broker has no transactions"
        ) from None


class TransactionalPublisher:
    """Publishes a shard's marked records in Kafka transactions.

    The main loop calls it as it would a :class:`~pyharvest.core.dispatch.Dispatcher`
    (``lead``, ``dispatch``, ``quiesce``, ...); :meth:`begin_term` at each election schedules
    the takeover, and :attr:`ready` says when marking may start. Everything else happens on
    the thread that runs :meth:`serve`.
    """

    def __init__(
        self,
        config: Config,
        kafka: KafkaClients,
        metrics: HarvestMetrics,
        *,
        shard: int,
        emit: Callable[[Event], None],
        deadline: Callable[[], float | None],
    ) -> None:
        if not isinstance(kafka, TransactionalKafkaClients):
            raise ConfigError(
                "delivery", f"exactly-once needs Kafka clients with transactions; {type(kafka).__name__} has none"
            )
        self._config = config
        self._kafka: TransactionalKafkaClients = kafka
        self._metrics = metrics
        self._shard = shard
        self._emit = emit
        self._deadline = deadline
        limits = config.limits
        self._limit: int = limits.max_in_flight_records  # type: ignore[assignment]
        self._backoff: float = limits.io_error_backoff or 0.0
        self._producer_config = transactional_config(config, shard)
        self._stamp: tuple[str, str] | None = (
            (OUTBOX_HEADER, outbox_identity(config.leader_group_id, config.outbox_table))
            if config.identity_headers
            else None
        )
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
        self._producer: TransactionalProducer | None = None
        # Keys held behind a poison record (poisonPolicy: block, or before quarantine): their
        # records stay marked and out of transactions until the retry.
        self._held: set[str] = set()
        self._retry_held_at = 0.0
        self._attempts: dict[int, int] = {}
        #: Consecutive aborts caused by a poison record: the retry's pause grows with it.
        self.poison_streak = 0

    # ------------------------------------------------------------------ the main loop's side

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
        try:
            while True:
                job = self._next_job(done)
                if job is None:
                    return
                if job == "takeover":
                    self._take_over(binding)
                    continue
                if job == "purge":
                    self._purge_committed(binding)
                    continue
                assert not isinstance(job, str)
                try:
                    self._transact(binding, job)
                finally:
                    with self._cond:
                        self._running = 0
                        self._cond.notify_all()
        finally:
            self._retire_producer()

    def _next_job(self, done: threading.Event) -> str | list[OutboxRecord] | None:
        with self._cond:
            while True:
                if self._leading and self._takeover:
                    return "takeover"
                if self._unpurged and not (self._leading and self.ready and not self.force_remark and self._queue):
                    return "purge"  # nothing to overlap it with
                if self._leading and self.ready and not self.force_remark and self._queue:
                    batch = self._queue
                    self._queue = []
                    if self._held:
                        batch = [r for r in batch if r.key not in self._held]
                        if not batch:
                            continue
                    self._running = len(batch)
                    return batch
                if done.is_set():
                    return None
                timeout = 0.1
                if self._held and self._leading:
                    due = self._retry_held_at - time.monotonic()
                    if due <= 0:
                        log.info("retrying the keys held behind a poison record: %s", ", ".join(sorted(self._held)[:5]))
                        self.force_remark = True
                        self._held.clear()
                        continue
                    timeout = min(timeout, due)
                self._cond.wait(timeout)

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
        except (TransactionError, TopicError) as e:
            producer.close()
            log.warning("taking over the shard's transactions failed, retrying: %s", one_line(e))
            self._pause()
            return
        self._producer = producer
        self._unpurged = []  # if still there, they are the last committed transaction's: purged below
        ids = self._progress_ids(value)
        if ids and not self._purge(binding, ids, "the last committed transaction's records"):
            return  # not leading any more, or shutting down: the next takeover does it
        with self._cond:
            self._takeover = False
            self.ready = True
            self._cond.notify_all()
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

    def _transact(self, binding: DatabaseBinding, batch: list[OutboxRecord]) -> None:
        """Publish ``batch`` and its progress record in one transaction; purge the previous
        transaction's rows while the records are on their way, and before the commit (rule 2)."""
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
            if self._unpurged and not self._purge_committed(binding):
                self._abort(producer, batch, [], [], 0, "the previous transaction's rows could not be purged")
                return
            left = producer.flush(TRANSACTION_CALL_SECONDS)
            if failures or progress_failed or left:
                self._abort(producer, batch, failures, progress_failed, left)
                return
            self._commit(producer)
        except TransactionError as e:
            self._failed(e, len(batch))
            return
        except ProduceError as e:  # the progress record itself was refused
            self._abort(producer, batch, failures, [e.error], 0)
            return
        metrics = self._metrics
        metrics.transactions_committed += 1
        metrics.records_published += len(batch)
        metrics.observe(metrics.transaction_seconds, time.monotonic() - started)
        if self._attempts:
            for i in ids:
                self._attempts.pop(i, None)
        self.poison_streak = 0
        with self._cond:
            self._unpurged = ids

    def _purge_committed(self, binding: DatabaseBinding) -> bool:
        """Purge the last committed transaction's rows; if that cannot be done now (not
        leading any more, or shutting down), no further commit until a takeover has purged
        them (rule 2), whichever process makes it."""
        purged = self._purge(binding, self._unpurged, "committed records")
        with self._cond:
            self._unpurged = []
            if not purged:
                self._takeover = True
                self.ready = False
            self._cond.notify_all()
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
        self.raise_remark()  # before anything else: nothing of this batch may be published under this id
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
        with self._cond:
            self._takeover = True
            self.ready = False
            self.force_remark = True
            self._queue.clear()
            self._cond.notify_all()
        self._retire_producer()
        self._pause()

    def _triage(self, failures: list[tuple[OutboxRecord, DeliveryError]]) -> None:
        """Count the attempts of records Kafka refused for good: hold their keys out of the
        next transactions, or quarantine them past ``maxDeliveryAttempts``."""
        config, metrics = self._config, self._metrics
        quarantine_on = config.poison_policy == "quarantine"
        max_attempts = config.limits.max_delivery_attempts or 1
        poison = False
        to_quarantine: list[QuarantineEntry] = []
        for rec, err in failures:
            metrics.delivery_errors[err.code] = metrics.delivery_errors.get(err.code, 0) + 1
            attempts = self._attempts.get(cast(int, rec.id), 0) + 1
            self._attempts[cast(int, rec.id)] = attempts
            hint = "" if err.retriable else poison_hint(err.code, rec.topic, config.poison_policy)
            self._emit(DeliveryFailed(rec.id, rec.key, rec.topic, str(err), err.retriable, attempts, hint))
            if err.retriable:
                continue
            poison = True
            if quarantine_on and attempts >= max_attempts:
                to_quarantine.append(QuarantineEntry(rec, str(err), attempts))
            else:
                with self._cond:
                    self._held.add(rec.key)
        if not poison:
            return
        self.poison_streak += 1
        backoff = min(MAX_POISON_BACKOFF, (self._backoff or 0.01) * 2 ** min(self.poison_streak - 1, 10))
        self._retry_held_at = time.monotonic() + backoff
        if to_quarantine:
            self._quarantine(to_quarantine)

    def _quarantine(self, entries: list[QuarantineEntry]) -> None:
        binding = self._quarantine_binding
        if binding is None:
            return
        while True:
            try:
                binding.quarantine(entries)
                break
            except Exception as e:  # noqa: BLE001 - retried; the key stays held meanwhile
                self._metrics.db_errors += 1
                log.warning("quarantine of %d records failed, retrying: %s", len(entries), one_line(e))
                if not self._may_retry():
                    return
                self._pause()
        self._metrics.records_quarantined += len(entries)
        for q in entries:
            self._attempts.pop(cast(int, q.record.id), None)
            hint = quarantine_hint(q.error.split(":", 1)[0], q.record.topic)
            log.error(
                "quarantined key %r after %d failed attempts of record %s (topic %r): %s. %s",
                q.record.key,
                q.attempts,
                q.record.id,
                q.record.topic,
                q.error,
                hint[:1].upper() + hint[1:],
            )
            self._emit(RecordQuarantined(q.record.id, q.record.key, q.record.topic, q.error, q.attempts, hint))

    _quarantine_binding: QuarantineBinding | None = None

    def use_binding(self, binding: DatabaseBinding) -> None:
        self._quarantine_binding = binding if isinstance(binding, QuarantineBinding) else None

    def _purge(self, binding: DatabaseBinding, ids: list[int], what: str) -> bool:
        """Purge ``ids``, retrying while this process leads and is not past its shutdown
        deadline; return whether they went."""
        metrics = self._metrics
        started = time.monotonic()
        attempt = 0
        purged = 0
        while True:
            try:
                purged = binding.purge(ids)
                break
            except Exception as e:  # noqa: BLE001
                attempt += 1
                metrics.db_errors += 1
                if attempt == 1 or attempt % 20 == 0:
                    log.warning(
                        "purge of %d %s failed (attempt %d), retrying: %s", len(ids), what, attempt, one_line(e)
                    )
                if not self._may_retry():
                    log.warning("leaving the purge of %d %s to the next takeover", len(ids), what)
                    return False
                self._pause()
        metrics.observe(metrics.purge_seconds, time.monotonic() - started)
        metrics.purge_statements += 1
        metrics.records_purged += purged
        return True

    def _may_retry(self) -> bool:
        deadline = self._deadline()
        if deadline is not None and time.monotonic() > deadline:
            return False
        return self._leading

    def _pause(self) -> None:
        with self._cond:
            self._cond.wait(self._backoff)

    def _retire_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close()
            except Exception as e:  # noqa: BLE001 - it is being discarded anyway
                log.debug("closing a transactional producer: %s", one_line(e))
