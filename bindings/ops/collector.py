"""A Prometheus collector that reads a harvester's state when scraped.

The engine only bumps plain counters and appends latencies to bounded reservoirs
(:class:`pyharvest.core.telemetry.metrics.HarvestMetrics`); everything Prometheus-specific happens here,
on the scraping thread, so harvesting pays nothing for being observed.

Embedded users register it with their own registry::

    from prometheus_client import REGISTRY
    from pyharvest.bindings.ops import HarvestCollector

    REGISTRY.register(HarvestCollector(harvest))
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from pyharvest.bindings.ops.histograms import (
    HISTOGRAMS,
    LATENCY_BUCKETS,
    PUBLISH_LATENCY,
    histograms_of,
    publish_buckets,
)
from pyharvest.bindings.ops.periodic import Periodic
from pyharvest.bindings.ops.watch import outbox_binding
from pyharvest.core.telemetry.client_restarts import HEALED_CLIENTS, restarts

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from pyharvest.bindings.ops.watch import OutboxWatch
    from pyharvest.core.engine.harvest import HarvestEngine

__all__ = ["LATENCY_BUCKETS", "BacklogCounter", "HarvestCollector"]

log = logging.getLogger("pyharvest.metrics")

# (metric suffix, HarvestMetrics attribute, help)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("records_marked", "records_marked", "Outbox records marked for publication by this process."),
    ("records_published", "records_published", "Records handed to the Kafka producer."),
    ("records_purged", "records_purged", "Records acknowledged by Kafka and deleted from the outbox."),
    ("records_reset", "records_reset", "Records whose delivery failed and were reset for a remark."),
    ("records_quarantined", "records_quarantined", "Poison records quarantined (poisonPolicy: quarantine)."),
    ("marks", "marks", "Mark statements run."),
    ("mark_errors", "mark_errors", "Mark statements that failed (each forces a remark)."),
    ("purge_statements", "purge_statements", "Purge statements run (one per batch of acknowledgements)."),
    ("reset_statements", "reset_statements", "Reset statements run."),
    ("database_errors", "db_errors", "Failed purge, reset or quarantine attempts (retried)."),
    ("leader_acquisitions", "leader_acquisitions", "Times this process became the leader."),
    ("leader_refreshes", "leader_refreshes", "Leader id refreshes forcing a remark (after errors, missed deadlines)."),
    ("transactions_committed", "transactions_committed", "Kafka transactions committed (delivery: exactly-once)."),
    ("transactions_aborted", "transactions_aborted", "Kafka transactions aborted; their records are remarked."),
    ("producer_fencings", "producer_fencings", "Times a newer leader's producer fenced this one's transactions."),
)

class BacklogCounter(Periodic):
    """Counts the outbox every ``interval`` seconds on a daemon thread, through the binding's
    optional ``count()`` method; :attr:`value` is ``None`` while unknown (no ``count()``, not
    started yet, or the last count failed)."""

    thread_name = "pyharvest-backlog"

    def __init__(self, harvest: HarvestEngine, interval: float) -> None:
        super().__init__(interval)
        self._harvest = harvest
        self.value: int | None = None
        self._failures = 0



    def read_once(self) -> int | None:
        count = getattr(outbox_binding(self._harvest), "count", None)
        if count is None:
            self.value = None
            return None
        try:
            n = int(count())
        except Exception as e:  # noqa: BLE001 - the gauge goes away until a count works again
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                log.warning("counting the outbox failed (%d so far): %s", self._failures, e)
            self.value = None
            return None
        self._failures = 0
        self.value = n
        return n



def client_restarts(ns: str) -> CounterMetricFamily:
    """``<ns>_kafka_client_restarts_total``: the process's stuck Kafka clients replaced, by client."""
    family = CounterMetricFamily(
        f"{ns}_kafka_client_restarts",
        "Kafka clients replaced after no progress for three group session timeouts while the cluster answered "
        "a fresh client, by client.",
        labels=["client"],
    )
    counts = restarts.snapshot()
    for client in sorted({*HEALED_CLIENTS, *counts}):
        family.add_metric([client], float(counts.get(client, 0)))
    return family


def _copy_dict(d: dict[str, int]) -> dict[str, int]:
    for _ in range(5):
        try:
            return dict(d)
        except RuntimeError:  # changed size while copying (another thread added an error code)
            continue
    return {}


class HarvestCollector(Collector):
    """Reads a :class:`~pyharvest.core.engine.harvest.HarvestEngine` at scrape time.

    Every metric is prefixed with ``namespace`` (``pyharvest``). The latency histograms drain
    the engine's reservoirs; all collectors of one harvester share the accumulated buckets, so
    registering two does not split the observations. ``watch`` (an
    :class:`~pyharvest.bindings.ops.watch.OutboxWatch`, which :func:`start_ops_server` starts)
    adds the oldest row's age and the quarantine.
    """

    def __init__(
        self,
        harvest: HarvestEngine,
        *,
        namespace: str = "pyharvest",
        backlog: BacklogCounter | None = None,
        buckets: Sequence[float] = LATENCY_BUCKETS,
        watch: OutboxWatch | None = None,
    ) -> None:
        self._harvest = harvest
        self._ns = namespace
        self._backlog = backlog
        self._watch = watch
        self._histograms = histograms_of(harvest, buckets)

    def describe(self) -> Iterable[Metric]:
        # Without describe(), a registry with auto_describe (the global REGISTRY) would call
        # collect() at registration: a database ping and an early drain, for nothing.
        return []

    def collect(self) -> Iterator[Metric]:
        h, ns = self._harvest, self._ns
        m = h.metrics
        cfg = h.config

        info = InfoMetricFamily(f"{ns}_harvester", "This harvester's identity and outbox.")
        info.add_metric(
            [],
            {
                "name": cfg.name,
                "leader_group_id": cfg.leader_group_id,
                "leader_topic": cfg.leader_topic,
                "outbox_table": cfg.outbox_table,
            },
        )
        yield info

        health = h.health()
        yield GaugeMetricFamily(f"{ns}_running", "1 while the harvester runs.", value=1.0 if health.running else 0.0)
        yield GaugeMetricFamily(
            f"{ns}_leader", "1 while this process is the leader and harvests the outbox.",
            value=1.0 if h.is_leader else 0.0,
        )
        if health.broker_connected is not None:
            yield GaugeMetricFamily(
                f"{ns}_broker_connected", "1 while the leader-election client reaches a Kafka broker.",
                value=1.0 if health.broker_connected else 0.0,
            )
        if health.database_connected is not None:
            yield GaugeMetricFamily(
                f"{ns}_database_connected", "1 while the database answers (pinged at most every 2s).",
                value=1.0 if health.database_connected else 0.0,
            )
        if health.change_feed_connected is not None:
            yield GaugeMetricFamily(
                f"{ns}_change_feed_connected",
                "1 while the connection listening for the stasher's notifications (PostgreSQL) is up.",
                value=1.0 if health.change_feed_connected else 0.0,
            )
        yield GaugeMetricFamily(f"{ns}_ready", "1 while /readyz answers 200.", value=1.0 if health.ready else 0.0)
        yield blocked_keys_gauge(ns, h.blocked_key_count)

        for suffix, attr, doc in _COUNTERS:
            yield CounterMetricFamily(f"{ns}_{suffix}", doc, value=float(getattr(m, attr)))

        yield client_restarts(ns)

        errors = CounterMetricFamily(
            f"{ns}_delivery_errors", "Deliveries Kafka refused, by error code.", labels=["code"]
        )
        for code, n in sorted(_copy_dict(m.delivery_errors).items()):
            errors.add_metric([code], float(n))
        yield errors

        yield GaugeMetricFamily(f"{ns}_in_flight_records", "Records sent and not yet acknowledged.",
                                value=float(h.in_flight_records))
        yield GaugeMetricFamily(f"{ns}_in_flight_keys", "Keys with a record in flight.",
                                value=float(len(h.in_flight_record_keys)))
        yield GaugeMetricFamily(f"{ns}_parked_records",
                                "Marked records parked in memory behind an in-flight record of their key "
                                "(at least once; exactly once, a parked key's records stay in the table).",
                                value=float(h.parked_records))
        limit = cfg.limits.max_in_flight_records
        if limit is not None:
            yield GaugeMetricFamily(f"{ns}_max_in_flight_records",
                                    "limits.maxInFlightRecords: in-flight plus parked records, at most.",
                                    value=float(limit))

        shared = self._histograms
        with shared.lock:
            shared.drain(h)
            for suffix, attr, doc in HISTOGRAMS:
                hist = shared.by_attr[attr]
                yield HistogramMetricFamily(f"{ns}_{suffix}", doc, buckets=hist.buckets(), sum_value=hist.sum)
        buckets, total = publish_buckets(h)
        yield HistogramMetricFamily(f"{ns}_{PUBLISH_LATENCY[0]}", PUBLISH_LATENCY[1], buckets=buckets, sum_value=total)
        yield from watch_gauges(ns, self._watch)

        backlog = self._backlog
        if backlog is not None and backlog.value is not None:
            yield GaugeMetricFamily(
                f"{ns}_backlog_records", "Rows in the outbox at the last count (metrics.backlogInterval).",
                value=float(backlog.value),
            )


def blocked_keys_gauge(ns: str, count: int) -> GaugeMetricFamily:
    """The keys held back by a record Kafka refuses for good (retried, under ``poisonPolicy:
    block``): the status page and ``/readyz`` name them."""
    return GaugeMetricFamily(
        f"{ns}_blocked_keys",
        "Keys held back by a record Kafka refuses for good, which is retried (poisonPolicy: block, or quarantine "
        "before maxDeliveryAttempts): the status page and /readyz name them.",
        value=float(count),
    )


def watch_gauges(ns: str, watch: OutboxWatch | None) -> Iterator[Metric]:
    """The oldest row's age, the quarantine and the clean-up horizon, as last read (absent
    while unknown)."""
    if watch is None:
        return
    if watch.age is not None:
        yield GaugeMetricFamily(
            f"{ns}_oldest_record_age_seconds",
            "Age of the oldest row in the outbox (the smallest id's create_time, set in the writer's "
            "transaction), 0 when it is empty; read every metrics.ageInterval, leader or standby.",
            value=watch.age,
        )
    horizon = watch.horizon
    if horizon is not None and horizon.age_seconds is not None:
        # One series, labelled with the session that holds the horizon (its id only: the
        # status page says what it runs), none when nothing old is held.
        age = GaugeMetricFamily(
            f"{ns}_cleanup_horizon_age_seconds",
            "How long the oldest snapshot the database keeps the outbox's dead rows for has been held (a long "
            "transaction, a snapshot left open, a prepared transaction), labelled with its holder; read every "
            "metrics.ageInterval. While it lasts the table grows and marks read through dead rows.",
            labels=["holder"],
        )
        age.add_metric([horizon.holder.split(" (")[0]], horizon.age_seconds)
        yield age
    if horizon is not None and horizon.behind is not None:
        yield GaugeMetricFamily(
            f"{ns}_cleanup_horizon_behind",
            "How far the database's clean-up is held back: PostgreSQL, transactions since the oldest snapshot "
            "(age(xmin)); MariaDB/MySQL, InnoDB's history list length (server-wide).",
            value=float(horizon.behind),
        )
    if watch.quarantined is not None:
        yield GaugeMetricFamily(
            f"{ns}_quarantined_records",
            "Poison records in the quarantine, one per parked key (the key's later records wait behind it): "
            "reaper quarantine replay or discard releases them.",
            value=float(len(watch.quarantined)),
        )
