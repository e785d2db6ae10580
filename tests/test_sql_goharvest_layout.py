"""goharvest's own PostgreSQL table, harvested unchanged."""

from __future__ import annotations

import logging
import uuid

import pytest
import sqlalchemy as sa

from pyharvest.bindings.sql import GOHARVEST, MalformedRowError, create_binding, create_outbox_table, schema_ddl
from pyharvest.core.outbox.records import InvalidRecordError, OutboxRecord
from pyharvest.stasher import Stasher

# The DDL from goharvest's README, verbatim.
GOHARVEST_DDL = """
CREATE TABLE IF NOT EXISTS {table} (
  id                  BIGSERIAL PRIMARY KEY,
  create_time         TIMESTAMP WITH TIME ZONE NOT NULL,
  kafka_topic         VARCHAR(249) NOT NULL,
  kafka_key           VARCHAR(100) NOT NULL,  -- pick your own maximum key size
  kafka_value         VARCHAR(10000),         -- pick your own maximum value size
  kafka_header_keys   TEXT[] NOT NULL,
  kafka_header_values TEXT[] NOT NULL,
  leader_id           UUID
)
"""


@pytest.fixture
def pg(dialect: str, database_url: str, table_name: str) -> tuple[str, str, sa.Engine]:
    if dialect != "postgresql":
        pytest.skip("the goharvest layout is PostgreSQL's")
    engine = sa.create_engine(database_url)
    with engine.begin() as c:
        c.exec_driver_sql(GOHARVEST_DDL.format(table=table_name))
    yield database_url, table_name, engine  # type: ignore[misc]
    engine.dispose()


def test_goharvest_table_is_recognised_and_round_trips(pg: tuple[str, str, sa.Engine]) -> None:
    url, table, engine = pg
    binding = create_binding(url, table)
    try:
        assert binding.outbox.layout == GOHARVEST
        with engine.begin() as tx:
            Stasher(table).stash_many(
                tx,
                [
                    OutboxRecord("t", "k1", "text value", (("a", "1"), ("b", b"utf8 bytes"))),
                    OutboxRecord("t", "k2", None),
                ],
            )
        leader = str(uuid.uuid4())
        got = binding.mark(leader, 10)
        assert [(r.key, r.value, tuple(r.headers), r.leader_id) for r in got] == [
            ("k1", b"text value", (("a", "1"), ("b", "utf8 bytes")), leader),
            ("k2", None, (), leader),
        ]
        assert binding.mark(leader, 10) == []
        assert binding.reset([got[0].id]) == 1  # type: ignore[list-item]
        assert binding.purge([r.id for r in got]) == 2  # type: ignore[misc]
    finally:
        binding.dispose()


def test_a_large_goharvest_batch_round_trips(pg: tuple[str, str, sa.Engine]) -> None:
    # Large enough for COPY: header arrays and text values must land as the INSERT stores them.
    url, table, engine = pg
    records = [
        OutboxRecord("t", f"k{i}", None if i % 5 == 0 else f"väl\t{i}\n", (("a", str(i)), ("b,{}", b'q"uote\\')))
        for i in range(40)
    ]
    with engine.begin() as tx:
        Stasher(table).stash_many(tx, records)
    binding = create_binding(url, table)
    try:
        got = binding.mark(str(uuid.uuid4()), 100)
        # The goharvest layout stores text: values come back as UTF-8 bytes, header values as str.
        assert [(r.key, r.value, tuple(r.headers)) for r in got] == [
            (f"k{i}", None if i % 5 == 0 else f"väl\t{i}\n".encode(), (("a", str(i)), ("b,{}", 'q"uote\\')))
            for i in range(40)
        ]
    finally:
        binding.dispose()


def test_a_row_written_by_goharvest_style_sql_is_harvested(pg: tuple[str, str, sa.Engine]) -> None:
    url, table, engine = pg
    with engine.begin() as c:
        c.exec_driver_sql(
            f"INSERT INTO {table} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, "
            "kafka_header_values) VALUES (now(), 't', 'k', 'v', ARRAY['h'], ARRAY['x'])"
        )
    binding = create_binding(url, table)
    try:
        (rec,) = binding.mark(str(uuid.uuid4()), 5)
        assert rec.value == b"v" and tuple(rec.headers) == (("h", "x"),) and rec.create_time is not None
    finally:
        binding.dispose()


def test_unequal_header_arrays_are_refused_loudly_without_stalling(
    pg: tuple[str, str, sa.Engine], caplog: pytest.LogCaptureFixture
) -> None:
    url, table, engine = pg
    with engine.begin() as c:
        for key, keys, values in (("a", "'{}'", "'{}'"), ("bad", "ARRAY['x','y']", "ARRAY['1']"), ("c", "'{}'", "'{}'")):
            c.exec_driver_sql(
                f"INSERT INTO {table} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, "
                f"kafka_header_values) VALUES (now(), 't', '{key}', 'v', {keys}, {values})"
            )
    refused: list[MalformedRowError] = []
    binding = create_binding(url, table, on_malformed=refused.append)
    try:
        leader = str(uuid.uuid4())
        with caplog.at_level(logging.ERROR, logger="pyharvest.bindings.sql"):
            assert [r.key for r in binding.mark(leader, 10)] == ["a", "c"]
        assert len(refused) == 1 and "kafka_header_keys has 2 entries" in str(refused[0])
        assert any("malformed outbox row" in r.getMessage() for r in caplog.records)
        assert binding.mark(leader, 10) == []  # it stays marked: not returned again by this leader
        assert [r.key for r in binding.mark(str(uuid.uuid4()), 10)] == ["a", "c"]  # a new leader logs it again
        assert len(refused) == 2
    finally:
        binding.dispose()


def test_layout_can_be_forced_and_is_checked(pg: tuple[str, str, sa.Engine]) -> None:
    url, table, _ = pg
    create_binding(url, table, layout=GOHARVEST).dispose()
    with pytest.raises(Exception, match="kafka_headers"):
        create_binding(url, table, layout="native")


def test_goharvest_stasher_refuses_what_text_cannot_hold(pg: tuple[str, str, sa.Engine]) -> None:
    _, table, engine = pg
    with engine.begin() as tx:
        with pytest.raises(InvalidRecordError, match="not UTF-8"):
            Stasher(table).stash(tx, OutboxRecord("t", "k", b"\xff\xfe"))
        with pytest.raises(InvalidRecordError, match="NUL"):
            Stasher(table, layout=GOHARVEST).stash(tx, OutboxRecord("t", "k", "a\x00b"))


def test_create_and_print_the_goharvest_layout(dialect: str, database_url: str, table_name: str) -> None:
    if dialect != "postgresql":
        pytest.skip("PostgreSQL only")
    assert "kafka_header_keys   TEXT[] NOT NULL" in schema_ddl("postgresql", "outbox", layout=GOHARVEST)
    create_outbox_table(database_url, table_name, layout=GOHARVEST)
    binding = create_binding(database_url, table_name)
    assert binding.outbox.layout == GOHARVEST
    binding.dispose()


def test_other_dialects_refuse_the_goharvest_layout() -> None:
    with pytest.raises(Exception, match="does not support the 'goharvest' table layout"):
        schema_ddl("sqlite", "outbox", layout=GOHARVEST)
