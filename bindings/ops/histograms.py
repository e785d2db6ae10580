"""Cumulative latency histograms, shared by every reader.

The engine appends each mark, purge and transaction duration to a bounded list
(:class:`pyharvest.core.telemetry.metrics.HarvestMetrics`); draining a list takes its observations away
from any other reader, so every collector of one harvester drains into the same
:class:`_HarvestHistograms`, under its lock. The publish latency, one observation per record, is
counted by the engine itself in fixed buckets (:class:`pyharvest.core.telemetry.latency.PublishLatency`),
which are read as they are.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyharvest.core.telemetry.latency import PUBLISH_LATENCY_BUCKETS

if TYPE_CHECKING:
    from pyharvest.core.engine.harvest import HarvestEngine

__all__ = [
    "HISTOGRAMS",
    "LATENCY_BUCKETS",
    "PUBLISH_LATENCY",
    "LatencyDistribution",
    "histograms_of",
    "publish_buckets",
    "publish_latency",
]

#: Upper bounds (seconds) of the mark, purge and transaction duration histograms' buckets.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
#: (metric suffix, HarvestMetrics reservoir, help)
HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("mark_duration_seconds", "mark_seconds", "Time a mark statement took."),
    ("purge_duration_seconds", "purge_seconds", "Time a purge took, retries included."),
    ("transaction_duration_seconds", "transaction_seconds", "Time from a transaction's begin to its commit."),
)

#: (metric suffix, help) of the publish latency histogram.
PUBLISH_LATENCY = (
    "publish_latency_seconds",
    "Time from each record's create_time to Kafka's acknowledgement (delivery: exactly-once: to its "
    "transaction's commit). create_time is set inside the writer's transaction, before its commit, so "
    "this includes the writer's commit; it compares the writer's clock with the harvester's.",
)


@dataclass(frozen=True, slots=True)
class LatencyDistribution:
    """A cumulative histogram at one moment: counts per bucket (the last one is +Inf)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.counts)

    def since(self, earlier: LatencyDistribution | None) -> LatencyDistribution:
        """The observations added after ``earlier`` (the same histogram, read before)."""
        if earlier is None or earlier.bounds != self.bounds:
            return self
        return LatencyDistribution(self.bounds, tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True)))

    def __add__(self, other: LatencyDistribution) -> LatencyDistribution:
        return LatencyDistribution(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)))

    def quantile(self, q: float) -> float | None:
        """Estimated as Prometheus' ``histogram_quantile`` does (linear within a bucket; the
        highest finite bound for the +Inf bucket); None without observations."""
        total = self.total
        if total == 0:
            return None
        rank = q * total
        running = 0
        for i, n in enumerate(self.counts):
            if n and running + n >= rank:
                if i == len(self.bounds):
                    return self.bounds[-1]
                lower = self.bounds[i - 1] if i > 0 else 0.0
                return lower + (self.bounds[i] - lower) * (rank - running) / n
            running += n
        return self.bounds[-1]


class _Histogram:
    """Cumulative buckets fed from a reservoir of observations."""

    __slots__ = ("bounds", "counts", "sum", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0
        self.sum = 0.0

    def add(self, observations: Iterable[float]) -> None:
        bounds, counts = self.bounds, self.counts
        for v in observations:
            counts[bisect.bisect_left(bounds, v)] += 1
            self.total += 1
            self.sum += v

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append((repr(float(bound)), running))
        out.append(("+Inf", self.total))
        return out


class _HarvestHistograms:
    """The histograms of one engine, shared by every reader of it."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.lock = threading.Lock()
        self.by_attr = {attr: _Histogram(sorted(buckets)) for _, attr, _ in HISTOGRAMS}

    def drain(self, engine: HarvestEngine) -> None:
        """Move what the engine observed since the last drain into the buckets (hold the lock)."""
        metrics = engine.metrics
        for attr, hist in self.by_attr.items():
            hist.add(metrics.drain(attr))


_shared: weakref.WeakKeyDictionary[Any, _HarvestHistograms] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def histograms_of(engine: HarvestEngine, buckets: Sequence[float] = LATENCY_BUCKETS) -> _HarvestHistograms:
    """The shared histograms of ``engine`` (``buckets``: their bounds, the first time)."""
    with _shared_lock:
        h = _shared.get(engine)
        if h is None:
            h = _shared[engine] = _HarvestHistograms(buckets)
        return h


def publish_buckets(engine: HarvestEngine) -> tuple[list[tuple[str, float]], float]:
    """The engine's publish latency as Prometheus' cumulative buckets, and their sum."""
    latency = engine.metrics.publish_latency
    counts, total = latency.snapshot()
    out: list[tuple[str, float]] = []
    running = 0
    for bound, n in zip(latency.bounds, counts, strict=False):
        running += n
        out.append((repr(float(bound)), running))
    out.append(("+Inf", running + counts[-1]))
    return out, total


def publish_latency(engines: Iterable[HarvestEngine]) -> LatencyDistribution:
    """The publish latency of these engines together, now."""
    total: LatencyDistribution | None = None
    for engine in engines:
        latency = engine.metrics.publish_latency
        dist = LatencyDistribution(latency.bounds, latency.snapshot()[0])
        total = dist if total is None else total + dist
    return total or LatencyDistribution(PUBLISH_LATENCY_BUCKETS, (0,) * (len(PUBLISH_LATENCY_BUCKETS) + 1))
