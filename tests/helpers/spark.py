"""Spark for the tests: a local session's builder and environment, and the two Kafka sources
the streaming tests run on, read with the same options.

``local[2,4]``: two cores, and a failed task is retried up to four times, as on a cluster. The
sources: ``kafka`` is Spark's own connector (the documented path); ``pyharvest.kafka`` the
Python fallback, which takes the connector's option names.
"""

from __future__ import annotations

import sys
from typing import Any

from pyspark import cloudpickle

import tests

# Spark's Python workers run outside the checkout (tox runs the suite from a directory of its
# own, on the installed wheel), where `tests` cannot be imported: the functions the tests hand
# to Spark travel by value, as a script's own functions do, and pyharvest's by reference. Here,
# so that the suite (through its conftest) and the stream driver it starts both register it.
cloudpickle.register_pickle_by_value(tests)

SPARK_ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def spark_builder(app: str):  # noqa: ANN201 - pyspark's builder type
    from pyspark.sql import SparkSession

    from pyharvest.bindings.spark import kafka_package

    return (
        SparkSession.builder.master("local[2,4]")
        .appName(app)
        .config("spark.driver.memory", "768m")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.jars.packages", kafka_package())
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )


#: Spark's connector first: the path users take.
SOURCES = ("kafka", "pyharvest.kafka")


def kafka_stream(spark: Any, source: str, bootstrap: str, topic: str, max_per_trigger: int) -> Any:
    return (
        spark.readStream.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_per_trigger))
        .load()
    )
