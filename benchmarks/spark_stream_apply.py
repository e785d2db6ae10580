"""Kafka → PostgreSQL, exactly once: pyharvest.kafka source + ExactlyOnceSink (COPY in apply,
on the executors: one task per Kafka partition).

    python benchmarks/spark_stream_apply.py [--messages 200000] [--bootstrap host:port]

Without --bootstrap an embedded broker is started. Messages carry the harvester's identity
headers, so the sink's de-duplication runs for every message. Prints messages/s of a
Trigger.AvailableNow run over the backlog, the query's start-up included. Target on a 2-core
machine: >= 40,000/s for 200,000 messages.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import uuid

import sqlalchemy as sa


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--batch", type=int, default=250_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--bootstrap")
    ap.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from pyharvest.bindings.kafka.embedded import EmbeddedBroker

    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(EmbeddedBroker()).bootstrap_servers
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions)])[topic].result(15)
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i in range(args.messages):
            p.produce(topic, key=f"k{i % 1000}".encode(), value=b"x" * 40,
                      headers=[("pyharvest-outbox", "outbox"), ("pyharvest-record-id", str(i))])
            if i % 10_000 == 0:
                p.poll(0)
        p.flush(60)

        from pyspark.sql import SparkSession

        from pyharvest.bindings.spark import ExactlyOnceSink, register
        from pyharvest.bindings.spark.exactly_once import insert_rows

        spark = (SparkSession.builder.master(f"local[{args.partitions}]").config("spark.driver.memory", "1g")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
        stack.callback(spark.stop)
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        table = "bench_spark_applied"
        engine = sa.create_engine(args.url)
        with engine.begin() as c:
            for t in (table, f"{table}_batches", f"{table}_batches_seen", f"{table}_batches_tasks"):
                c.exec_driver_sql(f"DROP TABLE IF EXISTS {t}")
            c.exec_driver_sql(f"CREATE TABLE {table} (k BYTEA, v BYTEA, p INT, o BIGINT)")

        def apply(conn, batch) -> None:  # noqa: ANN001
            cols = [batch.column(c).to_pylist() for c in ("key", "value", "partition", "offset")]
            insert_rows(conn, table, ["k", "v", "p", "o"], zip(*cols))

        sink = ExactlyOnceSink(args.url, apply=apply, checkpoint_table=f"{table}_batches",
                               columns=["key", "value", "partition", "offset"])
        df = (spark.readStream.format("pyharvest.kafka").option("bootstrap.servers", bootstrap).option("topics", topic)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(args.batch)).load())
        checkpoint = stack.enter_context(tempfile.TemporaryDirectory(prefix="pyharvest-bench-"))
        t = time.perf_counter()
        q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        elapsed = time.perf_counter() - t
        with engine.connect() as c:
            n = c.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()
        assert n == args.messages, n
        print(f"{n} messages in {elapsed:.2f}s = {n / elapsed:,.0f} messages/s "
              f"({sink.applied_batches} batches, includes query start-up)", flush=True)
        with engine.begin() as c:
            for t2 in (table, f"{table}_batches", f"{table}_batches_seen", f"{table}_batches_tasks"):
                c.exec_driver_sql(f"DROP TABLE IF EXISTS {t2}")
        engine.dispose()


if __name__ == "__main__":
    main()
