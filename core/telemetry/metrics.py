"""Counters and a throughput meter the engine keeps; exporters (Prometheus) read them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyharvest.core.telemetry.events import MeterStats
from pyharvest.core.telemetry.latency import PublishLatency

__all__ = ["HarvestMetrics", "Meter"]


class Meter:
    """Counts events and reports a rate at most once per ``interval`` seconds."""

    def __init__(self, name: str, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.interval = interval
        self._clock = clock
        self._total = 0
        self._last_total = 0
        self._last_time = clock()
        self._lock = threading.Lock()

    def add(self, n: int) -> MeterStats | None:
        """Add ``n``; return stats if an interval has passed since the last report."""
        with self._lock:
            self._total += n
            now = self._clock()
            elapsed = now - self._last_time
            if elapsed < self.interval or elapsed <= 0:
                return None
            count = self._total - self._last_total
            self._last_total, self._last_time = self._total, now
            return MeterStats(self.name, self._total, count, elapsed, count / elapsed)


@dataclass(slots=True)
class HarvestMetrics:
    """Monotonic counters and latest observations. Written by the engine's threads;
    reads are snapshots without locking (each field is a plain int or float)."""

    records_marked: int = 0
    records_published: int = 0
    records_purged: int = 0
    records_reset: int = 0
    records_quarantined: int = 0
    marks: int = 0
    mark_errors: int = 0
    purge_statements: int = 0
    reset_statements: int = 0
    db_errors: int = 0
    delivery_errors: dict[str, int] = field(default_factory=dict)
    leader_acquisitions: int = 0
    leader_refreshes: int = 0
    #: ``delivery: exactly-once``: Kafka transactions committed and aborted, times a newer
    #: producer of this shard fenced this one, and begin-to-commit durations.
    transactions_committed: int = 0
    transactions_aborted: int = 0
    producer_fencings: int = 0
    mark_seconds: list[float] = field(default_factory=list)
    purge_seconds: list[float] = field(default_factory=list)
    transaction_seconds: list[float] = field(default_factory=list)
    #: Each published record's ``create_time`` to its acknowledgement (exactly once: to its
    #: transaction's commit), every record counted.
    publish_latency: PublishLatency = field(default_factory=PublishLatency)

    def observe(self, bucket: list[float], seconds: float) -> None:
        # A bounded reservoir: exporters drain it; without an exporter it stays small.
        if len(bucket) < 10_000:
            bucket.append(seconds)

    def drain(self, name: str) -> list[float]:
        """Take the observations of ``mark_seconds``, ``purge_seconds`` or ``transaction_seconds``
        gathered so far."""
        bucket: list[float] = getattr(self, name)
        taken = bucket[:]
        del bucket[: len(taken)]
        return taken
