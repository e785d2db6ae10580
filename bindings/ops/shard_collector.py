"""Prometheus metrics of a sharded harvester: the process's health, and per shard (label
``shard``) whether this process leads it, its counters, its in-flight records and its backlog.

The single-leader metrics are :mod:`.collector`'s; these keep their names, with the label.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pyharvest.bindings.ops.collector import (
    _COUNTERS,
    _copy_dict,
    blocked_keys_gauge,
    client_restarts,
    log,
    watch_gauges,
)
from pyharvest.bindings.ops.histograms import HISTOGRAMS, PUBLISH_LATENCY, histograms_of, publish_buckets
from pyharvest.bindings.ops.periodic import Periodic

if TYPE_CHECKING:
    from pyharvest.bindings.ops.watch import OutboxWatch
    from pyharvest.core.engine.sharded import ShardedHarvestEngine

__all__ = ["ShardBacklog", "ShardedHarvestCollector"]


class ShardBacklog(Periodic):
    """Counts each led shard's rows every ``interval`` seconds (through its shard's index)."""

    thread_name = "pyharvest-shard-backlog"

    def __init__(self, harvest: ShardedHarvestEngine, interval: float) -> None:
        super().__init__(interval)
        self._harvest = harvest
        self.values: dict[int, int] = {}



    def read_once(self) -> None:
        for shard, engine in self._harvest.engines.items():
            count = getattr(engine.binding, "count", None)
            if count is None or not engine.is_leader:
                self.values.pop(shard, None)
                continue
            try:
                self.values[shard] = int(count())
            except Exception as e:  # noqa: BLE001 - the shard's gauge goes away until a count works
                log.warning("counting shard %d failed: %s", shard, e)
                self.values.pop(shard, None)



class ShardedHarvestCollector(Collector):
    """Reads a :class:`~pyharvest.core.engine.sharded.ShardedHarvestEngine` at scrape time.

    ``pyharvest_leader{shard}`` has a series for every shard of the outbox, 0 for those this
    process does not lead, so that a shard nobody leads shows (``max by (shard)`` is 0)."""

    def __init__(
        self,
        harvest: ShardedHarvestEngine,
        *,
        namespace: str = "pyharvest",
        backlog: ShardBacklog | None = None,
        watch: OutboxWatch | None = None,
    ) -> None:
        self._harvest = harvest
        self._ns = namespace
        self._backlog = backlog
        self._watch = watch

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        h, ns = self._harvest, self._ns
        cfg = h.config
        info = InfoMetricFamily(f"{ns}_harvester", "This harvester's identity and outbox.")
        info.add_metric([], {"name": cfg.name, "leader_group_id": cfg.leader_group_id,
                             "leader_topic": cfg.leader_topic, "outbox_table": cfg.outbox_table,
                             "shards": str(cfg.shards)})
        yield info
        health = h.health()
        yield GaugeMetricFamily(f"{ns}_running", "1 while the harvester runs.", value=1.0 if health.running else 0.0)
        yield GaugeMetricFamily(f"{ns}_ready", "1 while /readyz answers 200.", value=1.0 if health.ready else 0.0)
        yield blocked_keys_gauge(ns, h.blocked_key_count)
        if health.broker_connected is not None:
            yield GaugeMetricFamily(f"{ns}_broker_connected", "1 while the leader group's client reaches a broker.",
                                    value=1.0 if health.broker_connected else 0.0)
        if health.database_connected is not None:
            yield GaugeMetricFamily(f"{ns}_database_connected", "1 while the database answers.",
                                    value=1.0 if health.database_connected else 0.0)
        if health.change_feed_connected is not None:
            yield GaugeMetricFamily(f"{ns}_change_feed_connected",
                                    "1 while the connection listening for the stasher's notifications is up.",
                                    value=1.0 if health.change_feed_connected else 0.0)
        yield client_restarts(ns)
        engines = sorted(h.engines.items())
        leader = GaugeMetricFamily(f"{ns}_leader", "1 while this process leads the shard.", labels=["shard"])
        in_flight = GaugeMetricFamily(f"{ns}_in_flight_records", "Records sent and not yet acknowledged.",
                                      labels=["shard"])
        led = {shard for shard, engine in engines if engine.is_leader}
        for shard in range(cfg.shards):
            leader.add_metric([str(shard)], 1.0 if shard in led else 0.0)
        for shard, engine in engines:
            in_flight.add_metric([str(shard)], float(engine.in_flight_records))
        yield leader
        yield in_flight
        for suffix, attr, doc in _COUNTERS:
            family = CounterMetricFamily(f"{ns}_{suffix}", doc, labels=["shard"])
            for shard, engine in engines:
                family.add_metric([str(shard)], float(getattr(engine.metrics, attr)))
            yield family
        errors = CounterMetricFamily(f"{ns}_delivery_errors", "Deliveries Kafka refused, by error code.",
                                     labels=["shard", "code"])
        for shard, engine in engines:
            for code, n in sorted(_copy_dict(engine.metrics.delivery_errors).items()):
                errors.add_metric([str(shard), code], float(n))
        yield errors
        histograms = {suffix: HistogramMetricFamily(f"{ns}_{suffix}", doc, labels=["shard"])
                      for suffix, _, doc in (*HISTOGRAMS, (PUBLISH_LATENCY[0], "", PUBLISH_LATENCY[1]))}
        for shard, engine in engines:
            shared = histograms_of(engine)
            with shared.lock:
                shared.drain(engine)
                for suffix, attr, _ in HISTOGRAMS:
                    hist = shared.by_attr[attr]
                    histograms[suffix].add_metric([str(shard)], hist.buckets(), hist.sum)
            buckets, total = publish_buckets(engine)
            histograms[PUBLISH_LATENCY[0]].add_metric([str(shard)], buckets, total)
        yield from histograms.values()
        yield from watch_gauges(ns, self._watch)
        if self._backlog is not None:
            backlog = GaugeMetricFamily(f"{ns}_backlog_records", "Rows of the shard at the last count.",
                                        labels=["shard"])
            for shard, n in sorted(self._backlog.values.items()):
                backlog.add_metric([str(shard)], float(n))
            yield backlog
