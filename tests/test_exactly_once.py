"""``delivery: exactly-once`` on Apache Kafka and live databases: what a ``read_committed``
consumer sees is every outbox record once, in order per key, whatever happens to the leaders.

The takeover's logic (progress read, purge of what already committed) is also tested in
isolation in tests/test_transactions.py; the chaos test with processes killed, stopped and
paused is tests/test_exactly_once_chaos.py.
"""

from __future__ import annotations

import uuid

import pytest

from pyharvest import Config, Harvest, Limits
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.errors import HarvestError
from tests.fixtures.kafka import on_embedded_broker
from tests.kafka_tools import create_topic, read_topic, values_per_key
from tests.test_harvest_e2e import wait_empty, write_concurrently
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.db]


def eos_config(bootstrap: str, url: str, table: str, **kw) -> Config:
    return Config(
        base_kafka_config={"bootstrap.servers": bootstrap},
        leader_group_id=f"eos-{uuid.uuid4().hex[:8]}",
        data_source=url,
        outbox_table=table,
        delivery="exactly-once",
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
        **kw,
    )


@pytest.fixture
def apache_bootstrap(kafka_bootstrap: str) -> str:
    if on_embedded_broker():
        pytest.skip("the embedded broker has no transactions (tested: it is refused with a clear error)")
    return kafka_bootstrap


@pytest.mark.parametrize("shards", [1, 3])
def test_every_record_exactly_once_in_order(shards, apache_bootstrap, database_url, table_name, topic_name):
    create_outbox_table(database_url, table_name, shards=shards)
    create_topic(apache_bootstrap, topic_name, partitions=4)
    harvest = Harvest(eos_config(apache_bootstrap, database_url, table_name, shards=shards))
    harvest.start()
    try:
        expected = write_concurrently(database_url, table_name, topic_name, writers=4, per_writer=500, keys=53)
        wait_empty(database_url, table_name)
    finally:
        harvest.stop()
        assert harvest.join(30)
    total = sum(len(v) for v in expected.values())
    got = read_topic(apache_bootstrap, topic_name, expect=total)
    per_key = values_per_key(got)
    assert len(got) == total, f"{len(got) - total} duplicates"
    for key, values in expected.items():
        assert per_key[key] == values, f"order, loss or a duplicate for {key}"
    engines = harvest.engines.values()
    assert sum(e.metrics.transactions_committed for e in engines) >= shards
    assert sum(e.metrics.records_purged for e in engines) == total


def test_a_new_leader_purges_what_the_last_transaction_committed(
    apache_bootstrap, database_url, table_name, topic_name
):
    """The leader dies between Kafka's commit and its purge: the rows are still in the table,
    and the next leader must purge them from the progress record, not publish them again."""
    create_outbox_table(database_url, table_name)
    create_topic(apache_bootstrap, topic_name, partitions=1)
    config = eos_config(apache_bootstrap, database_url, table_name)
    expected = write_concurrently(database_url, table_name, topic_name, writers=1, per_writer=200, keys=7)
    first = Harvest(config)
    engine = first.runner
    purges: list[int] = []

    def dies_before_purging(ids):
        purges.append(len(ids))
        raise ConnectionError("the leader died before its purge")

    first.start()
    try:
        wait_until(lambda: engine.binding is not None, 30, "the first harvester opened its binding")
        binding = engine.binding
        binding.purge = dies_before_purging  # type: ignore[method-assign]
        wait_until(lambda: engine.metrics.transactions_committed >= 1, 60, "a transaction committed")
    finally:
        first.stop()
        assert first.join(30)
    assert purges, "the committed transaction's purge was attempted"
    second = Harvest(config)
    with second:
        wait_empty(database_url, table_name)
    total = sum(len(v) for v in expected.values())
    got = read_topic(apache_bootstrap, topic_name, expect=total)
    per_key = values_per_key(got)
    assert len(got) == total, f"{len(got) - total} duplicates"
    for key, values in expected.items():
        assert per_key[key] == values


def test_the_embedded_broker_is_refused_with_a_clear_error(embedded_bootstrap, database_url, table_name):
    create_outbox_table(database_url, table_name)
    harvest = Harvest(eos_config(embedded_bootstrap, database_url, table_name))
    with pytest.raises(HarvestError, match="exactly-once needs a Kafka cluster with transactions"):
        harvest.start()
