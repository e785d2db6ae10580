"""One local SparkSession for the whole Spark suite; the suite is skipped without PySpark.

``local[2,4]``: two cores, and a failed task is retried up to four times, as on a cluster,
so the tests can fail a task's first attempt and watch the retry. Every session loads Spark's
Kafka connector (``spark.jars.packages``: ``~/.m2`` or Ivy's cache, else Maven Central on a
fresh machine), so that the streaming tests run on ``format("kafka")`` as users do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="the Spark suite needs PySpark 4: pip install 'pyharvest[spark]'")
pytest.importorskip("pyarrow", reason="the Spark suite needs pyarrow: pip install 'pyharvest[spark]'")

import pyspark  # noqa: E402

from tests.helpers.spark import SPARK_ENV, spark_builder  # noqa: E402

if int(pyspark.__version__.split(".")[0]) < 4:
    pytest.skip(f"the Spark suite needs PySpark 4 (found {pyspark.__version__})", allow_module_level=True)


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
