"""One local SparkSession for the whole Spark suite; the suite is skipped without PySpark.

``local[2,4]``: two cores, and a failed task is retried up to four times, as on a cluster,
so the tests can fail a task's first attempt and watch the retry. Every session loads Spark's
Kafka connector (``spark.jars.packages``: ``~/.m2`` or Ivy's cache, else Maven Central on a
fresh machine), so that the streaming tests run on ``format("kafka")`` as users do.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="the Spark suite needs PySpark 4: pip install 'pyharvest[spark]'")
pytest.importorskip("pyarrow", reason="the Spark suite needs pyarrow: pip install 'pyharvest[spark]'")

import pyspark  # noqa: E402

if int(pyspark.__version__.split(".")[0]) < 4:
    pytest.skip(f"the Spark suite needs PySpark 4 (found {pyspark.__version__})", allow_module_level=True)

# Spark's Python workers run outside the checkout (tox runs the suite from a directory of its
# own, on the installed wheel), where `tests` cannot be imported: the functions the tests hand
# to Spark travel by value, as a script's own functions do, and pyharvest's by reference.
from pyspark import cloudpickle  # noqa: E402

import tests  # noqa: E402

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


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    for k, v in SPARK_ENV.items():
        os.environ.setdefault(k, v)
    session = spark_builder("pyharvest-tests").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    from pyharvest.bindings.spark import register

    register(session)
    try:
        yield session
    finally:
        session.stop()
        # py4j logs at INFO while the interpreter exits, after pytest closed its streams.
        import logging

        logging.getLogger("py4j").setLevel(logging.WARNING)
