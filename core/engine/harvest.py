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

The engine's parts, each upholding its share:

* this module: leadership (NELI pulses, the leader id, fencing, remarks), the main loop that
  marks, health, and the shutdown's quiesce; the life cycle every harvester shares (start,
  stop, join, events) is :mod:`~pyharvest.core.engine.lifecycle`'s, the idle pause
  :mod:`~pyharvest.core.engine.idle`'s;
* the delivery mode (:mod:`~pyharvest.core.publishing.contract`), built once from
  ``config.delivery`` (:mod:`~pyharvest.core.publishing.modes`): its window takes what the main
  loop marks, its thread settles it through the middle both modes share
  (:mod:`~pyharvest.core.publishing.settlement`). At least once
  (:mod:`~pyharvest.core.publishing.at_least_once`), the key window, sender and delivery
  thread uphold invariants 1 to 3; exactly once (:mod:`~pyharvest.core.publishing.exactly_once`),
  a Kafka transaction per batch, whose rules (one producer per shard fenced by each new
  leader, a progress record per transaction, a takeover before the first mark) replace the
  per-key barrier.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from pyharvest.core.config.settings import Config, mask_data_source, mask_kafka_config
from pyharvest.core.election.leader_watch import LeaderSeen
from pyharvest.core.election.lease import Leadership, LeaderStatus
from pyharvest.core.election.neli import Neli, group_settings
from pyharvest.core.engine.idle import IdleBackoff, Wakeup
from pyharvest.core.engine.lifecycle import Lifecycle, State
from pyharvest.core.errors import TableLockedError
from pyharvest.core.ports.database import ChangeFeed, DatabaseBinding
from pyharvest.core.ports.kafka import KafkaClients
from pyharvest.core.publishing.blocked_keys import BlockedKey, BlockedKeys
from pyharvest.core.publishing.contract import ModeContext
from pyharvest.core.publishing.modes import delivery_mode
from pyharvest.core.publishing.shared_producer import SharedProducer
from pyharvest.core.telemetry.events import LeaderAcquired, LeaderFenced, LeaderRefreshed, LeaderRevoked
from pyharvest.core.telemetry.health import DatabaseProbe, Health
from pyharvest.core.telemetry.logs import label_thread, labelled, log, one_line
from pyharvest.core.telemetry.metrics import HarvestMetrics
from pyharvest.core.telemetry.repeats import CollapsingLogger
from pyharvest.core.telemetry.spans import BatchSpans

__all__ = ["HarvestEngine"]


class HarvestEngine(Lifecycle):
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
        leadership: Callable[[Callable[[LeaderStatus], None]], Leadership] | None = None,
        shard: int | None = None,
        shared_producer: SharedProducer | None = None,
    ) -> None:
        super().__init__()
        self.config = config.resolve()
        #: The shard this engine harvests when the outbox is sharded (events carry it).
        self.shard = shard
        self._leadership_source = leadership
        self._binding_source = binding
        self._binding: DatabaseBinding | None = None
        self._kafka = kafka
        limits = self.config.limits
        max_in_flight, mark_size = limits.max_in_flight_records, limits.mark_query_records
        assert max_in_flight is not None and mark_size is not None  # resolve() fills in every default
        self._mark_size: int = min(mark_size, max_in_flight)
        # Marking waits until this much of the window is free: many tiny marks under load would
        # cost a statement each for a handful of records.
        self._mark_threshold = max(1, min(self._mark_size, max_in_flight // 2))

        self._leader_id: str | None = None
        self._shutdown_deadline: float | None = None

        self.metrics = HarvestMetrics()
        #: The keys held back by records Kafka refuses for good, while they are retried.
        self.blocked = BlockedKeys(shard)
        #: One span per mark, published batch and purge (the delivery mode starts the latter two).
        self._spans = BatchSpans(self.config.outbox_table, shard, self.config.delivery)
        #: How records reach Kafka (``config.delivery``); its window takes what the main loop marks.
        self._mode_type = delivery_mode(self.config)
        self._mode = self._mode_type(
            ModeContext(
                self.config,
                kafka,
                self.metrics,
                shard=shard,
                emit=self._emit,
                deadline=lambda: self._shutdown_deadline,
                spans=self._spans,
                shared_producer=shared_producer,
                blocked=self.blocked,
            )
        )
        self._window = self._mode.window
        self._neli: Leadership | None = None
        self._main_thread: threading.Thread | None = None
        self._delivery_thread: threading.Thread | None = None
        self._main_done = threading.Event()
        self._database_probe = DatabaseProbe()
        self._idle = IdleBackoff(limits.mark_backoff or 0.0, limits.max_mark_backoff or 0.0)
        self._wakeup = Wakeup()
        self._unwatch: Callable[[], None] | None = None
        # A failure that lasts (the database away) would log a mark failure and a new leader
        # id every ioErrorBackoff: once per cause, then counts.
        self._repeats = CollapsingLogger(log)
        self._mark_failing = False
        #: What this engine's threads start their log lines with: its shard, when sharded.
        self._log_label = f"shard {shard}" if shard is not None else None

    # ------------------------------------------------------------------ public API

    @property
    def is_leader(self) -> bool:
        return self._leader_id is not None

    @property
    def leader_id(self) -> str | None:
        return self._leader_id

    def leaders(self) -> dict[int, LeaderSeen | None]:
        """Who leads while this process does not, as the leader topic's last heartbeat says
        (shard 0; None: not known yet); empty while this process leads or is not running."""
        neli = self._neli
        return neli.leaders() if neli is not None and not self.is_leader else {}

    @property
    def in_flight_records(self) -> int:
        return self._window.in_flight

    @property
    def in_flight_record_keys(self) -> list[str]:
        return self._window.in_flight_keys()

    @property
    def blocked_keys(self) -> tuple[BlockedKey, ...]:
        """The keys held back by a record Kafka refuses for good, longest blocked first (at
        most :data:`~pyharvest.core.publishing.blocked_keys.MAX_BLOCKED_SHOWN`; the count of
        all is :attr:`blocked_key_count`)."""
        return self.blocked.snapshot()

    @property
    def blocked_key_count(self) -> int:
        return self.blocked.total

    @property
    def binding(self) -> DatabaseBinding | None:
        """The database binding while the harvester runs (``None`` before start and after
        stop); exporters use its optional extras (``count()`` for the backlog gauge)."""
        return self._binding

    def refresh_health(self) -> None:
        """Ping the database now, in the background (the operations server's timer)."""
        self._database_probe.ping_now(self._binding)

    @property
    def parked_records(self) -> int:
        """Marked records parked behind an in-flight record of the same key."""
        return self._window.parked

    def health(self) -> Health:
        """What a readiness probe needs: running, leading, and whether the broker and the
        database answer (``None`` where the binding or client cannot tell)."""
        neli = self._neli
        broker = neli.broker_connected if neli is not None else None
        binding = self._binding
        database, database_error = self._database_probe.state(binding)
        feed = binding.feed_connected if self._unwatch is not None and isinstance(binding, ChangeFeed) else None
        return Health(self._state is State.RUNNING, self.is_leader, broker, database, feed, database_error,
                      neli.broker_error if neli is not None else None)

    def _open(self) -> None:
        cfg = self.config
        with labelled(self._log_label):  # started on the group's thread when sharded
            log.info(
                "starting harvester %s: outbox %r at %s, Kafka %s",
                cfg.name,
                cfg.outbox_table,
                mask_data_source(cfg.data_source),
                mask_kafka_config(cfg.base_kafka_config),
            )
        source = self._binding_source
        self._binding = source if isinstance(source, DatabaseBinding) else source()
        if isinstance(self._binding, ChangeFeed):
            self._unwatch = self._binding.watch(self._on_change)
        if self.shard is None:  # a sharded harvester checks once for all its shards
            self._mode_type.check(self._kafka, cfg)
        self._mode.open(self._binding)
        self._neli = (
            self._leadership_source(self._on_leader_status)
            if self._leadership_source
            else Neli(self._kafka, on_status=self._on_leader_status, **group_settings(cfg))
        )
        self._neli.start()

    def _launch(self) -> None:
        self._delivery_thread = threading.Thread(target=self._delivery_loop, name="pyharvest-delivery", daemon=True)
        self._main_thread = threading.Thread(target=self._main_loop, name="pyharvest-main", daemon=True)
        self._delivery_thread.start()
        self._main_thread.start()

    def stop(self) -> None:
        """Ask the harvester to stop; returns at once. In-flight records are given
        ``limits.shutdownTimeout`` to be acknowledged and purged; any left are picked up by
        the next leader. Use :meth:`join` to wait."""
        super().stop()

    def _wake(self) -> None:
        self._window.wake()
        self._wakeup.set()

    def _on_change(self) -> None:
        """The binding heard that rows may have been added: end the idle pause."""
        self._wakeup.set()

    # ------------------------------------------------------------------ events

    def _on_leader_status(self, status: LeaderStatus) -> None:
        # Called on the group's thread too (sharded): its lines still name the shard.
        with labelled(self._log_label):
            self._leader_status(status)

    def _leader_status(self, status: LeaderStatus) -> None:
        if status is LeaderStatus.ACQUIRED:
            self._mode.on_elected()
            leader_id = self._new_leader_id()
            self.metrics.leader_acquisitions += 1
            log.info("elected leader, leader id %s", leader_id)
            self._emit(LeaderAcquired(leader_id, self.shard))
        elif status is LeaderStatus.FENCED:
            # Tell the application at once: another leader may be starting. Publication
            # stops now, and the producer gives up on what it still holds: a request it
            # retried after the partition healed would land behind the successor's records.
            self._step_down()
            self._emit(LeaderFenced(self.shard))
            # The mode says how long to wait for what it had in flight (for shards, this runs
            # on the group's thread).
            self._quiesce("leadership fenced", self._mode.abandon())
            self.blocked.clear()  # the next leader retries them
        else:
            # A revocation waits for in-flight records before the handler runs: the next
            # leader is not elected until this callback returns.
            self._step_down()
            self._quiesce(f"leadership {status.value}")
            self.blocked.clear()  # the next leader retries them
            self._emit(LeaderRevoked(self.shard))

    # ------------------------------------------------------------------ main loop

    def _main_loop(self) -> None:
        assert self._neli is not None
        neli = self._neli
        min_poll = self.config.limits.min_poll_interval or 0.001
        label_thread(self._log_label)
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
        limits, window = self.config.limits, self._window
        if window.force_remark:
            self._remark()
            return
        if not window.may_mark(min(max(self._neli.poll_due(), 0.001), 0.1)):
            return  # exactly once: elected, or the producer in doubt; the takeover runs on the delivery thread
        free = window.free
        if free < self._mark_threshold:
            window.wait_for_room(self._mark_threshold, max(self._neli.poll_due(), 0.001))
            return
        leader_id = self._leader_id
        if leader_id is None:
            return
        idle = self._idle
        due_in = idle.due_in()
        if due_in > 0:
            # Pausing after empty marks; leadership is still pulsed on time, and a wake-up
            # (rows added, or stop) ends the pause.
            if self._wakeup.wait(min(due_in, max(self._neli.poll_due(), 0.001))):
                idle.wake()
            return
        # Kept if it comes during the mark: the mark may not have seen those rows.
        self._wakeup.clear()
        started = time.monotonic()
        window.begin_mark()
        try:
            with self._spans.mark() as span:
                records = self._binding.mark(leader_id, min(self._mark_size, free))
                span.count(len(records))
        except Exception as e:  # noqa: BLE001 - the mark may have committed: remark
            self.metrics.mark_errors += 1
            self._database_probe.note_failure(e)  # a missing table: not ready at once
            self._mark_failing = True
            self._repeats.log(
                logging.WARNING,
                "mark failed, will remark under a new leader id: %s",
                one_line(e),
                # A locked table's message changes with each wait (how long the holder's
                # transaction has been open): one cause, collapsed like any repeat.
                cause="mark failed: table locked" if isinstance(e, TableLockedError) else f"mark failed: {one_line(e)}",
            )
            window.raise_remark()
            self._stopping.wait(limits.io_error_backoff)
            return
        elapsed = time.monotonic() - started
        if self._mark_failing:
            self._mark_failing = False
            self._repeats.flush(forget=True)  # the counts of the failure that just ended
            log.info("marks succeed again")
        self.metrics.marks += 1
        self.metrics.observe(self.metrics.mark_seconds, elapsed)
        if self._neli.since_last_poll > limits.max_poll_interval:  # type: ignore[operator]
            # Leadership may have changed while the mark ran; publish nothing we are unsure of.
            log.warning(
                "exceeded the poll deadline (%.2fs > %.2fs) while marking; remarking",
                self._neli.since_last_poll,
                limits.max_poll_interval,
            )
            window.raise_remark()
            return
        if self.blocked.count:
            # A blocked record this mark passed by is gone (deleted): its key is free.
            self.blocked.marked(leader_id, records, min(self._mark_size, free))
        if records:
            idle.found_rows()
            self.metrics.records_marked += len(records)
            window.dispatch(records)
        else:
            idle.found_nothing()

    def _remark(self) -> None:
        """Take every unacknowledged record again, under a new leader id, once nothing is in
        flight (invariant 3): what was marked behind a failure is remarked behind its retry."""
        self._quiesce("remark")
        backoff = self._mode.before_remark()
        if backoff:
            log.warning("backing off %.1fs before retrying a record Kafka refused", backoff)
            self._stopping.wait(backoff)
        leader_id = self._new_leader_id()
        self.metrics.leader_refreshes += 1
        self._repeats.log(
            logging.INFO,
            "refreshed leader id to %s: unacknowledged records will be remarked",
            leader_id,
            cause="refreshed leader id",
        )
        self._emit(LeaderRefreshed(leader_id, self.shard))

    def _new_leader_id(self) -> str:
        """Lead under a fresh id: rows marked under any earlier one count as unmarked."""
        leader_id = str(uuid.uuid4())
        self._leader_id = leader_id
        self._idle.found_rows()  # what the last leader id marked is to be taken again now
        self._window.lead()
        return leader_id

    def _step_down(self) -> None:
        self._window.stop_leading()
        self._leader_id = None

    def _quiesce(self, reason: str, deadline: float | None = None) -> None:
        thread = self._delivery_thread
        if self._shutdown_deadline is not None:
            deadline = min(deadline or self._shutdown_deadline, self._shutdown_deadline)
        self._window.quiesce(reason, deadline, lambda: thread is None or thread.is_alive())

    # ------------------------------------------------------------------ delivery thread

    def _delivery_loop(self) -> None:
        label_thread(self._log_label)
        try:
            binding = self._binding
            assert binding is not None
            self._mode.serve(binding, self._main_done)
        except BaseException as e:  # noqa: BLE001
            log.exception("delivery thread crashed")
            self._crash = self._crash or e
            self.stop()
        finally:
            # A quiesce waiting for the window to empty must learn that nothing will empty it.
            self._window.wake()

    # ------------------------------------------------------------------ shutdown

    def _shutdown(self) -> None:
        self._state = State.STOPPING
        self._shutdown_deadline = time.monotonic() + (self.config.limits.shutdown_timeout or 0.0)
        self._repeats.flush()
        log.info("stopping harvester %s", self.config.name)
        try:
            self._quiesce("shutdown")
            self._leader_id = None
        finally:
            self._main_done.set()
            if self._delivery_thread is not None:
                self._delivery_thread.join(max(0.0, self._shutdown_deadline - time.monotonic()) + 1.0)
            self._close_resources()
            self.blocked.clear()  # nothing is retried here any more
            self._state = State.STOPPED
            log.info("harvester %s stopped", self.config.name)
            self._stopped.set()

    def _close_resources(self) -> None:
        neli, self._neli = self._neli, None
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            try:
                unwatch()
            except Exception as e:  # noqa: BLE001 - keep closing the rest
                log.warning("error closing the change feed: %s", one_line(e))
        binding, self._binding = self._binding, None
        self._close_each(
            (
                ("leader election", neli.close if neli is not None else None),
                ("producer", self._mode.close),
                ("database binding", binding.dispose if binding is not None else None),
            )
        )
