"""What the stasher refuses before writing anything: a key longer than the table's key column,
a record over ``max_record_bytes``, and a table that does not exist (on every live database)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from pyharvest import stasher
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.outbox.records import InvalidRecordError, OutboxRecord
from pyharvest.errors import KeyTooLongError, OutboxTableMissingError, RecordTooLargeError
from pyharvest.plugins.api import KEY_LENGTH
from pyharvest.stasher import Stasher
from pyharvest.stasher.errors import DEFAULT_MAX_RECORD_BYTES, PRODUCER_MESSAGE_MAX_BYTES
from tests.helpers.waiting import wait_until


@pytest.fixture
def outbox(database_url: str, table_name: str):  # type: ignore[no-untyped-def]
    create_outbox_table(database_url, table_name)
    engine = sa.create_engine(database_url)
    yield engine, table_name
    engine.dispose()


def rows(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


def every_way(engine: sa.Engine, table: str, good: OutboxRecord, bad: OutboxRecord, **options: object):
    """Stash ``bad`` (after ``good``) every way there is; yield each attempt's error."""
    out = Stasher(table, **options)  # type: ignore[arg-type]
    ways = [
        lambda tx: out.stash(tx, bad),
        lambda tx: out.prepare(tx).stash(bad),
        lambda tx: out.stash_many(tx, [good] * 20 + [bad]),  # a COPY-sized batch on PostgreSQL
        lambda tx: out.batch(tx, flush_every=2).stash(bad),
    ]
    if not options:
        ways.append(lambda tx: stasher.stash(tx, bad, table=table))
    for way in ways:
        with pytest.raises(InvalidRecordError) as refused, engine.begin() as tx:
            way(tx)
        yield refused.value


def test_a_key_longer_than_the_key_column_is_refused_and_nothing_is_written(outbox) -> None:  # type: ignore[no-untyped-def]
    engine, table = outbox
    longest = OutboxRecord("t", "k" * KEY_LENGTH, b"v")
    too_long = OutboxRecord("t", "é" * (KEY_LENGTH + 1), b"v")  # characters, not bytes
    for error in every_way(engine, table, longest, too_long):
        assert isinstance(error, KeyTooLongError)
        assert f"{KEY_LENGTH + 1} characters" in str(error) and f"at most {KEY_LENGTH}" in str(error)
        assert table in str(error)
    assert rows(engine, table) == 0
    with engine.begin() as tx:
        Stasher(table).stash(tx, longest)
        Stasher(table).stash_many(tx, [longest] * 20)
    assert rows(engine, table) == 21


def test_a_record_over_max_record_bytes_is_refused_and_nothing_is_written(outbox) -> None:  # type: ignore[no-untyped-def]
    engine, table = outbox
    small = OutboxRecord("t", "k", b"v")
    huge = OutboxRecord("t", "k", b"x" * (5 * 1024 * 1024))
    for error in every_way(engine, table, small, huge):
        assert isinstance(error, RecordTooLargeError)
        # Which settings to raise, and where: the stasher's, the reaper's producer's, the topic's.
        assert f"max_record_bytes={DEFAULT_MAX_RECORD_BYTES}" in str(error)
        assert "message.max.bytes in the reaper's producerKafkaConfig" in str(error)
        assert "max.message.bytes" in str(error)
    # Per stasher; the headers count (name and value) as Kafka counts them.
    header_heavy = OutboxRecord("t", "k", b"12345", [("name", "é" * 50)])  # 1 + 5 + 4 + 100 bytes
    for error in every_way(engine, table, small, header_heavy, max_record_bytes=109):
        assert isinstance(error, RecordTooLargeError) and "110 bytes" in str(error)
    assert rows(engine, table) == 0
    with engine.begin() as tx:
        Stasher(table, max_record_bytes=110).stash(tx, header_heavy)
        Stasher(table, max_record_bytes=None).stash(tx, OutboxRecord("t", "k", b"x" * (PRODUCER_MESSAGE_MAX_BYTES + 1)))
    assert rows(engine, table) == 2


def test_a_missing_table_says_how_to_create_it(database_url: str, table_name: str) -> None:
    engine = sa.create_engine(database_url)
    try:
        with pytest.raises(OutboxTableMissingError, match=rf"{table_name} does not exist.*reaper init-db"), \
                engine.begin() as tx:
            stasher.stash(tx, OutboxRecord("t", "k", b"v"), table=table_name)
        create_outbox_table(database_url, table_name)  # not remembered as missing
        with engine.begin() as tx:
            stasher.stash(tx, OutboxRecord("t", "k", b"v"), table=table_name)
        assert rows(engine, table_name) == 1
    finally:
        engine.dispose()


def test_max_record_bytes_is_checked() -> None:
    for bad in (0, -1, 1.5, "1MB", True):
        with pytest.raises(ValueError, match="max_record_bytes"):
            Stasher("outbox", max_record_bytes=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "complaint"),
    [("order\x00-42", "NUL"), ("order-\udcff", "not valid Unicode")],
    ids=["nul", "lone-surrogate"],
)
def test_a_key_no_database_can_store_is_refused_before_anything_is_written(outbox, key: str, complaint: str) -> None:  # type: ignore[no-untyped-def]
    engine, table = outbox
    good = OutboxRecord("t", "k", b"v")
    for error in every_way(engine, table, good, OutboxRecord("t", key, b"v")):
        assert type(error) is InvalidRecordError, error  # not the driver's DataError or UnicodeEncodeError
        assert "record key" in str(error) and complaint in str(error)
    assert rows(engine, table) == 0


@pytest.mark.kafka
def test_the_largest_record_the_stasher_accepts_by_default_is_published_by_default(  # type: ignore[no-untyped-def]
    outbox, kafka_config, kafka_bootstrap, topic_name
) -> None:
    """The stasher's default limit and the harvester's producer's default agree: what one
    accepts, the other publishes (it used to be stashed, then retried forever)."""
    import uuid

    from pyharvest import Config, Harvest, Limits
    from pyharvest.stasher.limits import record_bytes
    from tests.helpers.topics import create_topic, read_topic

    engine, table = outbox
    create_topic(kafka_bootstrap, topic_name, partitions=1)
    headers = [("traceparent", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")]
    base = record_bytes(OutboxRecord(topic_name, "big", b"", headers))
    largest = OutboxRecord(topic_name, "big", b"x" * (DEFAULT_MAX_RECORD_BYTES - base), headers)
    assert record_bytes(largest) == DEFAULT_MAX_RECORD_BYTES
    with engine.begin() as tx:
        stasher.stash(tx, largest, table=table)
        stasher.stash(tx, OutboxRecord(topic_name, "big", b"after"), table=table)
    config = Config(
        base_kafka_config=dict(kafka_config), leader_group_id=f"limits-{uuid.uuid4().hex[:8]}",
        data_source=str(engine.url.render_as_string(hide_password=False)), outbox_table=table,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
    )
    with Harvest(config) as harvest:
        wait_until(lambda: not rows(engine, table), 60, "the largest record to be published", interval=0.2)
    assert harvest.metrics.delivery_errors == {}
    values = [v for _p, _k, v, _h in read_topic(kafka_bootstrap, topic_name, expect=2)]
    assert values[0] == largest.value and values[-1] == b"after"
