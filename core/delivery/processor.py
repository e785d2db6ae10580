"""Delivery processing: settling records in the database once Kafka has answered for them.

Upholds invariants 2 and 3 of the engine (:mod:`pyharvest.core.engine.harvest`):

* a batch of delivery reports is settled first (acknowledged rows purged, failed ones reset
  or quarantined) and its keys released only then, so that a successor is never sent while
  its predecessor could still be republished;
* a failure raises ``force_remark`` before any row is reset, so that nothing marked behind
  a reset row is dispatched once its key's barrier drops.

Reports are taken in batches, on the delivery thread: a purge or reset costs a statement
whatever its number of rows, so the fewer statements the faster a drain.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

from pyharvest.core.config.choices import PoisonPolicy
from pyharvest.core.config.settings import Config
from pyharvest.core.delivery.failures import FailedAttempts, before, settle
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.database import DatabaseBinding, QuarantineBinding, QuarantineEntry
from pyharvest.core.ports.kafka import DeliveryError, Producer
from pyharvest.core.telemetry.events import Event, MeterRead
from pyharvest.core.telemetry.logs import log
from pyharvest.core.telemetry.metrics import HarvestMetrics, Meter
from pyharvest.core.telemetry.spans import BatchSpans

__all__ = ["COALESCE_SECONDS", "DeliveryProcessor", "Flight"]

# How long the delivery thread may hold acknowledgements to purge them in one statement.
COALESCE_SECONDS = 0.005


class Flight:
    """One dispatched record; called once with its delivery outcome."""

    __slots__ = ("_sink", "error", "record")

    def __init__(self, record: OutboxRecord, sink: Callable[[Flight], None]) -> None:
        self.record = record
        self.error: DeliveryError | None = None
        self._sink = sink

    def __call__(self, error: DeliveryError | None) -> None:
        self.error = error
        self._sink(self)


class DeliveryProcessor:
    """Purges, resets and quarantines what the producer reports, then releases the keys.

    The engine supplies what this must not decide alone: ``raise_remark`` (stop dispatching
    and remark), ``release`` (lower the barriers of these keys), and ``deadline`` (past it,
    stop retrying: the shutdown deadline, or ``None`` while running). ``reports`` is the
    queue that each :class:`Flight` appends to.
    """

    def __init__(
        self,
        reports: deque[Flight],
        config: Config,
        metrics: HarvestMetrics,
        *,
        coalesce_target: int,
        emit: Callable[[Event], None],
        raise_remark: Callable[[], None],
        release: Callable[[list[str]], None],
        deadline: Callable[[], float | None],
        spans: BatchSpans,
    ) -> None:
        self._config = config
        self._spans = spans
        self._metrics = metrics
        self._meter = Meter("throughput", config.limits.min_metrics_interval)  # type: ignore[arg-type]
        self._coalesce_target = coalesce_target
        self._emit = emit
        self._raise_remark = raise_remark
        self._release = release
        self._deadline = deadline
        #: Reports not yet processed, appended by each :class:`Flight` from the producer's poll.
        self.reports = reports
        # Failed attempts per record, for the poison policy.
        self._failures = FailedAttempts(config, metrics, emit)
        #: Consecutive batches with a record Kafka refused for good: the remark's backoff grows with it.
        self.poison_streak = 0
        #: A fatal error made the producer unusable; the remark replaces it.
        self.producer_broken = False

    def serve(
        self,
        binding: DatabaseBinding,
        producer: Callable[[], Producer | None],
        done: threading.Event,
        may_wait: Callable[[], bool],
    ) -> None:
        """The delivery thread: poll for reports and process them until ``done`` is set and
        none are left. ``producer`` is read at each turn, as a remark may replace it."""
        reports = self.reports
        while not (done.is_set() and not reports):
            current = producer()
            if current is None:
                break
            current.poll(0.05)
            if reports:
                self._coalesce(current, may_wait)
                self.process(binding)

    def _coalesce(self, producer: Producer, may_wait: Callable[[], bool]) -> None:
        """Gather a few more acknowledgements before purging, so that one statement purges
        many rows; only while ``may_wait`` says no one waits for them: not when a key is
        parked behind an acknowledged record (its successor's latency matters more), nor
        on a failure (the remark should start at once), nor at shutdown."""
        reports = self.reports
        deadline = time.monotonic() + COALESCE_SECONDS
        while len(reports) < self._coalesce_target and may_wait():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            producer.poll(min(remaining, 0.001))

    def process(self, binding: DatabaseBinding) -> None:
        """Settle every report received so far, then release their keys."""
        reports = self.reports
        batch: list[Flight] = []
        pop = reports.popleft
        while reports:
            batch.append(pop())
        # Every dispatched record was read back from the outbox, so it has its id.
        acked = cast("list[int]", [f.record.id for f in batch if f.error is None])
        failed = [f for f in batch if f.error is not None]
        to_reset: list[Flight] = []
        to_quarantine: list[QuarantineEntry] = []
        if failed:
            self._raise_remark()
            to_reset, to_quarantine = self._triage(failed, binding)
        if acked:
            self._metrics.publish_latency.observe(f.record for f in batch if f.error is None)
            self._purge(binding, acked)
        if to_quarantine:
            assert isinstance(binding, QuarantineBinding)
            self._quarantine(binding, to_quarantine)
        if to_reset:
            self._reset(binding, to_reset)
        self._release([f.record.key for f in batch])
        stats = self._meter.add(len(acked))
        if stats is not None:
            log.debug("%s", stats)
            self._emit(MeterRead(stats))

    def _triage(
        self, failed: Sequence[Flight], binding: DatabaseBinding
    ) -> tuple[list[Flight], list[QuarantineEntry]]:
        """Split failures into records to reset (retry) and records to quarantine."""
        # Read at each failure, not once: the policy may be set after construction.
        quarantine_on = self._config.poison_policy == PoisonPolicy.QUARANTINE and isinstance(binding, QuarantineBinding)
        verdicts = self._failures.judge([(f.record, cast(DeliveryError, f.error)) for f in failed], quarantine_on)
        to_reset = [failed[i] for i in verdicts.retry]
        if verdicts.fatal:
            self.producer_broken = True
        self.poison_streak = self.poison_streak + 1 if verdicts.poison else 0
        first = failed[0]
        log.warning(
            "%d deliveries failed (first: record %s key %r: %s); %s%s",
            len(failed), first.record.id, first.record.key, first.error,
            "resetting them for a remark" if not verdicts.quarantine else f"quarantining {len(verdicts.quarantine)}",
            f". To fix the poison record: {verdicts.first_hint}" if verdicts.first_hint else "",
        )
        return to_reset, verdicts.quarantine

    def _purge(self, binding: DatabaseBinding, acked: list[int]) -> None:
        metrics = self._metrics
        started = time.monotonic()
        with self._spans.purge(len(acked)):
            purged = self._with_retry("purge", binding.purge, acked)
        metrics.observe(metrics.purge_seconds, time.monotonic() - started)
        if purged is not None:
            metrics.purge_statements += 1
            metrics.records_purged += purged
            if purged != len(acked):
                log.warning("purged %d of %d acknowledged records; the rest were already gone", purged, len(acked))
        self._failures.settled(acked)

    def _quarantine(self, binding: QuarantineBinding, entries: list[QuarantineEntry]) -> None:
        if self._with_retry("quarantine", binding.quarantine, entries) is not None:
            self._failures.quarantined(entries)

    def _reset(self, binding: DatabaseBinding, failed: list[Flight]) -> None:
        # Each reset names the leader id the rows were marked under: a late reset must not
        # unmark a row that a newer leader has marked since.
        by_leader: dict[str | None, list[Any]] = {}
        for f in failed:
            by_leader.setdefault(f.record.leader_id, []).append(f.record.id)
        for leader_id, ids in by_leader.items():
            # B023 does not apply: the lambda runs within this iteration, seeing this iteration's leader_id.
            reset = self._with_retry("reset", lambda i: binding.reset(i, leader_id), ids)  # noqa: B023
            if reset is not None:
                self._metrics.reset_statements += 1
                self._metrics.records_reset += reset

    def _with_retry(self, what: str, op: Callable[[list[Any]], int], items: list[Any]) -> int | None:
        """Retry a purge, reset or quarantine until it succeeds: releasing the keys before
        their rows are settled would break per-key order. Give up only past the deadline,
        leaving the rows marked for the next leader."""
        backoff = self._config.limits.io_error_backoff or 0.0
        return settle(
            what, op, items, metrics=self._metrics, pause=lambda: time.sleep(backoff),
            may_retry=before(self._deadline), giving_up="at shutdown; the next leader remarks them",
        )
