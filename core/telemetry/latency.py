"""Each published record's publish latency: from its ``create_time`` to Kafka's answer.

``create_time`` is set by the writer inside its transaction, before the commit, so the
latency includes the writer's commit and compares the writer's clock with the harvester's.
Observed per batch of acknowledgements (at least once) or per committed transaction (exactly
once), every record counted: a histogram of fixed buckets, cumulative, never drained, so that
any number of readers (a scrape, the status page) see every observation.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from datetime import UTC, datetime

from pyharvest.core.outbox.records import OutboxRecord

__all__ = ["PUBLISH_LATENCY_BUCKETS", "PublishLatency"]

#: Upper bounds (seconds) of the buckets: from a busy relay's milliseconds to a backlog's minutes.
PUBLISH_LATENCY_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)


class PublishLatency:
    """Counts per bucket (the last one past the highest bound), their sum and total. Written by
    one thread (the engine's delivery thread); a reader's copy may be a batch behind."""

    __slots__ = ("bounds", "counts", "sum", "total")

    def __init__(self, bounds: tuple[float, ...] = PUBLISH_LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.total = 0

    def observe(self, records: Iterable[OutboxRecord]) -> None:
        """Add ``now - create_time`` of each record, published now."""
        # Aware datetimes subtracted: cheaper per record than each one's timestamp().
        now = datetime.now(UTC)
        bounds, counts, find = self.bounds, self.counts, bisect.bisect_left
        added, n = 0.0, 0
        for record in records:
            created = record.create_time
            if created is None:
                continue
            if created.tzinfo is None:  # a binding's naive timestamps are UTC
                created = created.replace(tzinfo=UTC)
            seconds = (now - created).total_seconds()
            if seconds < 0.0:  # the writer's clock ahead of this one
                seconds = 0.0
            counts[find(bounds, seconds)] += 1
            added += seconds
            n += 1
        self.sum += added
        self.total += n

    def snapshot(self) -> tuple[tuple[int, ...], float]:
        """The counts per bucket and their sum, now."""
        return tuple(self.counts), self.sum
