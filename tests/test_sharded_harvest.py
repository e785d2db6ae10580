"""Sharded harvesting on real databases and the real Kafka protocol: two processes' worth of
harvesters share four shards; every record arrives in order per key, each shard is led by one
of them, and when one stops its shards move to the other without losing or reordering a key."""

from __future__ import annotations

import time
import uuid

import pytest

from pyharvest import Config, Limits, LeaderAcquired, ShardedHarvest
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.shards import shard_of
from tests.kafka_tools import create_topic, read_topic, values_per_key
from tests.test_harvest_e2e import collapse_one_off_duplicates, wait_empty, write_concurrently

pytestmark = pytest.mark.kafka

SHARDS = 4


def sharded_config(kafka_config, url: str, table: str, group: str) -> Config:
    return Config(
        base_kafka_config=dict(kafka_config),
        leader_group_id=group,
        data_source=url,
        outbox_table=table,
        shards=SHARDS,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
    )


def wait_for(what: str, cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_two_harvesters_share_the_shards_and_one_takes_over(
    kafka_config, kafka_bootstrap, database_url, table_name, topic_name
) -> None:
    create_outbox_table(database_url, table_name, shards=SHARDS)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    group = f"sharded-{uuid.uuid4().hex[:8]}"
    events: list[tuple[str, object]] = []
    first = ShardedHarvest(sharded_config(kafka_config, database_url, table_name, group))
    second = ShardedHarvest(sharded_config(kafka_config, database_url, table_name, group))
    first.set_event_handler(lambda e: events.append(("first", e)))
    second.set_event_handler(lambda e: events.append(("second", e)))
    first.start()
    second.start()
    try:
        wait_for("both harvesters to lead some shards",
                 lambda: first.leading_shards and second.leading_shards
                 and sorted(first.leading_shards + second.leading_shards) == list(range(SHARDS)))
        assert not set(first.leading_shards) & set(second.leading_shards)
        expected = write_concurrently(database_url, table_name, topic_name, writers=2, per_writer=400, keys=41)
        wait_empty(database_url, table_name)
        # One stops: its shards move to the other, which harvests what is written next.
        second.stop()
        assert second.join(60)
        wait_for("the first to lead every shard", lambda: first.leading_shards == list(range(SHARDS)))
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
