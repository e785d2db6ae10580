"""DataFrame → outbox on PostgreSQL: 1M narrow rows through df.write.format("pyharvest.outbox").

    python benchmarks/spark_outbox_write.py [--rows 1000000] [--url postgresql+psycopg://postgres@127.0.0.1/test]

Prints rows/s for a cold first job (Python workers starting) and warm repeats. Target on a
2-core machine: >= 250,000 rows/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import sqlalchemy as sa


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pyharvest.bindings.spark import register
    from pyharvest.bindings.sql import create_outbox_table

    spark = (SparkSession.builder.master(f"local[{args.partitions}]").config("spark.driver.memory", "1g")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    table = "bench_spark_outbox"
    engine = sa.create_engine(args.url)
    with engine.begin() as c:
        c.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    create_outbox_table(args.url, table)
    df = spark.range(0, args.rows, numPartitions=args.partitions).selectExpr(
        "'orders' AS topic", "cast(id % 10000 AS string) AS key", "cast(cast(id AS string) AS binary) AS value"
    )
    try:
        for i in range(args.repeats):
            with engine.begin() as c:
                c.exec_driver_sql(f"TRUNCATE {table}")
            t = time.perf_counter()
            df.write.format("pyharvest.outbox").option("url", args.url).option("table", table).mode("append").save()
            elapsed = time.perf_counter() - t
            with engine.connect() as c:
                n = c.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()
            assert n == args.rows, n
            print(f"run {i + 1} ({'cold' if i == 0 else 'warm'}): {args.rows} rows in {elapsed:.2f}s = {args.rows / elapsed:,.0f} rows/s", flush=True)
    finally:
        with engine.begin() as c:
            c.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        engine.dispose()
        spark.stop()


if __name__ == "__main__":
    main()
