"""Each published record's publish latency: from its ``create_time`` to Kafka's answer.

``create_time`` is set by the writer inside its transaction, before the commit, so the
latency includes the writer's commit and compares the writer's clock with the harvester's.
Observed once per batch of acknowledgements (at least once) or per committed transaction
(exactly once) into :class:`~pyharvest.core.metrics.HarvestMetrics`' bounded reservoir.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC

from pyharvest.core.metrics import HarvestMetrics
from pyharvest.core.records import OutboxRecord

__all__ = ["observe_publish_latency"]


def observe_publish_latency(metrics: HarvestMetrics, records: Iterable[OutboxRecord]) -> None:
    """Add ``now - create_time`` of each record (published now) to ``publish_latency_seconds``."""
    now = time.time()
    bucket, observe = metrics.publish_latency_seconds, metrics.observe
    for record in records:
        created = record.create_time
        if created is None:
            continue
        if created.tzinfo is None:  # a binding's naive timestamps are UTC
            created = created.replace(tzinfo=UTC)
        observe(bucket, max(0.0, now - created.timestamp()))
