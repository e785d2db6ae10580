"""The at-least-once delivery thread: settling what the producer reports, then releasing keys.

Upholds invariants 2 and 3 of the engine (:mod:`pyharvest.core.engine.harvest`):

* a batch of delivery reports is settled first (acknowledged rows purged, failed ones reset
  or quarantined) and its keys released only then, so that a successor is never sent while
  its predecessor could still be republished;
* a failure raises ``force_remark`` before any row is reset, so that nothing marked behind
  a reset row is dispatched once its key's barrier drops.

Reports are taken in batches: a purge or reset costs a statement whatever its number of rows,
so the fewer statements the faster a drain.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import cast

from pyharvest.core.ports.database import DatabaseBinding
from pyharvest.core.ports.kafka import DeliveryError, Producer
from pyharvest.core.publishing.failures import name_failures
from pyharvest.core.publishing.key_window import KeyWindow
from pyharvest.core.publishing.sender import Flight, Sender
from pyharvest.core.publishing.settlement import Settlement
from pyharvest.core.telemetry.events import Event, MeterRead
from pyharvest.core.telemetry.logs import log
from pyharvest.core.telemetry.metrics import HarvestMetrics, Meter

__all__ = ["COALESCE_SECONDS", "AckProcessor"]

# How long the delivery thread may hold acknowledgements to purge them in one statement.
COALESCE_SECONDS = 0.005

# Who settles the rows when a settlement is given up (only past the shutdown deadline).
_GIVING_UP = "at shutdown; the next leader remarks them"


class AckProcessor:
    """Settles the ``sender``'s reports through the ``settlement``, then releases their keys in
    the ``window``; a failure raises the window's remark first."""

    def __init__(
        self,
        sender: Sender,
        window: KeyWindow,
        settlement: Settlement,
        metrics: HarvestMetrics,
        *,
        coalesce_target: int,
        min_metrics_interval: float,
        emit: Callable[[Event], None],
    ) -> None:
        self._sender = sender
        self._window = window
        self._settlement = settlement
        self._metrics = metrics
        self._meter = Meter("throughput", min_metrics_interval)
        self._coalesce_target = coalesce_target
        self._emit = emit
        #: A fatal error made the producer unusable; the remark replaces it.
        self.producer_broken = False

    def serve(self, binding: DatabaseBinding, done: threading.Event) -> None:
        """Poll for reports and settle them until ``done`` is set and none are left. The
        sender's producer is read at each turn, as a remark may replace it."""
        reports, sender = self._sender.reports, self._sender
        while not (done.is_set() and not reports):
            producer = sender.producer
            if producer is None:
                break  # taken away for closing
            producer.poll(0.05)
            if reports:
                self._coalesce(producer, done)
                self.process(binding)

    def _coalesce(self, producer: Producer, done: threading.Event) -> None:
        """Gather a few more acknowledgements before purging, so that one statement purges
        many rows; only while the window says no one waits for them (not when a key is parked
        behind an acknowledged record, whose successor's latency matters more, nor on a
        failure, when the remark should start at once), and not at shutdown."""
        reports, window = self._sender.reports, self._window
        deadline = time.monotonic() + COALESCE_SECONDS
        while len(reports) < self._coalesce_target and window.may_hold_acks() and not done.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            producer.poll(min(remaining, 0.001))

    def process(self, binding: DatabaseBinding) -> None:
        """Settle every report received so far, then release their keys."""
        reports = self._sender.reports
        batch: list[Flight] = []
        pop = reports.popleft
        while reports:
            batch.append(pop())
        # Every dispatched record was read back from the outbox, so it has its id.
        acked = cast("list[int]", [f.record.id for f in batch if f.error is None])
        failed = [f for f in batch if f.error is not None]
        settlement = self._settlement
        to_reset: list[Flight] = []
        verdicts = None
        if failed:
            self._window.raise_remark()  # invariant 3: before any row is reset
            verdicts = settlement.judge(binding, [(f.record, cast(DeliveryError, f.error)) for f in failed])
            if not verdicts.poison:
                settlement.clean()
            self.producer_broken = self.producer_broken or verdicts.fatal
            to_reset = [failed[i] for i in verdicts.retry]
            self._log_failures(failed, len(verdicts.quarantine))
        if acked:
            self._metrics.publish_latency.observe([f.record for f in batch if f.error is None])
            purged = settlement.purge(binding, acked, "", _GIVING_UP)
            if purged is not None and purged != len(acked):
                log.warning("purged %d of %d acknowledged records; the rest were already gone", purged, len(acked))
            settlement.delivered(acked)
        if verdicts is not None and verdicts.quarantine:
            settlement.quarantine(binding, verdicts.quarantine, _GIVING_UP)
        if to_reset:
            settlement.reset(binding, [f.record for f in to_reset])
        self._window.release([f.record.key for f in batch])
        stats = self._meter.add(len(acked))
        if stats is not None:
            log.debug("%s", stats)
            self._emit(MeterRead(stats))

    @staticmethod
    def _log_failures(failed: list[Flight], quarantined: int) -> None:
        # Every failing record by key (up to a bound): each is a key held back. What to do
        # about a poison record is the judge's line, once per key and error.
        log.warning(
            "%d deliver%s failed (%s); %s",
            len(failed), "y" if len(failed) == 1 else "ies", name_failures([(f.record, f.error) for f in failed]),
            f"quarantining {quarantined}" if quarantined else "resetting them for a remark",
        )
