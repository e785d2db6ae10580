"""``delivery: exactly-once`` under fire: three ``reaper`` processes share six shards while a
writer stashes over many keys; processes are killed (SIGKILL) and stopped (SIGTERM) at random
moments, and one shard leader is frozen (SIGSTOP) past its heartbeat deadline, so that its
shards get new leaders, then thawed while it still believes it leads. A ``read_committed``
reader must find every record exactly once, in order per key: 0 lost, 0 reordered, 0
duplicates."""

from __future__ import annotations

import os
import random
import signal

import pytest

from benchmarks.topic_check import read_back
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.fixtures.kafka import on_embedded_broker
from tests.helpers.outbox import Writer, outbox_count
from tests.helpers.reapers import SHARDS, Spawner, live_databases, shards_of, stop_all, stop_at_random, write_config
from tests.helpers.topics import create_topic
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(360)]


def test_kills_stops_and_a_frozen_leader_publish_every_record_exactly_once(
    dialect, database_url, table_name, topic_name, kafka_bootstrap, tmp_path
):
    live_databases(dialect)
    if on_embedded_broker():
        pytest.skip("the embedded broker has no transactions")
    seed = int(os.environ.get("PYHARVEST_SOAK_SEED", random.randrange(1 << 30)))
    rnd = random.Random(seed)
    seconds = min(float(os.environ.get("PYHARVEST_SOAK_SECONDS", 20)), 60.0)
    create_outbox_table(database_url, table_name, shards=SHARDS)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    cfg = write_config(tmp_path, kafka_bootstrap, database_url, table_name, delivery="exactly-once")
    spawn = Spawner(cfg, tmp_path)
    reapers = [spawn() for _ in range(3)]
    writer = Writer(database_url, table_name, topic_name, keys=200, batch=20, pause=0.02).start()
    actions: list[str] = []
    try:
        wait_until(lambda: sum(1 for r in reapers if shards_of(r)) >= 2, 90, "shard leaders in two processes")
        # First the frozen leader: stopped for three heartbeat timeouts (its session expires
        # and its shards move), then thawed. Its open transaction was aborted by its shards'
        # new leaders; what it tries next must be refused by Kafka, not published.
        frozen = rnd.choice([r for r in reapers if shards_of(r)])
        frozen.signal(signal.SIGSTOP)
        actions.append(f"SIGSTOP {sorted(shards_of(frozen))}")
        wait_until(
            lambda: set().union(*(shards_of(r) for r in reapers if r is not frozen)) == set(range(SHARDS)),
            60,
            "the frozen leader's shards to move",
        )
        frozen.signal(signal.SIGCONT)
        actions += stop_at_random(reapers, spawn, rnd, seconds, pause=(2, 4))
        writer.stop()
        wait_until(lambda: outbox_count(database_url, table_name) == 0, 150, "the survivors to drain the outbox")
        died = [r for r in reapers if r.proc.poll() is not None]
        assert not died, f"a reaper exited by itself: {died[0].log()[-3000:]}"
    finally:
        writer._stop.set()
        stop_all(reapers)
    report, _hidden = read_back(kafka_bootstrap, topic_name, writer.expected, timeout=90, nudge_missing=False)
    print(
        f"exactly-once chaos: seed {seed}, actions {actions}, {len(writer.expected)} records, "
        f"{report.lost_count} lost, {report.reorder_count} reordered, {report.duplicate_count} duplicates"
    )
    assert report.lost_count == 0 and report.reorder_count == 0 and report.duplicate_count == 0, (
        f"seed {seed}: {report}"
    )
