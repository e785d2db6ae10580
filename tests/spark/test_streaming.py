"""Kafka → Spark → database: every message applied exactly once, across a driver crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer
from pyspark.sql.types import StructType

from pyharvest.bindings.spark import OUTBOX_HEADER, RECORD_ID_HEADER, ExactlyOnceSink
from pyharvest.bindings.spark.exactly_once import insert_rows
from pyharvest.bindings.spark.kafka_source import KAFKA_SCHEMA
from pyharvest.bindings.spark.partition_apply import AppliedPartition, PartitionApply
from tests.fixtures.databases import server_url, unique_table
from tests.kafka_tools import create_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pg_table() -> Iterator[tuple[str, str]]:
    url = server_url("postgresql")
    table = unique_table("spark_applied")
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE {table} (k TEXT, v BYTEA, p INT, o BIGINT)")
    yield url, table
    with engine.begin() as c:
        for t in sa.inspect(engine).get_table_names():
            if t.startswith(table):
                c.exec_driver_sql(f'DROP TABLE "{t}"')
    engine.dispose()


def _count(url: str, sql: str) -> tuple:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return tuple(c.exec_driver_sql(sql).one())
    finally:
        engine.dispose()


def _produce(bootstrap: str, topic: str, n: int, republish_every: int) -> int:
    """n records, as a harvester would publish them; every ``republish_every``-th is published
    twice (at-least-once). Returns how many messages went out."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sent = 0
    for i in range(n):
        headers = [(OUTBOX_HEADER, "orders_outbox"), (RECORD_ID_HEADER, str(i))]
        copies = 2 if i % republish_every == 0 else 1
        for _ in range(copies):
            p.produce(topic, key=f"k{i % 50}".encode(), value=f"v{i}".encode(), headers=headers)
            sent += 1
    p.flush(30)
    return sent


def _driver(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.stream_driver", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )


def test_killed_driver_restarts_and_applies_every_message_once(kafka_bootstrap, topic_name, pg_table, tmp_path) -> None:  # noqa: ANN001
    url, table = pg_table
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    n = 3000
    sent = _produce(kafka_bootstrap, topic_name, n, republish_every=50)
    checkpoint = str(tmp_path / "checkpoint")
    args = [kafka_bootstrap, topic_name, url, table, checkpoint]

    first = _driver([*args, "slow"])
    try:
        deadline = time.monotonic() + 120
        while _count(url, f"SELECT count(*) FROM {table}")[0] < 500:
            assert first.poll() is None, first.stdout.read().decode()[-3000:] if first.stdout else ""
            assert time.monotonic() < deadline, "the first driver applied nothing within 120 s"
            time.sleep(0.2)
    finally:
        # The whole driver dies at once: Python, its JVM and the Python workers (one process group).
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        if first.stdout:
            first.stdout.close()
    partial = _count(url, f"SELECT count(*) FROM {table}")[0]
    assert partial < n, "the kill came too late to test anything"

    second = _driver([*args, "drain"])
    out, _ = second.communicate(timeout=180)
    assert second.returncode == 0, out.decode()[-3000:]

    total, distinct, duplicates_in_kafka = (*_count(url, f"SELECT count(*), count(DISTINCT v) FROM {table}"), sent - n)
    assert (total, distinct) == (n, n), f"{total} rows for {n} records ({duplicates_in_kafka} republished in Kafka)"


def test_sink_skips_replayed_batches_and_remembered_records(spark, pg_table) -> None:  # noqa: ANN001
    url, table = pg_table

    def apply(conn, batch) -> None:  # noqa: ANN001 - runs on the executors: what it did is read back from the table
        ids = [int(h[1]["value"]) for h in batch.column("headers").to_pylist()]
        conn.exec_driver_sql(f"INSERT INTO {table} (k, o) VALUES " + ", ".join(f"('x', {i})" for i in ids))

    def messages(ids: list[int], offset0: int):  # noqa: ANN202
        rows = [("t", 0, offset0 + j, b"k", b"v", [(OUTBOX_HEADER, b"ob"), (RECORD_ID_HEADER, str(i).encode())], None)
                for j, i in enumerate(ids)]
        return spark.createDataFrame(rows, StructType.fromDDL(KAFKA_SCHEMA))

    sink = ExactlyOnceSink(url, apply=apply, checkpoint_table=f"{table}_batches", query_id="q-1")
    sink(messages([1, 2, 3], 0), 0)
    sink(messages([1, 2, 3], 0), 0)  # Spark replays batch 0 after a crash: skipped
    sink(messages([3, 4, 4, 5], 3), 1)  # record 3 republished, 4 twice in one batch
    assert (sink.applied_batches, sink.skipped_batches, sink.dropped_duplicates) == (2, 1, 2)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            applied = sorted(c.exec_driver_sql(f"SELECT o FROM {table}").scalars())
    finally:
        engine.dispose()
    assert applied == [1, 2, 3, 4, 5]


class _FailAfterCommit(PartitionApply):
    """Partition 1's first attempt fails after its transaction committed (as a task can, e.g.
    when its executor is lost before it reports): Spark retries it."""

    def __call__(self, *args, **kwargs) -> AppliedPartition:  # noqa: ANN002, ANN003
        from pyspark import TaskContext

        done = super().__call__(*args, **kwargs)
        ctx = TaskContext.get()
        if ctx.partitionId() == 1 and ctx.attemptNumber() == 0:
            raise RuntimeError("injected failure after the partition committed")
        return done


def _apply_failing_partition_2_once(table: str):  # noqa: ANN202
    def apply(conn, batch) -> None:  # noqa: ANN001
        from pyspark import TaskContext

        rows = zip(batch.column("key").to_pylist(), batch.column("offset").to_pylist(), strict=True)
        insert_rows(conn, table, ["k", "o"], ((k.decode(), o) for k, o in rows))
        ctx = TaskContext.get()
        if ctx.partitionId() == 2 and ctx.attemptNumber() == 0:
            raise RuntimeError("injected failure after the rows went in, before the commit")

    return apply


def test_executors_apply_each_message_once_through_task_retries(spark, pg_table) -> None:  # noqa: ANN001
    """local[2,4]: partition 2's first attempt fails inside its transaction, partition 1's after
    its commit; Spark retries both. Every record is applied once, republished ones included."""
    url, table = pg_table
    n = 2000
    rows = []
    for i in range(n):
        headers = [(OUTBOX_HEADER, b"orders_outbox"), (RECORD_ID_HEADER, str(i).encode())]
        for _ in range(2 if i % 100 == 0 else 1):  # every 100th record published twice
            rows.append(("orders", 0, len(rows), f"r{i}".encode(), b"v", headers, None))
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 4), StructType.fromDDL(KAFKA_SCHEMA))

    apply = _apply_failing_partition_2_once(table)
    sink = ExactlyOnceSink(url, apply=apply, checkpoint_table=f"{table}_batches", query_id="q-retries",
                           columns=["key", "offset"])
    sink._tasks = _FailAfterCommit(url, None, f"{table}_batches", "default", True, apply)
    sc = spark.sparkContext
    sc.setJobGroup("pyharvest-sink-retries", "injected task failures")
    try:
        sink(df, 0)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    tracker = sc.statusTracker()
    stages = [s for j in tracker.getJobIdsForGroup("pyharvest-sink-retries") for s in tracker.getJobInfo(j).stageIds]
    assert sum(tracker.getStageInfo(s).numFailedTasks for s in stages) == 2  # both failures happened

    assert _count(url, f"SELECT count(*), count(DISTINCT k) FROM {table}") == (n, n)
    assert (sink.applied_batches, sink.dropped_duplicates) == (1, len(rows) - n)
    assert _count(url, f"SELECT count(*), sum(input_rows), sum(applied_rows) FROM {table}_batches_tasks") == (
        4, len(rows), n)
    sink(df, 0)  # replayed after it was recorded: skipped whole
    assert sink.skipped_batches == 1 and _count(url, f"SELECT count(*) FROM {table}") == (n,)


def test_sink_without_pandas_says_what_to_install(monkeypatch) -> None:  # noqa: ANN001
    import importlib.util

    from pyharvest.core.errors import BindingError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pandas" else real(name, *a))
    sink = ExactlyOnceSink("sqlite://", apply=lambda conn, batch: None)
    with pytest.raises(BindingError, match=r"mapInArrow, which needs pandas.*pyharvest\[spark\].*nothing was applied"):
        sink(object(), 0)
    assert sink.applied_batches == 0


def test_a_failed_batch_says_what_stays_applied_and_records_nothing(spark, pg_table, caplog) -> None:  # noqa: ANN001
    url, table = pg_table

    def apply(conn, batch) -> None:  # noqa: ANN001
        raise RuntimeError("injected failure in every attempt")

    rows = [("t", 0, i, b"k", b"v", [(OUTBOX_HEADER, b"ob"), (RECORD_ID_HEADER, str(i).encode())], None)
            for i in range(3)]
    sink = ExactlyOnceSink(url, apply=apply, checkpoint_table=f"{table}_batches", query_id="q-fail")
    with caplog.at_level("WARNING", logger="pyharvest.spark"), pytest.raises(Exception, match="injected failure"):
        sink(spark.createDataFrame(rows, StructType.fromDDL(KAFKA_SCHEMA)), 0)
    assert "batch 0 of query q-fail failed; partitions that committed stay applied" in caplog.text
    assert sink.applied_batches == 0
    assert _count(url, f"SELECT count(*) FROM {table}_batches") == (0,)
