"""Kafka → PostgreSQL, exactly once: a Kafka source + ExactlyOnceSink (COPY in apply, on the
executors: one task per Kafka partition).

    python benchmarks/spark_stream_apply.py --bootstrap 127.0.0.1:19092 [--source kafka|pyharvest.kafka]
        [--messages 2000000] [--partitions 4] [--master local[2]] [--batch 250000]

``--source kafka`` (the default) is Spark's own connector, fetched through
``spark.jars.packages``; ``pyharvest.kafka`` the Python fallback. Without --bootstrap an
embedded broker is started. Messages carry the harvester's identity headers, so the sink's
de-duplication runs for every message. A Trigger.AvailableNow run over the backlog, in
micro-batches of --batch messages; it prints:

* start-up: from the session's creation to the first committed batch (the JVM, Ivy resolving
  the connector, Python workers, the first batch's planning and its tasks);
* steady: the messages of the second to last batches over the time from the first batch's
  commit to the last one's;
* the 1-minute load average before and after (the machine is shared).

Target on a 2-core machine: steady >= 40,000 messages/s for 2,000,000 messages on 4 partitions.
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


def produce(bootstrap: str, topic: str, messages: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                  "queue.buffering.max.messages": 1_000_000})
    for i in range(messages):
        args = (topic,)
        kwargs = {"key": f"k{i % 1000}".encode(), "value": b"x" * 40,
                  "headers": [("pyharvest-outbox", "outbox"), ("pyharvest-record-id", str(i))]}
        while True:
            try:
                p.produce(*args, **kwargs)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                p.poll(0.1)
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--batch", type=int, default=250_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--source", choices=["kafka", "pyharvest.kafka"], default="kafka")
    ap.add_argument("--bootstrap")
    ap.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from confluent_kafka.admin import AdminClient, NewTopic

    from pyharvest.bindings.kafka.embedded import EmbeddedBroker

    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(EmbeddedBroker()).bootstrap_servers
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions)])[topic].result(15)
        stack.callback(lambda: admin.delete_topics([topic])[topic].result(30))
        t = time.perf_counter()
        produce(bootstrap, topic, args.messages)
        print(f"produced {args.messages} messages in {time.perf_counter() - t:.1f}s", flush=True)

        table = "bench_spark_applied"
        tables = (table, f"{table}_batches", f"{table}_batches_seen", f"{table}_batches_tasks")
        engine = sa.create_engine(args.url)
        with engine.begin() as c:
            for t2 in tables:
                c.exec_driver_sql(f"DROP TABLE IF EXISTS {t2}")
            c.exec_driver_sql(f"CREATE TABLE {table} (k BYTEA, v BYTEA, p INT, o BIGINT)")

        load_before = os.getloadavg()[0]
        t_session = time.perf_counter()
        from pyspark.sql import SparkSession

        from pyharvest.bindings.spark import ExactlyOnceSink, kafka_package, register
        from pyharvest.bindings.spark.sink import insert_rows

        builder = (SparkSession.builder.master(args.master).config("spark.driver.memory", "1g")
                   .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
        if args.source == "kafka":  # only then: resolving the connector is part of its start-up
            builder = builder.config("spark.jars.packages", kafka_package())
        spark = builder.getOrCreate()
        stack.callback(spark.stop)
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)

        def apply(conn, batch) -> None:  # noqa: ANN001
            cols = [batch.column(c).to_pylist() for c in ("key", "value", "partition", "offset")]
            insert_rows(conn, table, ["k", "v", "p", "o"], zip(*cols))

        sink = ExactlyOnceSink(args.url, apply=apply, checkpoint_table=f"{table}_batches",
                               columns=["key", "value", "partition", "offset"])
        commits: list[float] = []

        def timed(df, batch_id: int) -> None:  # noqa: ANN001
            sink(df, batch_id)
            commits.append(time.perf_counter())

        df = (spark.readStream.format(args.source).option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("includeHeaders", "true")
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(args.batch)).load())
        checkpoint = stack.enter_context(tempfile.TemporaryDirectory(prefix="pyharvest-bench-"))
        q = (df.writeStream.foreachBatch(timed).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        load_after = os.getloadavg()[0]
        with engine.connect() as c:
            n = c.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()
            per_batch = dict(c.exec_driver_sql(
                f"SELECT batch_id, sum(input_rows) FROM {table}_batches_tasks GROUP BY batch_id").all())
        assert n == args.messages, n
        startup = commits[0] - t_session
        total = commits[-1] - t_session
        if len(commits) > 1:
            steady_messages = sum(int(v) for b, v in per_batch.items() if b != min(per_batch))
            steady = f"{steady_messages / (commits[-1] - commits[0]):,.0f} messages/s steady " \
                     f"({steady_messages} messages in {commits[-1] - commits[0]:.2f}s)"
        else:
            steady = "steady: n/a (one batch)"
        print(f"source={args.source} master={args.master} partitions={args.partitions}: {n} messages, "
              f"{len(commits)} batches; start-up {startup:.2f}s; {steady}; end to end {total:.2f}s = "
              f"{n / total:,.0f} messages/s; load {load_before:.2f} -> {load_after:.2f}", flush=True)
        with engine.begin() as c:
            for t2 in tables:
                c.exec_driver_sql(f"DROP TABLE IF EXISTS {t2}")
        engine.dispose()


if __name__ == "__main__":
    main()
