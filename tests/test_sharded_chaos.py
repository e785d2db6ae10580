"""Sharded harvesting under fire: ``reaper`` processes sharing six shards are killed (SIGKILL,
SIGTERM) while a writer stashes over many keys. Nothing may be lost or reordered, and a killed
process must stall only its own shards: the others' keys keep flowing without a pause."""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks.topic_check import NUDGE_KEY, read_back
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.outbox.keys import shard_of
from tests.helpers.fixtures.kafka import on_embedded_broker
from tests.helpers.outbox import Writer, outbox_count
from tests.helpers.reapers import (
    SHARDS,
    Reaper,
    Spawner,
    live_databases,
    shards_of,
    stop_all,
    stop_at_random,
    write_config,
)
from tests.helpers.topics import create_topic
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


def publish_times(bootstrap: str, topic: str, expect: int, timeout: float = 90.0) -> list[tuple[str, bytes, float]]:
    """(key, value, producer timestamp in seconds) of every message of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"times-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[tuple[str, float]] = []
        deadline, last = time.monotonic() + timeout, time.monotonic()
        while time.monotonic() < deadline and (len(out) < expect or time.monotonic() - last < 2):
            for m in consumer.consume(1000, 0.2):
                if m.error() is None and m.key() != NUDGE_KEY.encode():  # read_back's markers, if any
                    out.append((m.key().decode(), m.value(), m.timestamp()[1] / 1000.0))
                    last = time.monotonic()
        return out
    finally:
        consumer.close()



def flowing(writer: Writer, url: str, table: str, records: int) -> None:
    """Wait until the leaders have purged ``records`` more of ``writer``'s records."""
    def purged() -> int:
        written = len(writer.expected)  # read first: the outbox only has fewer rows since
        return written - outbox_count(url, table)

    before = purged()
    wait_until(lambda: purged() >= before + records, 60, f"{records} more records purged")


def test_a_killed_process_stalls_only_its_own_shards(
    dialect, database_url, table_name, topic_name, kafka_bootstrap, tmp_path, group_protocol
):
    live_databases(dialect)
    create_outbox_table(database_url, table_name, shards=SHARDS)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    cfg = write_config(tmp_path, kafka_bootstrap, database_url, table_name, group_protocol)
    reapers = [Reaper(cfg, tmp_path / f"reaper-{n}.log") for n in range(3)]
    writer = Writer(database_url, table_name, topic_name, keys=120, batch=30, pause=0.02).start()
    try:
        def owners() -> list[frozenset[int]]:
            return [frozenset(shards_of(r)) for r in reapers]

        def spread() -> bool:  # all three lead, and the assignment stays put while records flow
            before = owners()
            if not all(before) or sorted(s for o in before for s in o) != list(range(SHARDS)):
                return False
            flowing(writer, database_url, table_name, 300)
            return owners() == before

        # A victim chosen while a rebalance still moves shards may hand one over just before its
        # kill: that shard never stalls (CI saw a "stall" of 0.03 s).
        wait_until(spread, 120, lambda: f"the shards to spread over the three processes and stay: {owners()}")
        # Every shard led and publishing: the handovers while the shards spread are over (their
        # silences are not a survivor's), and the window checked below starts here at the earliest.
        steady_at = time.time()
        flowing(writer, database_url, table_name, 300)
        victim = reapers[0]
        stalled = shards_of(victim)
        survivors = set(range(SHARDS)) - stalled
        killed_at = time.time()
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        # The dead process's shards come back once the group notices (its session timeout).
        wait_until(lambda: sorted(s for r in reapers for s in shards_of(r)) == list(range(SHARDS)), 90,
                 "the dead process's shards to move")
        flowing(writer, database_url, table_name, 300)
        writer.stop()
        wait_until(lambda: outbox_count(database_url, table_name) == 0, 120, "the survivors to drain the outbox")
    finally:
        writer._stop.set()
        stop_all(reapers)
    report, _hidden = read_back(kafka_bootstrap, topic_name, writer.expected, timeout=90, nudge_missing=on_embedded_broker())
    assert report.lost_count == 0 and report.reorder_count == 0, report
    # A survivor's shard is never silent while one of its records waits for as long as the dead
    # process's shards were (until the group noticed: a session timeout, seconds): a gap between
    # two publishes counts from the later record's commit if that came after the earlier
    # publish (the writer's own pauses are not the harvester's silence). The bound is half the
    # stall the dead process's shards show on the same machine in the same run, not a fixed
    # second: under CI's load a survivor once paused 1.03 s, which is no stall.
    first: dict[bytes, tuple[str, float]] = {}
    for key, value, at in publish_times(kafka_bootstrap, topic_name, len(writer.expected)):
        if value not in first or at < first[value][1]:
            first[value] = (key, at)
    times: dict[int, list[tuple[float, bytes]]] = defaultdict(list)
    for value, (key, at) in first.items():
        times[shard_of(key, SHARDS)].append((at, value))

    def longest_silence(shard: int, until: float) -> float:
        around = sorted((at, v) for at, v in times[shard] if max(killed_at - 2, steady_at) <= at <= until)
        assert around, f"shard {shard} published nothing around the kill"
        return max((b - max(a, writer.committed_at[v]) for (a, _), (b, v) in itertools.pairwise(around)), default=0.0)

    stall = min(longest_silence(shard, killed_at + 120) for shard in stalled)
    assert stall >= 1.0, f"the dead process's shards were silent only {stall:.2f}s: the test proves nothing"
    for shard in sorted(survivors):
        silent = longest_silence(shard, killed_at + 8)
        assert silent < stall / 2, f"shard {shard} (a survivor's) was silent {silent:.2f}s, the dead one's {stall:.2f}s"
    for shard in sorted(stalled):
        assert any(at > killed_at for at, _ in times[shard]), f"shard {shard} never resumed after the kill"


def test_random_kills_lose_and_reorder_nothing(
    dialect, database_url, table_name, topic_name, kafka_bootstrap, tmp_path, group_protocol
):
    live_databases(dialect)
    seed = int(os.environ.get("PYHARVEST_SOAK_SEED", random.randrange(1 << 30)))
    rnd = random.Random(seed)
    print(f"sharded chaos: seed {seed}")
    seconds = min(float(os.environ.get("PYHARVEST_SOAK_SECONDS", 20)), 60.0)
    create_outbox_table(database_url, table_name, shards=SHARDS)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    cfg = write_config(tmp_path, kafka_bootstrap, database_url, table_name, group_protocol)
    spawn = Spawner(cfg, tmp_path)
    reapers = [spawn() for _ in range(3)]
    writer = Writer(database_url, table_name, topic_name, keys=200, batch=20, pause=0.02).start()
    actions: list[str] = []
    try:
        wait_until(lambda: any(shards_of(r) for r in reapers), 90, "a first shard leader")
        actions += stop_at_random(reapers, spawn, rnd, seconds, pause=(3, 5))
        writer.stop()
        wait_until(lambda: outbox_count(database_url, table_name) == 0, 150, "the survivors to drain the outbox")
    finally:
        writer._stop.set()
        stop_all(reapers)
    report, _hidden = read_back(kafka_bootstrap, topic_name, writer.expected, timeout=90, nudge_missing=on_embedded_broker())
    print(f"sharded chaos: seed {seed}, actions {actions}, {len(writer.expected)} records, "
          f"{report.duplicate_count} duplicates")
    assert report.lost_count == 0 and report.reorder_count == 0, f"seed {seed}: {report}"
