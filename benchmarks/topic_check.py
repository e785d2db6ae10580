"""Reading a benchmark's topic back, telling records the broker lost from records it hid.

The embedded broker (Tansu 0.6) can acknowledge messages at offsets above its partition's high
watermark when produce requests are retried, and it serves nothing above the high watermark
until that partition is written again (``python -m benchmarks.broker_acks`` shows it with no
harvester involved). A read to the end then misses the partition's last records, though the
broker has them. So when a read-back finds records missing, this writes one marker message
to every partition and reads again: what turns up then was hidden, what does not was lost.
The markers are left out of the report: they are neither lost, unexpected nor duplicates.
The tests that read a topic back after killing processes use it too: a write only makes the
broker serve what it already has, so a record it never had stays lost.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable
from typing import Any

from pyharvest.verify import verify_topic
from pyharvest.verify.report import VerifyReport

__all__ = ["NUDGE_KEY", "nudge", "read_back"]

NUDGE_KEY = "pyharvest-bench-nudge"


def read_back(bootstrap: str, topic: str, expected: Iterable[Any], *, timeout: float, idle: float = 2.0,
              nudge_missing: bool = True) -> tuple[VerifyReport, int]:
    """:func:`~pyharvest.verify.verify_topic` of ``topic``, and how many of the records it
    first reported lost the broker was only hiding (0 when nothing was missing).

    ``nudge_missing=False`` (Apache Kafka, which serves everything it acknowledged): no
    second look, a record not read back is lost."""
    expected = list(expected)
    report = verify_topic(bootstrap, topic, expected, timeout=timeout, idle=idle)
    if not report.lost_count or not nudge_missing:
        return report, 0
    first = report.lost_count
    markers = nudge(bootstrap, topic)
    report = verify_topic(bootstrap, topic, [*expected, *markers], timeout=timeout, idle=idle)
    report = dataclasses.replace(
        report,
        expected_count=report.expected_count - len(markers),
        received_count=report.received_count - (len(markers) - len(report.lost.get(NUDGE_KEY, ()))),
        lost={k: v for k, v in report.lost.items() if k != NUDGE_KEY},
    )
    hidden = first - report.lost_count
    print(f"read-back of {topic}: {first} record(s) missing; after a write to every partition "
          f"{hidden} turned up (hidden by the broker above its high watermark), {report.lost_count} lost",
          file=sys.stderr, flush=True)
    return report, hidden


def nudge(bootstrap: str, topic: str) -> list[tuple[str, bytes]]:
    """Write one marker message to each partition of ``topic``; returns them as expected
    (key, value) pairs."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    partitions = producer.list_topics(topic, timeout=10).topics[topic].partitions
    for p in partitions:
        producer.produce(topic, b"", NUDGE_KEY, p)
    if producer.flush(15):
        raise RuntimeError(f"could not write the markers to {topic!r} within 15 s")
    return [(NUDGE_KEY, b"")] * len(partitions)
