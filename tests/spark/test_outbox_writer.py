"""DataFrame → outbox: all or nothing per job, whatever happens to the tasks."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
import pytest
import sqlalchemy as sa
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from pyharvest.bindings.spark import StagedPartition, register
from pyharvest.bindings.spark.outbox_writer import OutboxDataSource
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.outbox.keys import key_hash
from pyharvest.core.outbox.records import OutboxRecord
from tests.helpers.fixtures.databases import server_url, unique_table

pytestmark = pytest.mark.spark

PG = "postgresql"


@pytest.fixture
def pg_outbox() -> Iterator[tuple[str, str]]:
    url = server_url(PG)
    table = unique_table("spark_outbox")
    create_outbox_table(url, table)
    yield url, table
    _drop_prefixed(url, table)


def _drop_prefixed(url: str, prefix: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as c:
            for t in sa.inspect(engine).get_table_names():
                if t.startswith(prefix):
                    c.exec_driver_sql(f'DROP TABLE "{t}"' if engine.dialect.name != "mysql" else f"DROP TABLE `{t}`")
    finally:
        engine.dispose()


def _query(url: str, sql: str) -> list[tuple]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.exec_driver_sql(sql)]
    finally:
        engine.dispose()


def _tables_like(url: str, prefix: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        return sorted(t for t in sa.inspect(engine).get_table_names() if t.startswith(prefix))
    finally:
        engine.dispose()


@F.udf(StringType())
def fail_first_attempt(key: str) -> str:
    """Fails partition 1's first attempt midway through its rows (Spark then retries it)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx.partitionId() == 1 and ctx.attemptNumber() == 0 and key.endswith("50"):
        raise RuntimeError("injected failure in the first attempt")
    return key


@F.udf(StringType())
def always_fail_partition_2(key: str) -> str:
    from pyspark import TaskContext

    if TaskContext.get().partitionId() == 2:
        raise RuntimeError("injected failure in every attempt")
    return key


def _records(spark, n: int, partitions: int = 4):  # noqa: ANN001, ANN202
    return spark.range(0, n, numPartitions=partitions).selectExpr(
        "'orders' AS topic",
        "cast(id % 97 AS string) AS key",
        "cast(cast(id AS string) AS binary) AS value",
        "array(named_struct('key', 'n', 'value', cast(id AS string))) AS headers",
    )


def test_task_retry_commits_every_row_once_in_order(spark, pg_outbox) -> None:  # noqa: ANN001
    url, table = pg_outbox
    df = _records(spark, 4000).withColumn("key", fail_first_attempt("key"))
    df.write.format("pyharvest.outbox").option("url", url).option("table", table).mode("append").save()

    total, distinct = _query(url, f"SELECT count(*), count(DISTINCT kafka_value) FROM {table}")[0]
    assert (total, distinct) == (4000, 4000)  # the failed attempt's rows were not moved
    # Within a Spark partition (contiguous id ranges of spark.range), ids follow the DataFrame's order.
    values = [int(v) for (v,) in _query(url, f"SELECT convert_from(kafka_value, 'UTF8') FROM {table} ORDER BY id")]
    for p in range(4):
        mine = [v for v in values if p * 1000 <= v < (p + 1) * 1000]
        assert mine == sorted(mine)
    headers = _query(url, f"SELECT kafka_headers FROM {table} WHERE kafka_value = '7'::bytea")[0][0]
    assert json.loads(headers) == [["n", "7"]]
    assert _tables_like(url, table) == [table]  # the staging table is gone


def test_failed_job_leaves_nothing(spark, pg_outbox) -> None:  # noqa: ANN001
    url, table = pg_outbox
    df = _records(spark, 2000).withColumn("key", always_fail_partition_2("key"))
    with pytest.raises(Exception, match="injected failure"):
        df.write.format("pyharvest.outbox").option("url", url).option("table", table).mode("append").save()
    assert _query(url, f"SELECT count(*) FROM {table}") == [(0,)]
    assert _tables_like(url, table) == [table]


def test_commit_moves_only_the_attempts_it_names(pg_outbox) -> None:  # noqa: ANN001
    """A task attempt that staged its rows and then failed (or a speculative duplicate) must not
    be moved; abort, given None for tasks that did write, still discards everything."""
    url, table = pg_outbox
    schema = StructType([StructField("topic", StringType()), StructField("key", StringType()), StructField("value", StringType())])

    def batch(tag: str, n: int) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pydict({"topic": ["t"] * n, "key": ["k"] * n, "value": [f"{tag}{i}" for i in range(n)]})

    writer = OutboxDataSource({"url": url, "table": table}).writer(schema, False)
    writer.stage(0, 10, batch("zombie", 5))  # staged, then its task "failed"
    winners = [writer.stage(0, 11, batch("p0-", 3)), writer.stage(1, 12, batch("p1-", 2))]
    writer.commit(winners)
    got = sorted(v.decode() for (v,) in _query(url, f"SELECT kafka_value FROM {table}"))
    assert got == ["p0-0", "p0-1", "p0-2", "p1-0", "p1-1"]

    writer = OutboxDataSource({"url": url, "table": table}).writer(schema, False)
    writer.stage(0, 20, batch("lost", 4))
    writer.abort([None, StagedPartition(1, 21, 0, 0)])
    assert _query(url, f"SELECT count(*) FROM {table}") == [(5,)]
    assert _tables_like(url, table) == [table]


def _account_events(row: dict) -> list[OutboxRecord]:
    return [OutboxRecord("account-updated", str(row["id"]), json.dumps({"balance": row["balance"]}))]


def test_rows_and_their_events_commit_together(spark, pg_outbox) -> None:  # noqa: ANN001
    url, table = pg_outbox
    accounts = unique_table("spark_accounts")
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE {accounts} (id BIGINT PRIMARY KEY, owner TEXT NOT NULL, balance BIGINT NOT NULL)")
        c.exec_driver_sql(f"INSERT INTO {accounts} SELECT g, 'old', 0 FROM generate_series(0, 99) g")
    engine.dispose()
    register(spark, events={"account_events": _account_events})
    try:
        updates = spark.range(0, 300, numPartitions=3).selectExpr("id", "cast(id AS string) AS owner", "id * 10 AS balance")

        def write(df, **opts: str) -> None:  # noqa: ANN001
            w = df.write.format("pyharvest.outbox").option("url", url).option("table", table)
            w = w.option("target_table", accounts).option("target_key_columns", "id")
            for k, v in opts.items():
                w = w.option(k, v)
            w.mode("append").save()

        # A failing job changes neither the accounts nor the outbox.
        with pytest.raises(Exception, match="injected failure"):
            write(updates.withColumn("owner", always_fail_partition_2("owner")), events="account_events")
        assert _query(url, f"SELECT count(*), sum(balance) FROM {accounts}") == [(100, 0)]
        assert _query(url, f"SELECT count(*) FROM {table}") == [(0,)]

        # With a retried task, every committed row has exactly one event.
        write(updates.withColumn("owner", fail_first_attempt("owner")), events="account_events")
        assert _query(url, f"SELECT count(*), sum(balance) FROM {accounts}") == [(300, sum(i * 10 for i in range(300)))]
        events = _query(url, f"SELECT kafka_topic, kafka_key, convert_from(kafka_value, 'UTF8') FROM {table}")
        assert len(events) == 300
        assert {(t, k) for t, k, _ in events} == {("account-updated", str(i)) for i in range(300)}
        assert json.loads(dict((k, v) for _, k, v in events)["42"]) == {"balance": 420}
        hashes = _query(url, f"SELECT kafka_key, kafka_key_hash FROM {table}")
        assert all(h == key_hash(k) for k, h in hashes)  # an events function's keys are hashed too

        # The column mapping: a literal topic, the key column, the whole row as JSON.
        write(updates.limit(10), event_topic="account-snapshot")
        snap = _query(url, f"SELECT convert_from(kafka_value, 'UTF8') FROM {table} WHERE kafka_topic = 'account-snapshot'")
        assert len(snap) == 10 and set(json.loads(snap[0][0])) == {"id", "owner", "balance"}
    finally:
        register(spark)
        _drop_prefixed(url, accounts)


@pytest.mark.parametrize("dialect", ["sqlite", "mysql"])
def test_bulk_paths_of_other_databases(spark, dialect: str, tmp_path) -> None:  # noqa: ANN001
    from pyharvest.plugins.api import installed_dialects

    if dialect not in installed_dialects():
        pytest.skip(f"the {dialect} dialect plugin is not installed (pyharvest.dialects entry point)")
    url = f"sqlite:///{tmp_path / 'outbox.db'}" if dialect == "sqlite" else server_url(dialect)
    table = unique_table("spark_outbox")
    create_outbox_table(url, table)
    try:
        df = _records(spark, 1200, partitions=3).withColumn("key", fail_first_attempt("key"))
        df.write.format("pyharvest.outbox").option("url", url).option("table", table).mode("append").save()
        assert _query(url, f"SELECT count(*), count(DISTINCT kafka_value) FROM {table}") == [(1200, 1200)]
        values = [int(bytes(v)) for (v,) in _query(url, f"SELECT kafka_value FROM {table} ORDER BY id")]
        assert [v for v in values if 400 <= v < 800] == list(range(400, 800))
        assert _tables_like(url, table) == [table]
    finally:
        _drop_prefixed(url, table)


def test_rows_carry_the_key_hash_the_sharded_harvester_reads(spark, pg_outbox) -> None:  # noqa: ANN001
    """Every staged record stores Kafka's hash of its key (core.shards.key_hash), computed on the
    executors: many keys of a few lengths (hashed by Arrow kernels), rare lengths and non-ASCII
    keys (one by one), through a retried task."""
    url, table = pg_outbox
    df = spark.range(0, 6000, numPartitions=3).selectExpr(
        "'orders' AS topic",
        "CASE WHEN id % 500 = 0 THEN concat('clé-€-', repeat('x', cast(id % 7 AS int)), cast(id AS string)) "
        "ELSE cast(id % 1013 AS string) END AS key",
        "cast(cast(id AS string) AS binary) AS value",
    ).withColumn("key", fail_first_attempt("key"))
    df.write.format("pyharvest.outbox").option("url", url).option("table", table).mode("append").save()
    rows = _query(url, f"SELECT kafka_key, kafka_key_hash FROM {table}")
    assert len(rows) == 6000
    assert [h for _, h in rows] == [key_hash(k) for k, _ in rows]
    assert len({h % 8 for _, h in rows}) == 8  # spread over every shard of eight, not all in shard 0


def test_an_outbox_without_the_key_hash_column_is_written_as_before(spark, pg_outbox) -> None:  # noqa: ANN001
    url, table = pg_outbox
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN kafka_key_hash")
    engine.dispose()
    _records(spark, 300).write.format("pyharvest.outbox").option("url", url).option("table", table).mode("append").save()
    assert _query(url, f"SELECT count(*) FROM {table}") == [(300,)]


def test_clear_errors_for_bad_input(spark, pg_outbox) -> None:  # noqa: ANN001
    url, table = pg_outbox
    df = spark.range(3).selectExpr("'t' AS topic", "cast(id AS string) AS key")
    with pytest.raises(Exception, match="lacks column.*value"):
        df.write.format("pyharvest.outbox").option("url", url).option("table", table).mode("append").save()
    with pytest.raises(Exception, match="append-only"):
        _records(spark, 3).write.format("pyharvest.outbox").option("url", url).option("table", table).mode("overwrite").save()
    with pytest.raises(Exception, match="unknown option"):
        _records(spark, 3).write.format("pyharvest.outbox").option("url", url).option("tabel", table).mode("append").save()
