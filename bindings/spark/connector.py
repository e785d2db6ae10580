"""Spark's own Kafka connector (``spark.readStream.format("kafka")``): its Maven coordinate.

The connector is a JVM artifact, not part of PySpark's wheel. Its pom pins the Spark modules to
its own release, so the coordinate must name exactly the running PySpark's version; Spark 4 is
built for Scala 2.13 only.
"""

from __future__ import annotations

import re

from pyharvest.core.errors import ConfigError

__all__ = ["KAFKA_CONNECTOR", "kafka_package"]

#: The connector's group and artifact, without a version.
KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13"

_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def kafka_package(spark_version: str | None = None) -> str:
    """The ``spark.jars.packages`` coordinate of Spark's Kafka connector for ``spark_version``
    (default: the installed PySpark's), e.g. ``org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0``.

    Spark resolves it when the session starts: from ``~/.m2`` or its Ivy cache, else from Maven
    Central. ``SparkSession.builder.config("spark.jars.packages", kafka_package())``.
    """
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    # A development build (4.2.0.dev0) has no artifact of its own: its release's is the match.
    release = _RELEASE.match(spark_version)
    if release is None or int(release.group(1)) < 4:
        raise ConfigError(
            "spark_version",
            f"expected a Spark 4 release such as 4.2.0, got {spark_version!r} (pyharvest needs PySpark 4)",
        )
    return f"{KAFKA_CONNECTOR}:{release.group(0)}"
