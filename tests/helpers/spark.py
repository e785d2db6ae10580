"""The two Kafka sources the streaming tests run on, read with the same options.

``kafka`` is Spark's own connector (the documented path); ``pyharvest.kafka`` the Python
fallback, which takes the connector's option names.
"""

from __future__ import annotations

from typing import Any

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
