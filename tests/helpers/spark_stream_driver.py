"""A streaming driver run as its own process by test_streaming (so the test can SIGKILL it, or
run two at once): Kafka topic → ExactlyOnceSink → a PostgreSQL table.

Usage: python -m tests.helpers.spark_stream_driver BOOTSTRAP TOPIC URL TABLE CHECKPOINT_DIR SOURCE MODE
SOURCE is ``kafka`` (Spark's connector) or ``pyharvest.kafka``. MODE is ``slow`` (small
batches with a pause each, runs until killed) or ``drain`` (Trigger.AvailableNow: everything
available, then exit).
"""

from __future__ import annotations

import sys
import time


def main(bootstrap: str, topic: str, url: str, table: str, checkpoint: str, source: str, mode: str) -> None:
    import os

    from tests.helpers.spark import SPARK_ENV, kafka_stream, spark_builder

    os.environ.update(SPARK_ENV)
    spark = spark_builder("pyharvest-stream-driver").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from pyharvest.bindings.spark import ExactlyOnceSink, insert_rows, register

    register(spark)

    def apply(conn, batch) -> None:  # noqa: ANN001
        rows = zip(batch.column("key").to_pylist(), batch.column("value").to_pylist(),
                   batch.column("partition").to_pylist(), batch.column("offset").to_pylist(), strict=True)
        insert_rows(conn, table, ["k", "v", "p", "o"], rows)
        if mode == "slow":
            # fixed sleep: a slow batch is the fault this mode injects: it widens the window in
            # which a kill (or a second driver) lands mid-batch; it waits for nothing.
            time.sleep(0.3)

    sink = ExactlyOnceSink(url, apply=apply, checkpoint_table=f"{table}_batches", columns=["key", "value", "partition", "offset"])
    stream = kafka_stream(spark, source, bootstrap, topic, 250 if mode == "slow" else 5000)
    writer = stream.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    if mode == "drain":
        writer.trigger(availableNow=True).start().awaitTermination()
    else:
        writer.trigger(processingTime="100 milliseconds").start().awaitTermination()
    print(f"applied={sink.applied_batches} skipped={sink.skipped_batches} duplicates={sink.dropped_duplicates}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:8])
