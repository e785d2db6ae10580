"""The MP/R engine: mark, publish, purge on ack, reset on failure.

Two threads share the work, as in goharvest's minimal algorithm:

* the **main loop** pulses leader election, marks batches of the oldest rows and dispatches
  them to the producer;
* the **delivery thread** serves the producer's delivery reports, purges acknowledged rows
  and resets failed ones in batches, then lowers the per-key barriers.

Where goharvest blocks the sender on a key whose previous record is still in flight, this
engine *parks* the record behind that key and lets the delivery thread send it the moment the
key's barrier drops, so one busy key never holds up the others. Parked records count against
``maxInFlightRecords``, which keeps memory bounded by the limit whatever the backlog.

Invariants (they are what per-key order rests on):

1. at most one record per key is in flight;
2. a key's barrier drops only after its record was purged (or reset) in the database, so a
   successor is never published while its predecessor could still be republished;
3. ``force_remark`` is raised *before* a failed record is reset, so nothing marked behind it
   is dispatched once its barrier drops; a remark waits until nothing is in flight.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Self, cast

from pyharvest.core.binding import DatabaseBinding, QuarantineBinding, QuarantineEntry
from pyharvest.core.config import Config, mask_data_source, mask_kafka_config
from pyharvest.core.errors import HarvestError
from pyharvest.core.events import (
    DeliveryFailed,
    Event,
    EventHandler,
    LeaderAcquired,
    LeaderFenced,
    LeaderRefreshed,
    LeaderRevoked,
    MeterRead,
    RecordQuarantined,
)
from pyharvest.core.identity import OUTBOX_HEADER, RECORD_ID_HEADER, outbox_identity
from pyharvest.core.kafka import DeliveryError, KafkaClients, ProduceError, Producer
from pyharvest.core.metrics import HarvestMetrics, Meter
from pyharvest.core.neli import LeaderStatus, Neli
from pyharvest.core.records import OutboxRecord

__all__ = ["OUTBOX_HEADER", "RECORD_ID_HEADER", "HarvestEngine", "Health", "State"]

log = logging.getLogger("pyharvest.harvest")

# How long the delivery thread may hold acknowledgements to purge them in one statement.
COALESCE_SECONDS = 0.005

# A delivery.timeout.ms of 5 minutes (librdkafka's default) would stall a remark for that long
# when the broker is unreachable; a leader must learn the fate of its in-flight records sooner.
DEFAULT_DELIVERY_TIMEOUT_MS = 10_000

# A key's next record waits for the previous one's ack and purge, so a hot key's rate is one
# record per linger + round trip + purge. librdkafka's 5 ms default halved the rate of hot
# keys; 1 ms costs a drain nothing measurable (broker batches stay full under a backlog).
DEFAULT_LINGER_MS = 1


class State(Enum):
    CREATED = "created"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class Health:
    running: bool
    leader: bool
    broker_connected: bool | None
    database_connected: bool | None

    @property
    def ready(self) -> bool:
        return self.running and self.broker_connected is not False and self.database_connected is not False


class _Flight:
    """One dispatched record; called once with its delivery outcome."""

    __slots__ = ("_sink", "error", "record")

    def __init__(self, record: OutboxRecord, sink: Callable[[_Flight], None]) -> None:
        self.record = record
        self.error: DeliveryError | None = None
        self._sink = sink

    def __call__(self, error: DeliveryError | None) -> None:
        self.error = error
        self._sink(self)


class HarvestEngine:
    """Harvests an outbox table into Kafka through the bindings it is given. Start it, and
    stop it when done::

        with HarvestEngine(config, binding=binding, kafka=clients) as harvest:
            ...

    Most users build :class:`pyharvest.Harvest` instead, which supplies the SQL binding and
    the confluent-kafka clients from the config.
    """

    def __init__(
        self,
        config: Config,
        *,
        binding: DatabaseBinding | Callable[[], DatabaseBinding],
        kafka: KafkaClients,
    ) -> None:
        self.config = config.resolve()
        self._binding_source = binding
        self._binding: DatabaseBinding | None = None
        self._kafka = kafka
        limits = self.config.limits
        max_in_flight, mark_size = limits.max_in_flight_records, limits.mark_query_records
        assert max_in_flight is not None and mark_size is not None  # resolve() fills in every default
        self._max_in_flight: int = max_in_flight
        self._mark_size: int = min(mark_size, max_in_flight)
        # Marking waits until this much of the window is free: many tiny marks under load would
        # cost a statement each for a handful of records.
        self._mark_threshold = max(1, min(self._mark_size, self._max_in_flight // 2))
        self._coalesce_target = max(1, min(2 * self._mark_size, self._max_in_flight // 2))

        self._state = State.CREATED
        self._lock = threading.Condition(threading.Lock())
        self._stopping = threading.Event()
        self._crash: BaseException | None = None
        self._event_handler: EventHandler = lambda e: None

        self._leader_id: str | None = None
        self._leading = False
        self._force_remark = False
        self._in_flight = 0
        self._in_flight_keys: set[str] = set()
        self._parked: dict[str, deque[OutboxRecord]] = {}
        self._parked_since: dict[str, float] = {}
        self._parked_count = 0
        self._deliveries: deque[_Flight] = deque()
        # Failed attempts per record id, for the poison policy; only records that failed appear.
        self._attempts: dict[int, int] = {}
        self._poison_streak = 0
        self._producer_broken = False
        self._shutdown_deadline: float | None = None

        self._identity_header: tuple[str, str] | None = (
            (OUTBOX_HEADER, outbox_identity(self.config.leader_group_id, self.config.outbox_table))
            if self.config.identity_headers
            else None
        )
        self.metrics = HarvestMetrics()
        self._meter = Meter("throughput", limits.min_metrics_interval)  # type: ignore[arg-type]
        self._neli: Neli | None = None
        self._producer: Producer | None = None
        self._main_thread: threading.Thread | None = None
        self._delivery_thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._main_done = threading.Event()
        self._db_health: tuple[float, bool | None] = (float("-inf"), None)

    # ------------------------------------------------------------------ public API

    @property
    def state(self) -> State:
        return self._state

    @property
    def is_leader(self) -> bool:
        return self._leader_id is not None

    @property
    def leader_id(self) -> str | None:
        return self._leader_id

    @property
    def in_flight_records(self) -> int:
        return self._in_flight

    @property
    def in_flight_record_keys(self) -> list[str]:
        with self._lock:
            return list(self._in_flight_keys)

    @property
    def binding(self) -> DatabaseBinding | None:
        """The database binding while the harvester runs (``None`` before start and after
        stop); exporters use its optional extras (``count()`` for the backlog gauge)."""
        return self._binding

    @property
    def backlog_in_memory(self) -> int:
        """Marked records waiting behind an in-flight record of the same key."""
        return self._parked_count

    def health(self) -> Health:
        """What a readiness probe needs: running, leading, and whether the broker and the
        database answer (``None`` where the binding or client cannot tell)."""
        now = time.monotonic()
        neli = self._neli
        broker = neli.broker_connected if neli is not None else None
        db_ok: bool | None = None
        ping = getattr(self._binding, "ping", None)
        if ping is not None:
            cached_at, cached = self._db_health
            if now - cached_at < 2.0:
                db_ok = cached
            else:
                try:
                    ping()
                    db_ok = True
                except Exception as e:  # noqa: BLE001 - reported as not ready
                    log.debug("database ping failed: %s", _one_line(e))
                    db_ok = False
                self._db_health = (now, db_ok)
        return Health(self._state is State.RUNNING, self.is_leader, broker, db_ok)

    def set_event_handler(self, handler: EventHandler) -> None:
        """Register a callback for :mod:`pyharvest.core.events`; set it before :meth:`start`."""
        if self._state is not State.CREATED:
            raise HarvestError("set the event handler before starting the harvester")
        self._event_handler = handler

    def start(self) -> None:
        """Connect and start harvesting in the background. Errors at start-up (unreachable
        database, missing table, unreachable broker) are raised here."""
        if self._state is not State.CREATED:
            raise HarvestError(f"cannot start a harvester that is {self._state.value}")
        cfg = self.config
        log.info(
            "starting harvester %s: outbox %r at %s, Kafka %s",
            cfg.name,
            cfg.outbox_table,
            mask_data_source(cfg.data_source),
            mask_kafka_config(cfg.base_kafka_config),
        )
        try:
            source = self._binding_source
            self._binding = source if isinstance(source, DatabaseBinding) else source()
            self._producer = self._kafka.producer(self._producer_config())
            limits = cfg.limits
            self._neli = Neli(
                self._kafka,
                cfg.base_kafka_config,
                cfg.leader_topic,
                cfg.leader_group_id,
                cfg.name,
                heartbeat_timeout=limits.heartbeat_timeout,  # type: ignore[arg-type]
                min_poll_interval=limits.min_poll_interval,  # type: ignore[arg-type]
                poll_duration=limits.poll_duration,  # type: ignore[arg-type]
                on_status=self._on_leader_status,
            )
            self._neli.start()
        except BaseException:
            self._dispose_resources()
            self._state = State.STOPPED
            self._stopped.set()
            raise
        self._state = State.RUNNING
        self._delivery_thread = threading.Thread(target=self._delivery_loop, name="pyharvest-delivery", daemon=True)
        self._main_thread = threading.Thread(target=self._main_loop, name="pyharvest-main", daemon=True)
        self._delivery_thread.start()
        self._main_thread.start()

    def stop(self) -> None:
        """Ask the harvester to stop; returns at once. In-flight records are given
        ``limits.shutdownTimeout`` to be acknowledged and purged; any left are picked up by
        the next leader. Use :meth:`join` to wait."""
        if self._state is State.CREATED:
            self._state = State.STOPPED
            self._stopped.set()
            return
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until stopped; re-raise whatever crashed it. Returns False on timeout."""
        if not self._stopped.wait(timeout):
            return False
        if self._crash is not None:
            raise self._crash
        return True

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()

    # ------------------------------------------------------------------ configuration

    def _producer_config(self) -> dict[str, object]:
        cfg: dict[str, object] = {**self.config.base_kafka_config, **self.config.producer_kafka_config}
        # Idempotence keeps librdkafka's internal retries from reordering or duplicating a partition.
        cfg["enable.idempotence"] = True
        if "delivery.timeout.ms" not in cfg and "message.timeout.ms" not in cfg:
            cfg["delivery.timeout.ms"] = DEFAULT_DELIVERY_TIMEOUT_MS
        if "linger.ms" not in cfg and "queue.buffering.max.ms" not in cfg:
            cfg["linger.ms"] = DEFAULT_LINGER_MS
        return cfg

    # ------------------------------------------------------------------ events

    def _emit(self, event: Event) -> None:
        try:
            self._event_handler(event)
        except Exception:  # noqa: BLE001 - a faulty handler must not break harvesting
            log.exception("event handler raised on %r", event)

    def _on_leader_status(self, status: LeaderStatus) -> None:
        if status is LeaderStatus.ACQUIRED:
            leader_id = str(uuid.uuid4())
            with self._lock:
                self._leader_id = leader_id
                self._force_remark = False
                self._leading = True
            self.metrics.leader_acquisitions += 1
            log.info("elected leader, leader id %s", leader_id)
            self._emit(LeaderAcquired(leader_id))
        elif status is LeaderStatus.FENCED:
            # Tell the application at once: another leader may be starting. Publication
            # stops now; in-flight records are then given their delivery timeout.
            with self._lock:
                self._leading = False
                self._leader_id = None
            self._emit(LeaderFenced())
            self._quiesce("leadership fenced")
        else:
            # A revocation waits for in-flight records before the handler runs: the next
            # leader is not elected until this callback returns.
            with self._lock:
                self._leading = False
                self._leader_id = None
            self._quiesce(f"leadership {status.value}")
            self._emit(LeaderRevoked())

    # ------------------------------------------------------------------ main loop

    def _main_loop(self) -> None:
        assert self._neli is not None
        neli = self._neli
        min_poll = self.config.limits.min_poll_interval or 0.001
        try:
            while not self._stopping.is_set():
                if neli.pulse():
                    self._lead_step()
                else:
                    self._stopping.wait(min(neli.poll_due(), min_poll) or min_poll)
        except BaseException as e:  # noqa: BLE001 - reported through join()
            log.exception("harvester crashed")
            self._crash = e
        finally:
            self._shutdown()

    def _lead_step(self) -> None:
        assert self._neli is not None and self._binding is not None
        limits = self.config.limits
        if self._force_remark:
            self._quiesce("remark")
            if self._producer_broken:
                self._replace_producer()
            if self._poison_streak:
                # A record that fails for good would otherwise be retried in a tight loop.
                backoff = min(10.0, (limits.io_error_backoff or 0.01) * 2 ** min(self._poison_streak - 1, 10))
                log.warning("backing off %.1fs before retrying a record Kafka refused", backoff)
                self._stopping.wait(backoff)
            self._refresh_leader()
            return
        self._check_queue_deadline()
        free = self._max_in_flight - self._in_flight - self._parked_count
        if free < self._mark_threshold:
            with self._lock:
                free = self._max_in_flight - self._in_flight - self._parked_count
                if free < self._mark_threshold and not self._force_remark:
                    self._lock.wait(max(self._neli.poll_due(), 0.001))
            return
        leader_id = self._leader_id
        if leader_id is None:
            return
        started = time.monotonic()
        try:
            records = self._binding.mark(leader_id, min(self._mark_size, free))
        except Exception as e:  # noqa: BLE001 - the mark may have committed: remark
            self.metrics.mark_errors += 1
            log.warning("mark failed, will remark under a new leader id: %s", _one_line(e))
            with self._lock:
                self._force_remark = True
            self._stopping.wait(limits.io_error_backoff)
            return
        elapsed = time.monotonic() - started
        self.metrics.marks += 1
        self.metrics.observe(self.metrics.mark_seconds, elapsed)
        if self._neli.since_last_poll > limits.max_poll_interval:  # type: ignore[operator]
            # Leadership may have changed while the mark ran; publish nothing we are unsure of.
            log.warning(
                "exceeded the poll deadline (%.2fs > %.2fs) while marking; remarking",
                self._neli.since_last_poll,
                limits.max_poll_interval,
            )
            with self._lock:
                self._force_remark = True
            return
        if records:
            self.metrics.records_marked += len(records)
            self._dispatch(records)
        else:
            self._stopping.wait(limits.mark_backoff)

    def _dispatch(self, records: Sequence[OutboxRecord]) -> None:
        to_send: list[OutboxRecord] = []
        now = time.monotonic()
        with self._lock:
            if self._force_remark or not self._leading:
                return
            in_flight_keys, parked = self._in_flight_keys, self._parked
            for rec in records:
                key = rec.key
                if key in in_flight_keys:
                    queue = parked.get(key)
                    if queue is None:
                        parked[key] = queue = deque()
                        self._parked_since[key] = now
                    queue.append(rec)
                    self._parked_count += 1
                else:
                    in_flight_keys.add(key)
                    to_send.append(rec)
            self._in_flight += len(to_send)
        self._send(to_send)

    def _send(self, records: Sequence[OutboxRecord]) -> None:
        producer = self._producer
        assert producer is not None
        sink = self._deliveries.append
        stamp = self._identity_header
        for rec in records:
            flight = _Flight(rec, sink)
            headers = rec.headers
            if stamp is not None:
                # Consumers drop re-published copies by this identity (see pyharvest.inbox).
                # A list: the Kafka client takes it as it is, where a tuple would be copied.
                headers = [*headers, stamp, (RECORD_ID_HEADER, str(rec.id))]
            try:
                producer.produce(rec.topic, rec.key, rec.value, headers, flight)
            except ProduceError as e:
                flight(e.error)
            except Exception as e:  # noqa: BLE001 - treated as a failed delivery: reset and remark
                flight(DeliveryError("PRODUCE", _one_line(e)))
        self.metrics.records_published += len(records)

    def _check_queue_deadline(self) -> None:
        if not self._parked_since:
            return
        timeout = self.config.limits.queue_timeout
        oldest = min(self._parked_since.values(), default=None)
        if oldest is not None and time.monotonic() - oldest > timeout:  # type: ignore[operator]
            log.warning("a record waited over %.1fs behind its key's in-flight record; remarking", timeout)
            with self._lock:
                self._force_remark = True

    def _replace_producer(self) -> None:
        """A fatal producer error (say, fenced after an epoch bump) fails every later message:
        start afresh with a new producer. Called with nothing in flight."""
        old = self._producer
        log.warning("the producer hit a fatal error; replacing it")
        self._producer = self._kafka.producer(self._producer_config())
        self._producer_broken = False
        if old is not None:
            try:
                old.close()
            except Exception as e:  # noqa: BLE001 - it is being discarded anyway
                log.debug("closing the broken producer: %s", _one_line(e))

    def _refresh_leader(self) -> None:
        leader_id = str(uuid.uuid4())
        with self._lock:
            self._leader_id = leader_id
            self._force_remark = False
            self._leading = True
        self.metrics.leader_refreshes += 1
        log.info("refreshed leader id to %s: unacknowledged records will be remarked", leader_id)
        self._emit(LeaderRefreshed(leader_id))

    def _quiesce(self, reason: str) -> None:
        """Stop dispatching, forget parked records (they stay marked, and a remark under a new
        leader id takes them again) and wait until nothing is in flight."""
        with self._lock:
            self._leading = False
            self._parked.clear()
            self._parked_since.clear()
            self._parked_count = 0
            waited_from = time.monotonic()
            while self._in_flight > 0:
                deadline = self._shutdown_deadline
                if deadline is not None and time.monotonic() > deadline:
                    break
                if self._delivery_thread is not None and not self._delivery_thread.is_alive():
                    break
                self._lock.wait(0.1)
        if self._in_flight:
            log.warning(
                "%d records still in flight after %s; the next leader will remark them", self._in_flight, reason
            )
        else:
            log.debug("quiesced for %s in %.3fs", reason, time.monotonic() - waited_from)

    # ------------------------------------------------------------------ delivery thread

    def _delivery_loop(self) -> None:
        try:
            while not (self._main_done.is_set() and not self._deliveries):
                # Read each time: the main loop may replace a broken producer.
                producer = self._producer
                if producer is None:
                    break
                producer.poll(0.05)
                if self._deliveries:
                    self._coalesce(producer)
                    self._process_deliveries()
        except BaseException as e:  # noqa: BLE001
            log.exception("delivery thread crashed")
            self._crash = self._crash or e
            self.stop()
        finally:
            with self._lock:
                self._lock.notify_all()

    def _coalesce(self, producer: Producer) -> None:
        """Gather a few more acknowledgements before purging, so that one statement purges
        many rows. Not when a key is waiting behind an acknowledged record (its successor's
        latency matters more), nor on a failure (the remark should start at once)."""
        deliveries = self._deliveries
        deadline = time.monotonic() + COALESCE_SECONDS
        while len(deliveries) < self._coalesce_target and not self._parked_count:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._force_remark or self._main_done.is_set():
                return
            producer.poll(min(remaining, 0.001))

    def _process_deliveries(self) -> None:
        deliveries = self._deliveries
        batch: list[_Flight] = []
        pop = deliveries.popleft
        while deliveries:
            batch.append(pop())
        # Every dispatched record was read back from the outbox, so it has its id.
        acked = cast("list[int]", [f.record.id for f in batch if f.error is None])
        failed = [f for f in batch if f.error is not None]
        to_reset: list[_Flight] = []
        to_quarantine: list[QuarantineEntry] = []
        if failed:
            with self._lock:
                self._force_remark = True
            to_reset, to_quarantine = self._triage(failed)
        binding = self._binding
        assert binding is not None
        if acked:
            started = time.monotonic()
            purged = self._with_retry("purge", binding.purge, acked)
            self.metrics.observe(self.metrics.purge_seconds, time.monotonic() - started)
            if purged is not None:
                self.metrics.purge_statements += 1
                self.metrics.records_purged += purged
                if purged != len(acked):
                    log.warning("purged %d of %d acknowledged records; the rest were already gone", purged, len(acked))
            if self._attempts:
                for rid in acked:
                    self._attempts.pop(rid, None)
        if to_quarantine:
            assert isinstance(binding, QuarantineBinding)
            if self._with_retry("quarantine", binding.quarantine, to_quarantine) is not None:
                self.metrics.records_quarantined += len(to_quarantine)
                for q in to_quarantine:
                    self._attempts.pop(q.record.id, None)  # type: ignore[arg-type]
                    log.error(
                        "quarantined key %r after %d failed attempts of record %s (topic %r): %s; "
                        "its later records are held back until the key is replayed or discarded",
                        q.record.key, q.attempts, q.record.id, q.record.topic, q.error,
                    )
                    self._emit(RecordQuarantined(q.record.id, q.record.key, q.record.topic, q.error, q.attempts))
        if to_reset:
            by_leader: dict[str | None, list[Any]] = {}
            for f in to_reset:
                by_leader.setdefault(f.record.leader_id, []).append(f.record.id)
            for leader_id, ids in by_leader.items():
                # B023 does not apply: the lambda runs within this iteration, seeing this iteration's leader_id.
                reset = self._with_retry("reset", lambda i: binding.reset(i, leader_id), ids)  # noqa: B023
                if reset is not None:
                    self.metrics.reset_statements += 1
                    self.metrics.records_reset += reset
        self._release(batch)
        stats = self._meter.add(len(acked))
        if stats is not None:
            log.debug("%s", stats)
            self._emit(MeterRead(stats))

    def _triage(self, failed: Sequence[_Flight]) -> tuple[list[_Flight], list[QuarantineEntry]]:
        """Split failures into records to reset (retry) and records to quarantine."""
        quarantine_on = (
            self.config.poison_policy == "quarantine" and isinstance(self._binding, QuarantineBinding)
        )
        max_attempts = self.config.limits.max_delivery_attempts or 1
        to_reset: list[_Flight] = []
        to_quarantine: list[QuarantineEntry] = []
        poison = 0
        for f in failed:
            err = f.error
            assert err is not None
            rec = f.record
            self.metrics.delivery_errors[err.code] = self.metrics.delivery_errors.get(err.code, 0) + 1
            attempts = 1
            if rec.id is not None:
                attempts = self._attempts.get(rec.id, 0) + 1
                self._attempts[rec.id] = attempts
            if not err.retriable:
                poison += 1
            if err.fatal:
                self._producer_broken = True
            self._emit(DeliveryFailed(rec.id, rec.key, rec.topic, str(err), err.retriable, attempts))
            if quarantine_on and not err.retriable and attempts >= max_attempts:
                to_quarantine.append(QuarantineEntry(rec, str(err), attempts))
            else:
                to_reset.append(f)
        self._poison_streak = self._poison_streak + 1 if poison else 0
        first = failed[0]
        log.warning(
            "%d deliveries failed (first: record %s key %r: %s); %s",
            len(failed), first.record.id, first.record.key, first.error,
            "resetting them for a remark" if not to_quarantine else f"quarantining {len(to_quarantine)}",
        )
        return to_reset, to_quarantine

    def _release(self, batch: Sequence[_Flight]) -> None:
        to_send: list[OutboxRecord] = []
        now = time.monotonic()
        with self._lock:
            in_flight_keys, parked = self._in_flight_keys, self._parked
            dispatching = self._leading and not self._force_remark
            for f in batch:
                key = f.record.key
                queue = parked.get(key) if dispatching else None
                if queue:
                    to_send.append(queue.popleft())
                    self._parked_count -= 1
                    if queue:
                        self._parked_since[key] = now
                    else:
                        del parked[key]
                        del self._parked_since[key]
                else:
                    in_flight_keys.discard(key)
                    self._in_flight -= 1
            self._lock.notify_all()
        if to_send:
            self._send(to_send)

    def _with_retry(self, what: str, op: Callable[[list[Any]], int], ids: list[Any]) -> int | None:
        """Retry a purge or reset until it succeeds; give up only past the shutdown deadline,
        leaving the rows marked for the next leader."""
        backoff = self.config.limits.io_error_backoff or 0.0
        attempt = 0
        while True:
            try:
                return op(ids)
            except Exception as e:  # noqa: BLE001
                attempt += 1
                self.metrics.db_errors += 1
                deadline = self._shutdown_deadline
                if deadline is not None and time.monotonic() > deadline:
                    log.error("giving up on %s of %d records at shutdown: %s", what, len(ids), _one_line(e))
                    return None
                if attempt == 1 or attempt % 20 == 0:
                    log.warning(
                        "%s of %d records failed (attempt %d), retrying: %s", what, len(ids), attempt, _one_line(e)
                    )
                time.sleep(backoff)

    # ------------------------------------------------------------------ shutdown

    def _shutdown(self) -> None:
        self._state = State.STOPPING
        self._shutdown_deadline = time.monotonic() + (self.config.limits.shutdown_timeout or 0.0)
        log.info("stopping harvester %s", self.config.name)
        try:
            self._quiesce("shutdown")
            self._leader_id = None
        finally:
            self._main_done.set()
            if self._delivery_thread is not None:
                self._delivery_thread.join(max(0.0, self._shutdown_deadline - time.monotonic()) + 1.0)
            self._dispose_resources()
            self._state = State.STOPPED
            log.info("harvester %s stopped", self.config.name)
            self._stopped.set()

    def _dispose_resources(self) -> None:
        neli, self._neli = self._neli, None
        producer, self._producer = self._producer, None
        binding, self._binding = self._binding, None
        for what, close in (
            ("leader election", neli.close if neli is not None else None),
            ("producer", producer.close if producer is not None else None),
            ("database binding", binding.dispose if binding is not None else None),
        ):
            if close is None:
                continue
            try:
                close()
            except Exception as e:  # noqa: BLE001 - keep closing the rest
                log.warning("error closing %s: %s", what, _one_line(e))


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
