"""Sharded harvesting on real databases and the real Kafka protocol: two processes' worth of
harvesters share four shards; every record arrives in order per key, each shard is led by one
of them, and when one stops its shards move to the other without losing or reordering a key."""

from __future__ import annotations

import uuid

import pytest

from pyharvest import Config, Harvest, Limits
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.outbox.keys import shard_of
from pyharvest.events import LeaderAcquired
from tests.helpers.outbox import collapse_one_off_duplicates, wait_empty, write_concurrently
from tests.helpers.topics import create_topic, read_topic, values_per_key
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.kafka

SHARDS = 4


def sharded_config(kafka_config, url: str, table: str, group: str, group_protocol: str = "classic") -> Config:
    return Config(
        base_kafka_config=dict(kafka_config),
        leader_group_id=group,
        data_source=url,
        outbox_table=table,
        shards=SHARDS,
        group_protocol=group_protocol,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
    )


def test_two_harvesters_share_the_shards_and_one_takes_over(
    kafka_config, kafka_bootstrap, database_url, table_name, topic_name, group_protocol
) -> None:
    create_outbox_table(database_url, table_name, shards=SHARDS)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    group = f"sharded-{uuid.uuid4().hex[:8]}"
    events: list[tuple[str, object]] = []
    first = Harvest(sharded_config(kafka_config, database_url, table_name, group, group_protocol))
    second = Harvest(sharded_config(kafka_config, database_url, table_name, group, group_protocol))
    first.set_event_handler(lambda e: events.append(("first", e)))
    second.set_event_handler(lambda e: events.append(("second", e)))
    first.start()
    second.start()
    try:
        wait_until(lambda: first.leading_shards and second.leading_shards
                   and sorted(first.leading_shards + second.leading_shards) == list(range(SHARDS)),
                   60, "both harvesters to lead some shards")
        assert not set(first.leading_shards) & set(second.leading_shards)
        expected = write_concurrently(database_url, table_name, topic_name, writers=2, per_writer=400, keys=41)
        wait_empty(database_url, table_name)
        # One stops: its shards move to the other, which harvests what is written next.
        second.stop()
        assert second.join(60)
        wait_until(lambda: first.leading_shards == list(range(SHARDS)), 60, "the first to lead every shard")
        more = write_concurrently(database_url, table_name, topic_name, writers=2, per_writer=100, keys=41)
        wait_empty(database_url, table_name)
    finally:
        first.stop()
        second.stop()
        assert first.join(60) and second.join(60)
    for key, values in more.items():
        expected.setdefault(key, []).extend(values)
    total = sum(len(v) for v in expected.values())
    per_key = values_per_key(read_topic(kafka_bootstrap, topic_name, expect=total))
    assert set(per_key) == set(expected)
    for key, values in expected.items():
        assert collapse_one_off_duplicates(per_key[key]) == values, f"order or loss for {key}"
    acquired = [(who, e.shard) for who, e in events if isinstance(e, LeaderAcquired)]
    assert {s for _who, s in acquired} == set(range(SHARDS))  # every event names its shard
    assert {who for who, _s in acquired} == {"first", "second"}
    # Each key was harvested by its own shard's engine only.
    for shard, engine in first.engines.items():
        assert engine.shard == shard
    assert {shard_of(k, SHARDS) for k in expected} == set(range(SHARDS))


def published_by_each(harvest: Harvest, records: int) -> bool:
    """Whether every shard this process leads has published ``records`` records."""
    engines = harvest.engines
    return all(engines[s].metrics.records_published >= records for s in harvest.leading_shards)


def test_changing_the_number_of_shards_keeps_order(kafka_config, kafka_bootstrap, database_url, table_name, topic_name):
    """The documented procedure: stop every harvester, prepare the table and the leader topic
    for the new number, start again. Keys move to other shards; their order does not change."""
    from pyharvest.core.errors import BindingError, TopicError
    from tests.helpers.outbox import Writer

    create_outbox_table(database_url, table_name, shards=2)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    group = f"resize-{uuid.uuid4().hex[:8]}"
    writer = Writer(database_url, table_name, topic_name, keys=60, batch=20, pause=0.01).start()
    try:
        two = sharded_config(kafka_config, database_url, table_name, group)
        two.shards = 2
        with Harvest(two) as harvest:
            wait_until(lambda: harvest.leading_shards == [0, 1], 60, "two shards led")
            wait_until(lambda: published_by_each(harvest, 100), 60, "100 records published by each of two shards")
        # 1. every harvester is stopped (mid-stream: the writer goes on)
        written = len(writer.expected)
        wait_until(lambda: len(writer.expected) >= written + 200, 60, "the writer to go on")
        three = sharded_config(kafka_config, database_url, table_name, group)
        three.shards = 3
        # Started before either is changed: both are reported at once.
        with pytest.raises(BindingError, match=r"two things keep shards: 3 from starting: 1\) .*no index for 3 shards"
                                               r".*2\) leader topic .* has 2 partition"):
            Harvest(three).start()
        # 2. the table gets the new shard index; 3. a leader topic of the new size
        create_outbox_table(database_url, table_name, shards=3)
        with pytest.raises(TopicError, match="has 2 partition.*shards is 3.*new leaderTopic"):
            Harvest(three).start()
        three.leader_topic = f"{group}.neli.3"
        # 4. start with the new number
        with Harvest(three) as harvest:
            wait_until(lambda: harvest.leading_shards == [0, 1, 2], 60, "three shards led")
            wait_until(lambda: published_by_each(harvest, 100), 60, "100 records published by each of three shards")
            writer.stop()
            wait_empty(database_url, table_name)
    finally:
        writer._stop.set()
    from benchmarks.topic_check import read_back
    from tests.helpers.fixtures.kafka import on_embedded_broker

    report, _hidden = read_back(kafka_bootstrap, topic_name, writer.expected, timeout=90, nudge_missing=on_embedded_broker())
    assert report.lost_count == 0 and report.reorder_count == 0, report


def test_metrics_and_probes_per_shard(kafka_config, kafka_bootstrap, database_url, table_name, topic_name) -> None:
    pytest.importorskip("prometheus_client")
    from pyharvest.bindings.ops import start_ops_server
    from pyharvest.core.outbox.records import OutboxRecord
    from tests.helpers.ops import get, scrape

    create_outbox_table(database_url, table_name, shards=2)
    create_topic(kafka_bootstrap, topic_name, partitions=1)
    cfg = sharded_config(kafka_config, database_url, table_name, f"metrics-{uuid.uuid4().hex[:8]}")
    cfg.shards = 2
    harvest = Harvest(cfg)
    ops = start_ops_server(harvest, {"address": "127.0.0.1", "port": 0, "backlogInterval": "50ms"})
    assert ops is not None
    try:
        assert get(ops.url + "/readyz")[0] == 503  # not started yet
        harvest.start()
        wait_until(lambda: harvest.leading_shards == [0, 1], 60, "both shards led")
        import sqlalchemy as sa

        from pyharvest.stasher import Stasher

        engine = sa.create_engine(database_url)
        with engine.begin() as tx:
            Stasher(table_name).stash_many(tx, [OutboxRecord(topic_name, f"k{i}", b"v") for i in range(40)])
        engine.dispose()
        wait_empty(database_url, table_name)
        wait_until(lambda: sum(v for k, v in scrape(ops).items() if k.startswith("pyharvest_records_purged_total")) >= 40,
                   60, "the counters")
        samples = scrape(ops)
        assert samples['pyharvest_leader{shard="0"}'] == 1.0 and samples['pyharvest_leader{shard="1"}'] == 1.0
        purged = [samples[f'pyharvest_records_purged_total{{shard="{p}"}}'] for p in (0, 1)]
        assert sum(purged) >= 40 and all(purged)  # 40 keys land in both shards
        assert get(ops.url + "/readyz")[0] == 200
        # Per-shard publish latency; the status page's roles per shard, and the whole table's age.
        assert sum(samples[f'pyharvest_publish_latency_seconds_count{{shard="{p}"}}'] for p in (0, 1)) >= 40
        import json

        status = json.loads(get(ops.url + "/status")[1])
        assert [(s["shard"], s["role"]) for s in status["shards"]] == [(0, "leader"), (1, "leader")]
        wait_until(lambda: json.loads(get(ops.url + "/status")[1])["oldest_record_age_seconds"] == 0, 30,
                   "the age of an empty outbox")
    finally:
        harvest.stop()
        harvest.join(60)
        ops.stop()
