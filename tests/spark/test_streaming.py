"""Kafka → Spark → database: every message applied exactly once, on Spark's Kafka connector
(``format("kafka")``, the documented path) and on the ``pyharvest.kafka`` fallback alike:
through task retries, a SIGKILLed driver, two drivers at once on one checkpoint, and
messages published twice, the outbox writer's among them."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer
from pyspark.sql.types import StructType

from benchmarks.children import python_module
from pyharvest import Config, Harvest, Limits
from pyharvest.bindings.spark import OUTBOX_HEADER, RECORD_ID_HEADER, ExactlyOnceSink, kafka_package
from pyharvest.bindings.spark.kafka_source import KAFKA_SCHEMA
from pyharvest.bindings.spark.partition_apply import AppliedPartition, PartitionApply
from pyharvest.bindings.spark.sink import insert_rows
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.errors import ConfigError
from tests.helpers.fixtures.databases import server_url, unique_table
from tests.helpers.spark import SOURCES, kafka_stream
from tests.helpers.topics import create_topic, read_topic
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]



@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest) -> str:
    return str(request.param)


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
        [*python_module("tests.helpers.spark_stream_driver"), *args],
        cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """The whole driver dies at once: Python, its JVM and the Python workers (one process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    if proc.stdout:
        proc.stdout.close()


def _applied_at_least(proc: subprocess.Popen[bytes], url: str, table: str, rows: int) -> bool:
    assert proc.poll() is None, proc.stdout.read().decode()[-3000:] if proc.stdout else "the driver exited"
    return _count(url, f"SELECT count(*) FROM {table}")[0] >= rows


def _drain(args: list[str]) -> str:
    proc = _driver([*args, "drain"])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out.decode()[-3000:]
    return out.decode()


def test_kafka_package_names_the_connector_of_the_installed_pyspark() -> None:
    import pyspark

    assert kafka_package() == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
    assert kafka_package("4.2.0.dev1") == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    with pytest.raises(ConfigError, match="Spark 4 release"):
        kafka_package("3.5.1")


def test_killed_driver_restarts_and_applies_every_message_once(source, kafka_bootstrap, topic_name, pg_table, tmp_path) -> None:  # noqa: ANN001
    url, table = pg_table
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    n = 3000
    sent = _produce(kafka_bootstrap, topic_name, n, republish_every=50)
    args = [kafka_bootstrap, topic_name, url, table, str(tmp_path / "checkpoint"), source]

    first = _driver([*args, "slow"])
    try:
        wait_until(lambda: _applied_at_least(first, url, table, 500), 240, "the first driver to apply 500 messages",
                   interval=0.2)
    finally:
        _kill(first)
    partial = _count(url, f"SELECT count(*) FROM {table}")[0]
    assert partial < n, "the kill came too late to test anything"

    _drain(args)
    total, distinct = _count(url, f"SELECT count(*), count(DISTINCT v) FROM {table}")
    assert (total, distinct) == (n, n), f"{total} rows for {n} records ({sent - n} republished in Kafka)"


def test_two_drivers_at_once_on_one_checkpoint_apply_every_message_once(kafka_bootstrap, topic_name, pg_table, tmp_path) -> None:  # noqa: ANN001
    """A driver taken for dead goes on running while its replacement starts from the same
    checkpoint: both run the same batch's tasks at once, and the partitions' rows admit one
    attempt each. Spark lets only one of them write the checkpoint's next batch (the other
    fails or stops); a last run drains what is left.

    On Spark's connector only: what is under test is the sink's admission of one attempt per
    partition and Spark's race for the checkpoint, which no source takes part in; the fallback
    source's own offsets through a driver's death are the test above's. (Three drivers' JVMs
    in a row made the fallback's run the suite's longest test, 96 s.)"""
    source = "kafka"
    url, table = pg_table
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    n = 3000
    _produce(kafka_bootstrap, topic_name, n, republish_every=50)
    args = [kafka_bootstrap, topic_name, url, table, str(tmp_path / "checkpoint"), source]

    zombie = _driver([*args, "slow"])
    try:
        wait_until(lambda: _applied_at_least(zombie, url, table, 250), 240, "the first driver's first batch",
                   interval=0.2)
        replacement = _driver([*args, "drain"])
        replacement.communicate(timeout=300)  # either outcome is allowed: it may lose the checkpoint's race
    finally:
        _kill(zombie)
    _drain(args)
    assert _count(url, f"SELECT count(*), count(DISTINCT v) FROM {table}") == (n, n)
    # Both drivers ran under the query id kept in the checkpoint: one set of batches.
    assert _count(url, f"SELECT count(DISTINCT query_id) FROM {table}_batches") == (1,)


class _FailAfterCommit(PartitionApply):
    """Partition 1's first attempt fails after its transaction committed (as a task can, e.g.
    when its executor is lost before it reports): Spark retries it."""

    failures = ""  # a directory: each injected failure leaves a file there

    def __call__(self, *args, **kwargs) -> AppliedPartition:  # noqa: ANN002, ANN003
        from pyspark import TaskContext

        done = super().__call__(*args, **kwargs)
        ctx = TaskContext.get()
        if ctx.partitionId() == 1 and ctx.attemptNumber() == 0:
            Path(self.failures, f"after-commit-{ctx.taskAttemptId()}").touch()
            raise RuntimeError("injected failure after the partition committed")
        return done


def _apply_failing_partition_2_once(table: str, failures: str):  # noqa: ANN202
    def apply(conn, batch) -> None:  # noqa: ANN001
        from pyspark import TaskContext

        rows = zip(batch.column("value").to_pylist(), batch.column("offset").to_pylist(), strict=True)
        insert_rows(conn, table, ["v", "o"], rows)
        ctx = TaskContext.get()
        if ctx.partitionId() == 2 and ctx.attemptNumber() == 0:
            Path(failures, f"before-commit-{ctx.taskAttemptId()}").touch()
            raise RuntimeError("injected failure after the rows went in, before the commit")

    return apply


def test_executors_apply_each_message_once_through_task_retries(source, spark, kafka_bootstrap, topic_name, pg_table, tmp_path) -> None:  # noqa: ANN001
    """local[2,4], four Kafka partitions: partition 2's first attempt fails inside its
    transaction, partition 1's after its commit; Spark retries both. Every record is applied
    once, republished ones included."""
    url, table = pg_table
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    n = 2000
    sent = _produce(kafka_bootstrap, topic_name, n, republish_every=100)
    failures = tmp_path / "failures"
    failures.mkdir()

    apply = _apply_failing_partition_2_once(table, str(failures))
    sink = ExactlyOnceSink(url, apply=apply, checkpoint_table=f"{table}_batches", columns=["value", "offset"])
    sink._tasks = _FailAfterCommit(url, None, f"{table}_batches", "default", True, apply)
    sink._tasks.failures = str(failures)
    query = (kafka_stream(spark, source, kafka_bootstrap, topic_name, sent).writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None

    # Every batch's partitions 1 and 2 failed once (one batch when the source honours the limit).
    batches = sink.applied_batches
    assert batches >= 1
    assert sorted(f.name.split("-")[0] for f in failures.iterdir()) == ["after"] * batches + ["before"] * batches
    assert _count(url, f"SELECT count(*), count(DISTINCT v) FROM {table}") == (n, n)
    assert sink.dropped_duplicates == sent - n
    assert _count(url, f"SELECT count(*), sum(input_rows), sum(applied_rows) FROM {table}_batches_tasks") == (
        4 * batches, sent, n)


def test_outbox_writer_rows_come_back_through_kafka_once(source, spark, kafka_bootstrap, topic_name, pg_table, tmp_path) -> None:  # noqa: ANN001
    """DataFrame → outbox (``pyharvest.outbox``) → the harvester → Kafka → the sink: each row
    applied once, though a tenth of them were published twice (as the harvester may, at least
    once, when an acknowledgement is lost: same identity headers, same partition)."""
    url, table = pg_table
    outbox = f"{table}_outbox"  # dropped with the fixture's tables
    create_outbox_table(url, outbox)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    n = 1000
    rows = spark.range(0, n, numPartitions=2).selectExpr(
        f"'{topic_name}' AS topic", "cast(id % 37 AS string) AS key", "cast(concat('row-', cast(id AS string)) AS binary) AS value")
    rows.write.format("pyharvest.outbox").option("url", url).option("table", outbox).mode("append").save()

    harvest = Harvest(Config(base_kafka_config={"bootstrap.servers": kafka_bootstrap},
                             leader_group_id=f"spark-rt-{uuid.uuid4().hex[:8]}", data_source=url, outbox_table=outbox,
                             limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05)))
    harvest.start()
    try:
        wait_until(lambda: _count(url, f"SELECT count(*) FROM {outbox}") == (0,), 120,
                   "the harvester to publish and purge the outbox", interval=0.2)
    finally:
        harvest.stop()
        assert harvest.join(30)
    published = read_topic(kafka_bootstrap, topic_name, expect=n)
    assert len(published) >= n
    again = published[::10]
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for partition, key, value, headers in again:
        p.produce(topic_name, key=key, value=value, headers=headers, partition=partition)
    p.flush(30)
    sent = len(published) + len(again)

    def apply(conn, batch) -> None:  # noqa: ANN001
        insert_rows(conn, table, ["v", "p", "o"], zip(batch.column("value").to_pylist(),
                                                     batch.column("partition").to_pylist(),
                                                     batch.column("offset").to_pylist(), strict=True))

    sink = ExactlyOnceSink(url, apply=apply, checkpoint_table=f"{table}_batches", columns=["value", "partition", "offset"])
    query = (kafka_stream(spark, source, kafka_bootstrap, topic_name, 400).writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    assert _count(url, f"SELECT count(*), count(DISTINCT v) FROM {table}") == (n, n)
    assert sink.dropped_duplicates == sent - n


def test_without_headers_the_sink_names_the_connector_option(spark, pg_table) -> None:  # noqa: ANN001
    url, table = pg_table
    sink = ExactlyOnceSink(url, apply=lambda conn, batch: None, checkpoint_table=f"{table}_batches", query_id="q-h")
    df = spark.createDataFrame([("t", 0, 0, b"k", b"v")], "topic string, partition int, offset long, key binary, value binary")
    with pytest.raises(ConfigError, match=r'includeHeaders", "true"'):
        sink(df, 0)
    assert sink.applied_batches == 0


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
