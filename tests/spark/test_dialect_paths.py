"""The Spark binding's database work on every database, without a Spark session: staging and
committing rows (upserts through the dialect's hook), and the exactly-once sink's identities
(PostgreSQL's own way and the generic look-up + bulk insert). What differs between databases
comes from the dialect plugin; these tests run the same assertions on each."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
import pytest
import sqlalchemy as sa
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyharvest.bindings.spark import ExactlyOnceSink
from pyharvest.bindings.spark.outbox_writer import OutboxDataSource
from pyharvest.bindings.spark.sink import IDENTITY_COLUMN, insert_rows
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.errors import ConfigError
from pyharvest.core.outbox.keys import key_hash

pytestmark = pytest.mark.spark

ACCOUNTS = StructType(
    [StructField("id", LongType()), StructField("owner", StringType()), StructField("balance", LongType())]
)


def _rows(url: str, sql: str) -> list[tuple]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(sa.text(sql))]
    finally:
        engine.dispose()


def _tables(url: str, prefix: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        return sorted(t for t in sa.inspect(engine).get_table_names() if t.lower().startswith(prefix.lower()))
    finally:
        engine.dispose()


@pytest.fixture
def accounts(database_url: str, table_name: str) -> tuple[str, str, str]:
    """An outbox and an accounts table (ids 0-9, balance 0) sharing the test's table prefix."""
    outbox, target = f"{table_name}_outbox", f"{table_name}_acc"
    create_outbox_table(database_url, outbox)
    engine = sa.create_engine(database_url)
    t = sa.Table(
        target, sa.MetaData(),
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("owner", sa.String(50), nullable=False),
        sa.Column("balance", sa.BigInteger, nullable=False),
    )
    with engine.begin() as c:
        t.create(c)
        c.execute(sa.insert(t), [{"id": i, "owner": "old", "balance": 0} for i in range(10)])
    engine.dispose()
    return database_url, outbox, target  # table_name's teardown drops every table of the prefix


def _batch(ids: list[int], owner: str) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict(
        {"id": ids, "owner": [f"{owner}{i}" for i in ids], "balance": [i * 10 for i in ids]},
        schema=pa.schema([("id", pa.int64()), ("owner", pa.string()), ("balance", pa.int64())]),
    )


def test_rows_mode_upserts_and_the_last_row_of_a_key_wins(accounts: tuple[str, str, str]) -> None:
    url, outbox, target = accounts
    options = {"url": url, "table": outbox, "target_table": target, "target_key_columns": "id",
               "event_topic": "account-updated", "event_key_column": "owner"}
    writer = OutboxDataSource(options).writer(ACCOUNTS, False)
    writer.stage(0, 10, _batch([1, 2, 3], "zombie-"))  # a failed attempt: never moved
    winners = [
        # Key 5 twice in partition 0: its second row wins; key 2 in both partitions: partition 1's.
        writer.stage(0, 11, _batch([2, 5, 5, 20], "p0-")),
        writer.stage(1, 12, _batch([2, 21, 5], "p1-")),
    ]
    writer.commit(winners)
    got = {i: (o, b) for i, o, b in _rows(url, f"SELECT id, owner, balance FROM {target}")}
    assert len(got) == 12  # 10 old + 20 and 21
    assert got[2] == ("p1-2", 20) and got[5] == ("p1-5", 50)
    assert got[20] == ("p0-20", 200) and got[21] == ("p1-21", 210)
    assert got[1] == ("old", 0) and got[3] == ("old", 0)  # the zombie attempt's rows stayed staged
    keys = sorted(k for (k,) in _rows(url, f"SELECT kafka_key FROM {outbox}"))
    assert keys == sorted(["p0-2", "p0-5", "p0-5", "p0-20", "p1-2", "p1-21", "p1-5"])  # one event per staged row
    assert all(h == key_hash(k) for k, h in _rows(url, f"SELECT kafka_key, kafka_key_hash FROM {outbox}"))
    assert _tables(url, target) == [target]  # the staging table is gone


def test_rows_mode_without_keys_inserts_in_order(accounts: tuple[str, str, str]) -> None:
    url, outbox, target = accounts
    options = {"url": url, "table": outbox, "target_table": target}
    writer = OutboxDataSource(options).writer(ACCOUNTS, False)
    writer.commit([writer.stage(1, 21, _batch([30, 31], "b")), writer.stage(0, 20, _batch([40], "a"))])
    assert _rows(url, f"SELECT id, owner FROM {target} WHERE id >= 30 ORDER BY id") == [
        (30, "b30"), (31, "b31"), (40, "a40")
    ]
    assert _rows(url, f"SELECT count(*) FROM {outbox}") == [(0,)]  # no events asked for


def test_records_mode_orders_ids_by_partition_then_dataframe(accounts: tuple[str, str, str]) -> None:
    url, outbox, _ = accounts
    schema = StructType([StructField(c, StringType()) for c in ("topic", "key", "value")])
    writer = OutboxDataSource({"url": url, "table": outbox}).writer(schema, False)

    def batch(tag: str, n: int) -> Iterator[pa.RecordBatch]:
        # 40 rows: above PostgreSQL's COPY threshold, so the binary COPY path runs there.
        yield pa.RecordBatch.from_pydict({"topic": ["t"] * n, "key": ["k"] * n, "value": [f"{tag}{i:02}" for i in range(n)]})

    writer.commit([writer.stage(1, 31, batch("b", 40)), writer.stage(0, 30, batch("a", 3))])
    values = [bytes(v).decode() for (v,) in _rows(url, f"SELECT kafka_value FROM {outbox} ORDER BY id")]
    assert values == [f"a{i:02}" for i in range(3)] + [f"b{i:02}" for i in range(40)]
    assert _rows(url, f"SELECT DISTINCT kafka_key_hash FROM {outbox}") == [(key_hash("k"),)]


def test_a_dialect_without_upserts_fails_before_any_task_runs(
    accounts: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyharvest.plugins.api import Dialect

    url, outbox, target = accounts
    monkeypatch.setattr(Dialect, "upsert_from_select", lambda self, *a, **k: None)
    options = {"url": url, "table": outbox, "target_table": target, "target_key_columns": "id"}
    with pytest.raises(ConfigError, match=r"does not support upserts; omit target_key_columns to insert"):
        OutboxDataSource(options).writer(ACCOUNTS, False)
    assert _tables(url, target) == [target]  # nothing staged


@pytest.mark.parametrize("dialect_way", [True, False], ids=["dialect-hook", "generic"])
def test_sink_remembers_identities_once(
    database_url: str, table_name: str, dialect_way: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyharvest.plugins.api import Dialect

    if not dialect_way:
        monkeypatch.setattr(Dialect, "insert_new_keys", lambda self, *a, **k: None)
    sink = ExactlyOnceSink(database_url, apply=lambda conn, batch: None, checkpoint_table=f"{table_name}_b")
    db = sink._database()
    dropped = 0

    def drop_seen(identities: list[str]) -> list[str]:
        nonlocal dropped
        batch = pa.table({IDENTITY_COLUMN: identities, "n": list(range(len(identities)))})
        with db.engine.begin() as conn:
            kept = sink._tasks.drop_seen(conn, db.dialect, batch, datetime.now(UTC))
        dropped += len(identities) - kept.num_rows
        return [identities[i] for i in kept.column("n").to_pylist()]

    try:
        assert drop_seen(["a", "b", "a", "c"]) == ["a", "b", "c"]  # a repeat within the batch goes
        assert drop_seen(["c", "d", "b", "e"]) == ["d", "e"]
        many = [f"id-{i}" for i in range(2500)]  # over every list limit: looked up in chunks
        assert drop_seen([*many[:1200], "e"]) == many[:1200]
        assert drop_seen(["a", *many, "f"]) == [*many[1200:], "f"]
        assert dropped == 1 + 2 + 1 + 1201
        seen = f"{table_name}_b_seen"
        assert _rows(database_url, f"SELECT count(*), count(DISTINCT identity) FROM {seen}") == [(2506, 2506)]
        # Another sink's identities are its own.
        other = ExactlyOnceSink(database_url, apply=lambda conn, batch: None, checkpoint_table=f"{table_name}_b",
                                name="other")
        with db.engine.begin() as conn:
            kept = other._tasks.drop_seen(conn, db.dialect, pa.table({IDENTITY_COLUMN: ["a", "zz"]}), datetime.now(UTC))
        assert kept.num_rows == 2
    finally:
        db.engine.dispose()


def test_insert_rows_into_a_table_named_by_the_caller(database_url: str, table_name: str) -> None:
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as c:
            c.execute(sa.text(f"CREATE TABLE {table_name} (k VARCHAR(20), v INTEGER)"))
        with engine.begin() as c:
            assert insert_rows(c, table_name, ["k", "v"], ((f"k{i}", i) for i in range(7000))) == 7000
            assert insert_rows(c, table_name, ["v", "k"], [(-1, "small")]) == 1
        assert _rows(database_url, f"SELECT count(*), sum(v) FROM {table_name}") == [(7001, sum(range(7000)) - 1)]
    finally:
        engine.dispose()


def test_staged_outbox_rows_are_copied_in_binary_with_the_old_types() -> None:
    """The staging table's definition gives PostgreSQL's COPY the binary types the writer used
    to name by hand (int4, int8, int8, text, text, bytea, text)."""
    from pyharvest.bindings.spark.outbox_layout import PAYLOAD_COLUMNS
    from pyharvest.bindings.spark.staging import ATTEMPT, PARTITION, SEQ, outbox_staging_table, staging_name
    from pyharvest.plugins.api import TableName
    from pyharvest.plugins.postgresql import CopyWriter

    table = outbox_staging_table(staging_name(TableName("outbox"), "0123456789abcdef"))
    # the columns a task stages into an outbox without the key hash (OutboxWriter's copy)
    writer = CopyWriter(table, [PARTITION, ATTEMPT, SEQ, *PAYLOAD_COLUMNS], exact_types=True)
    assert writer.types == ["int4", "int8", "int8", "text", "text", "bytea", "text"]
    assert writer.statement.endswith("FROM STDIN (FORMAT BINARY)")


def test_staged_rows_can_be_made_again_whatever_the_columns() -> None:
    from itertools import repeat

    from pyharvest.bindings.spark.outbox_writer import _staged_rows

    values = (f"v{i}".encode() for i in range(3))  # a generator: read once
    rows = _staged_rows(2, 99, 2 << 40, [repeat("topic"), ["a", "b", "c"], values, repeat("[]", 3)])
    expected = [(2, 99, (2 << 40) + i, "topic", k, f"v{i}".encode(), "[]") for i, k in enumerate("abc")]
    assert len(rows) == 3
    assert list(rows) == expected and list(rows) == expected


def _messages(ids: list[int]) -> list[pa.RecordBatch]:
    """A partition of a micro-batch as the sink's tasks get it: the message columns apply
    reads, and the identity the driver added."""
    return [pa.RecordBatch.from_pydict({"k": [str(i) for i in ids], IDENTITY_COLUMN: [f"o:t:{i}" for i in ids]})]


@pytest.fixture
def applied_table(database_url: str, table_name: str) -> str:
    table = f"{table_name}_applied"
    engine = sa.create_engine(database_url)
    with engine.begin() as c:
        c.execute(sa.text(f"CREATE TABLE {table} (k VARCHAR(20))"))
    engine.dispose()
    return table


def test_partitions_apply_once_through_retries_and_a_replay(
    database_url: str, table_name: str, applied_table: str
) -> None:
    """What the executors do with a batch's partitions: a retry after its attempt committed
    applies nothing, a failed attempt leaves nothing, and a batch replayed after the driver
    died (before it recorded the batch) applies only what had not committed."""
    from pyharvest.bindings.spark.sink_tasks import task_time

    failing = {"partition": 1}

    def apply(conn: sa.Connection, batch: pa.Table) -> None:
        insert_rows(conn, applied_table, ["k"], ((k,) for k in batch.column("k").to_pylist()))
        if batch.column("k")[0].as_py() == "100" and failing["partition"] == 1:
            raise RuntimeError("injected failure after the rows went in")

    sink = ExactlyOnceSink(database_url, apply=apply, checkpoint_table=f"{table_name}_b", query_id="q")
    db = sink._database()
    tasks = sink._tasks
    t0 = datetime.now(UTC)

    def run(partition: int, attempt: int, ids: list[int]):  # noqa: ANN202
        return tasks("q", 0, partition, attempt, task_time(t0, attempt), _messages(ids))

    try:
        first = run(0, 10, list(range(5)))
        assert (first.applied_rows, first.skipped) == (5, False)
        retry = run(0, 11, list(range(5)))  # the attempt committed, then its task failed: Spark retries
        assert (retry.input_rows, retry.applied_rows, retry.skipped) == (5, 0, True)
        with pytest.raises(RuntimeError, match="injected failure"):
            run(1, 12, [100, 101, 102])
        failing["partition"] = -1
        # The driver dies here, before recording batch 0; a new one replays it, split the same way.
        replay = ExactlyOnceSink(database_url, apply=apply, checkpoint_table=f"{table_name}_b", query_id="q")._tasks
        again = [replay("q", 0, p, 20 + p, task_time(t0, 20 + p), _messages(ids))
                 for p, ids in enumerate([list(range(5)), [100, 101, 102]])]
        assert [(a.applied_rows, a.skipped) for a in again] == [(0, True), (3, False)]
        got = sorted(int(k) for (k,) in _rows(database_url, f"SELECT k FROM {applied_table}"))
        assert got == [0, 1, 2, 3, 4, 100, 101, 102]
        marks = _rows(database_url, f"SELECT spark_partition, input_rows, applied_rows FROM {table_name}_b_tasks "
                                    "ORDER BY spark_partition")
        assert marks == [(0, 5, 5), (1, 3, 3)]
        # A partition arrives as several Arrow batches: a record repeated across them is applied once.
        split = tasks("q", 1, 0, 30, task_time(t0, 30), [*_messages([7, 8]), *_messages([8, 9, 100])])
        assert (split.input_rows, split.applied_rows) == (5, 3)
        got = sorted(int(k) for (k,) in _rows(database_url, f"SELECT k FROM {applied_table}"))
        assert got == [0, 1, 2, 3, 4, 7, 8, 9, 100, 101, 102]
    finally:
        db.engine.dispose()


def test_without_dedupe_a_replay_must_split_the_batch_the_same_way(
    database_url: str, table_name: str, applied_table: str
) -> None:
    from pyharvest.bindings.spark.sink_tasks import task_time
    from pyharvest.core.errors import BindingError

    def apply(conn: sa.Connection, batch: pa.Table) -> None:
        insert_rows(conn, applied_table, ["k"], ((k,) for k in batch.column("k").to_pylist()))

    sink = ExactlyOnceSink(database_url, apply=apply, checkpoint_table=f"{table_name}_b", query_id="q", dedupe=False)
    db = sink._database()
    t0 = datetime.now(UTC)

    def batch(ids: list[int]) -> list[pa.RecordBatch]:
        return [pa.RecordBatch.from_pydict({"k": [str(i) for i in ids]})]

    try:
        assert sink._tasks("q", 3, 0, 1, task_time(t0, 1), batch([1, 2])).applied_rows == 2
        assert sink._tasks("q", 3, 0, 2, task_time(t0, 2), batch([1, 2])).skipped
        with pytest.raises(BindingError, match=r"applied before with 2 message\(s\), replayed with 3.*same partitions"):
            sink._tasks("q", 3, 0, 3, task_time(t0, 3), batch([1, 2, 3]))
        assert _rows(database_url, f"SELECT count(*) FROM {applied_table}") == [(2,)]
    finally:
        db.engine.dispose()


def test_two_attempts_at_once_commit_one(database_url: str, table_name: str, applied_table: str) -> None:
    """A speculative copy of a task commits while the first attempt is still applying: the
    first attempt's transaction fails on the partition's row and rolls back."""
    from pyharvest.bindings.spark.sink_tasks import task_time

    if database_url.startswith("sqlite"):
        pytest.skip("SQLite admits one writing transaction at a time: two attempts cannot overlap")
    t0 = datetime.now(UTC)
    copy: dict[str, ExactlyOnceSink] = {}

    def apply(conn: sa.Connection, batch: pa.Table) -> None:
        if "speculative" not in copy:  # the first attempt: the copy runs and commits meanwhile
            copy["speculative"] = ExactlyOnceSink(database_url, apply=apply, checkpoint_table=f"{table_name}_b",
                                                  query_id="q", dedupe=False)
            done = copy["speculative"]._tasks("q", 0, 0, 2, task_time(t0, 2), batch.to_batches())
            assert (done.applied_rows, done.skipped) == (2, False)
        insert_rows(conn, applied_table, ["k"], ((k,) for k in batch.column("k").to_pylist()))

    sink = ExactlyOnceSink(database_url, apply=apply, checkpoint_table=f"{table_name}_b", query_id="q", dedupe=False)
    db = sink._database()
    try:
        first = sink._tasks("q", 0, 0, 1, task_time(t0, 1), [pa.RecordBatch.from_pydict({"k": ["a", "b"]})])
        assert (first.applied_rows, first.skipped) == (0, True)
        assert _rows(database_url, f"SELECT count(*) FROM {applied_table}") == [(2,)]
    finally:
        db.engine.dispose()
        copy["speculative"]._tasks.database().engine.dispose()
