"""Reading topics back in tests: every message, counted as read (the embedded broker's high
watermark can lag the end of a partition, so it is never trusted)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers.waiting import wait_until


def create_topic(bootstrap: str, topic: str, partitions: int = 4) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(15)


def read_topic(bootstrap: str, topic: str, expect: int, timeout: float = 60.0, idle: float = 3.0) -> list[tuple[int, str, bytes | None, list]]:
    """Read ``topic`` from the beginning until ``expect`` messages arrived and nothing more
    came for ``idle`` seconds (duplicates may follow), or ``timeout`` passed.
    Returns (partition, key, value, headers) in partition order."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "pyharvest-test-reader", "enable.auto.commit": False}
    )
    try:
        parts: dict = {}

        def listed() -> bool:
            nonlocal parts
            md = consumer.list_topics(topic, timeout=5)
            parts = md.topics[topic].partitions if topic in md.topics else {}
            return bool(parts)

        with contextlib.suppress(AssertionError):  # never listed: read as no partitions, nothing came
            wait_until(listed, 15, f"topic {topic!r} to be listed", interval=0.2)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[tuple[int, str, bytes | None, list]] = []
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < deadline:
            msgs = consumer.consume(1000, 0.2)
            for m in msgs:
                if m.error() is None:
                    out.append((m.partition(), m.key().decode() if m.key() is not None else None, m.value(), m.headers() or []))
            if msgs:
                last = time.monotonic()
            elif len(out) >= expect and time.monotonic() - last > idle:
                break
        return out
    finally:
        consumer.close()


def values_per_key(messages) -> dict[str, list[bytes | None]]:
    out: dict[str, list[bytes | None]] = defaultdict(list)
    for _p, key, value, _h in messages:
        out[key].append(value)
    return out
