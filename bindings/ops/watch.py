"""What the operations server reads of the outbox on its own timer, leader or standby alike.

Every ``metrics.ageInterval`` (5 s by default) :class:`OutboxWatch` reads, through the
binding's optional extras:

* the age of the oldest row (``oldest_create_time()``: one look-up through the id index, the
  row with the smallest id), for ``pyharvest_oldest_record_age_seconds``;
* the quarantined keys (``quarantined()``, with ``poisonPolicy: quarantine``), for
  ``pyharvest_quarantined_records`` and the status page;
* the database's clean-up horizon (``cleanup_horizon()``: who holds the oldest snapshot the
  outbox's dead rows are kept for, and for how long), for
  ``pyharvest_cleanup_horizon_age_seconds`` and the status page;

and keeps a short history of the publish rate, the publish latency and the age for the status
page's chart. Reading on a timer, not at scrape time, keeps a scrape from waiting on the
database; a read that fails leaves the value unknown (the gauge goes away) until one works.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyharvest.bindings.ops.histograms import LatencyDistribution
from pyharvest.bindings.ops.periodic import Periodic
from pyharvest.core.telemetry.logs import one_line

if TYPE_CHECKING:
    from pyharvest.core.engine.harvest import HarvestEngine
    from pyharvest.core.engine.sharded import ShardedHarvestEngine

__all__ = ["HISTORY", "OutboxWatch", "Sample", "harvest_engines", "outbox_binding"]

log = logging.getLogger("pyharvest.metrics")

#: Samples the status page's chart keeps (10 minutes at the default ``ageInterval``).
HISTORY = 120


@dataclass(frozen=True, slots=True)
class Sample:
    """One point of the status page's chart."""

    #: Wall-clock time of the sample (seconds since the epoch).
    time: float
    #: Records acknowledged and purged per second since the previous sample.
    published_per_second: float
    #: Publish latency quantiles (create_time to acknowledgement or commit) of the records
    #: published since the previous sample; None when none was.
    latency_p50_seconds: float | None
    latency_p99_seconds: float | None
    oldest_record_age_seconds: float | None


def harvest_engines(harvest: HarvestEngine | ShardedHarvestEngine) -> list[HarvestEngine]:
    """The engines whose counters add up to the process's: the harvester itself, or each of
    a sharded harvester's shard engines."""
    engines = getattr(harvest, "engines", None)
    if isinstance(engines, dict):
        return list(engines.values())
    return [harvest]  # type: ignore[list-item]  # a HarvestEngine


def outbox_binding(harvest: HarvestEngine | ShardedHarvestEngine) -> object | None:
    """The binding of the whole table while the harvester runs (a sharded harvester's shard
    engines each see only their shard)."""
    binding = getattr(harvest, "binding", None)
    if binding is None:
        binding = getattr(harvest, "_binding", None)
    return binding


class OutboxWatch(Periodic):
    """Reads the oldest row's age and the quarantine every ``interval`` seconds on a daemon
    thread; :attr:`age` and :attr:`quarantined` are ``None`` while unknown."""

    thread_name = "pyharvest-outbox-watch"

    def __init__(
        self,
        harvest: HarvestEngine | ShardedHarvestEngine,
        interval: float,
        latency: Callable[[], LatencyDistribution] | None = None,
        *,
        history: int = HISTORY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(interval)
        self._harvest = harvest
        self._latency = latency
        self._clock = clock
        self.age: float | None = None
        #: The quarantine's rows (``QuarantinedKey``), oldest first; [] without a quarantine.
        self.quarantined: list[Any] | None = None
        #: The database's clean-up horizon (a ``CleanupHorizon``); None while unknown.
        self.horizon: Any | None = None
        self.history: deque[Sample] = deque(maxlen=history)
        self._failures = 0
        self._last: tuple[float, int, LatencyDistribution | None] | None = None




    def read_once(self) -> None:
        """Read the age, the quarantine and the clean-up horizon now, and add a sample to the
        history."""
        binding = outbox_binding(self._harvest)
        now = self._clock()
        self.age = self._read(binding, "oldest_create_time", lambda oldest: _age(oldest, now))
        if getattr(self._harvest.config, "poison_policy", None) == "quarantine":
            self.quarantined = self._read(binding, "quarantined", list)
        else:
            self.quarantined = [] if binding is not None else None
        self.horizon = self._read(binding, "cleanup_horizon", lambda horizon: horizon)
        self._sample(now)

    def _read(self, binding: object | None, method: str, convert: Callable[[Any], Any]) -> Any:
        read = getattr(binding, method, None)
        if read is None:
            return None
        try:
            value = convert(read())
        except Exception as e:  # noqa: BLE001 - unknown until a read works again
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                log.warning("reading the outbox's %s failed (%d so far): %s", method, self._failures, one_line(e))
            return None
        self._failures = 0
        return value

    def _sample(self, now: float) -> None:
        purged = sum(e.metrics.records_purged for e in harvest_engines(self._harvest))
        latency = self._latency() if self._latency is not None else None
        last, self._last = self._last, (now, purged, latency)
        if last is None:
            return
        then, purged_then, latency_then = last
        elapsed = now - then
        if elapsed <= 0:
            return
        p50 = p99 = None
        if latency is not None:
            recent = latency.since(latency_then)
            p50, p99 = recent.quantile(0.5), recent.quantile(0.99)
        self.history.append(Sample(now, max(0, purged - purged_then) / elapsed, p50, p99, self.age))

    def samples(self) -> Sequence[Sample]:
        return list(self.history)


def _age(oldest: datetime | None, now: float) -> float:
    """Seconds since ``oldest`` (an aware datetime; naive ones are UTC), 0 for an empty outbox."""
    if oldest is None:
        return 0.0
    if oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=UTC)
    return max(0.0, now - oldest.timestamp())
