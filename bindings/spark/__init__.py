"""Spark for pyharvest (PySpark 4, its Python Data Source API, pyarrow).

* ``df.write.format("pyharvest.outbox")``: a DataFrame into the outbox (or rows into a
  table together with their events), all or nothing per job.
* :func:`kafka_package`: the coordinate of Spark's own Kafka connector for the installed PySpark,
  for ``spark.jars.packages``; ``spark.readStream.format("kafka")`` is the documented source.
* ``spark.readStream.format("pyharvest.kafka")``: Kafka topics as a stream, through
  confluent-kafka; a fallback where the connector's jars cannot be fetched.
* :class:`ExactlyOnceSink`: a ``foreachBatch`` function applying each micro-batch to a
  database exactly once; :func:`insert_rows`, a bulk insert for its ``apply``.

Call :func:`register` once per session. See ``docs/spark.md``.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"pyharvest.bindings.spark needs PySpark 4 and pyarrow: pip install 'pyharvest[spark]' ({e})"
    ) from e

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyharvest.bindings.spark.connector import KAFKA_CONNECTOR, kafka_package
    from pyharvest.bindings.spark.kafka_source import KafkaDataSource
    from pyharvest.bindings.spark.outbox_writer import OutboxDataSource, StagedPartition, WriteJobError
    from pyharvest.bindings.spark.registration import register
    from pyharvest.bindings.spark.sink import OUTBOX_HEADER, RECORD_ID_HEADER, ExactlyOnceSink, insert_rows
    from pyharvest.bindings.spark.staging import drop_stale_staging

# Imported on first use: Spark's Python workers import this package to unpickle a task's
# function, and a Kafka read task then needs neither SQLAlchemy nor a database driver (about a
# second of a worker's start-up).
_HOMES = {
    "KAFKA_CONNECTOR": "connector",
    "kafka_package": "connector",
    "OUTBOX_HEADER": "sink",
    "RECORD_ID_HEADER": "sink",
    "ExactlyOnceSink": "sink",
    "insert_rows": "sink",
    "KafkaDataSource": "kafka_source",
    "OutboxDataSource": "outbox_writer",
    "StagedPartition": "outbox_writer",
    "WriteJobError": "outbox_writer",
    "register": "registration",
    "drop_stale_staging": "staging",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "KAFKA_CONNECTOR",
    "OUTBOX_HEADER",
    "RECORD_ID_HEADER",
    "ExactlyOnceSink",
    "KafkaDataSource",
    "OutboxDataSource",
    "StagedPartition",
    "WriteJobError",
    "drop_stale_staging",
    "insert_rows",
    "kafka_package",
    "register",
]
