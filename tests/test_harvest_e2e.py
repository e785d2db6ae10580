"""End to end on real databases and a real broker: concurrent writers stash thousands of
records over many keys while a harvester runs; every record arrives, in order per key, and the
outbox ends empty."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from pyharvest import Config, Harvest, Limits, OutboxRecord, stasher
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.outbox import collapse_one_off_duplicates, wait_empty, write_concurrently
from tests.helpers.topics import create_topic, read_topic, values_per_key

pytestmark = pytest.mark.kafka



def harvest_config(kafka_config, url: str, table: str, **limits) -> Config:
    return Config(
        base_kafka_config=dict(kafka_config),
        leader_group_id=f"e2e-{uuid.uuid4().hex[:8]}",
        data_source=url,
        outbox_table=table,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05, **limits),
    )



# The suite's broker (Apache Kafka by default), and the embedded one: the zero-setup default
# (`reaper demo`, `reaper broker`) stays proven end to end on each live database.
@pytest.mark.parametrize("broker", ["kafka_bootstrap", "embedded_bootstrap"])
def test_concurrent_writers_every_record_once_in_order(broker, request, database_url, table_name, topic_name):
    kafka_bootstrap = request.getfixturevalue(broker)
    create_outbox_table(database_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    harvest = Harvest(harvest_config({"bootstrap.servers": kafka_bootstrap}, database_url, table_name))
    harvest.start()
    try:
        expected = write_concurrently(database_url, table_name, topic_name, writers=4, per_writer=750, keys=97)
        wait_empty(database_url, table_name)
    finally:
        harvest.stop()
        assert harvest.join(30)
    total = sum(len(v) for v in expected.values())
    got = read_topic(kafka_bootstrap, topic_name, expect=total)
    per_key = values_per_key(got)
    assert set(per_key) == set(expected)
    for key, values in expected.items():
        assert collapse_one_off_duplicates(per_key[key]) == values, f"order or loss for {key}"
    assert all(h and h[0][0] == "writer" and h[-1][0] == "pyharvest-record-id" for _p, _k, _v, h in got)
    assert harvest.metrics.records_purged >= total


def test_tombstones_headers_and_binary_values_arrive_exactly(kafka_config, kafka_bootstrap, database_url, table_name, topic_name):
    create_outbox_table(database_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=1)
    engine = sa.create_engine(database_url)
    records = [
        OutboxRecord(topic_name, "a", b"\x00\xff\xfe binary"),
        OutboxRecord(topic_name, "a", None),
        OutboxRecord(topic_name, "ключ", "unicode välue", headers=[("h1", "v1"), ("h2", b"\x01\x02"), ("h1", "again")]),
        OutboxRecord(topic_name, "b", b""),
    ]
    with engine.begin() as conn:
        for r in records:
            stasher.stash(conn, r, table=table_name)
    engine.dispose()
    config = harvest_config(kafka_config, database_url, table_name)
    harvest_group = config.leader_group_id
    with Harvest(config):
        wait_empty(database_url, table_name, 60)
    got = read_topic(kafka_bootstrap, topic_name, expect=4)
    # Order holds per key; records of different keys may interleave either way.
    assert dict(values_per_key(got)) == {
        "a": [b"\x00\xff\xfe binary", None],
        "ключ": ["unicode välue".encode()],
        "b": [b""],
    }
    headers = {k: h for _p, k, _v, h in got}
    user = {k: [x for x in h if not x[0].startswith("pyharvest-")] for k, h in headers.items()}
    assert user["ключ"] == [("h1", b"v1"), ("h2", b"\x01\x02"), ("h1", b"again")]
    assert user["b"] == []
    # Identity headers, stable across re-publication, let consumers drop copies.
    stamped = dict(headers["b"])
    assert stamped["pyharvest-outbox"] == f"{harvest_group}/{table_name}".encode()
    assert int(stamped["pyharvest-record-id"]) > 0
