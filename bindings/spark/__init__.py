"""Spark for pyharvest (PySpark 4, its Python Data Source API, pyarrow).

* ``df.write.format("pyharvest.outbox")``: a DataFrame into the outbox (or rows into a
  table together with their events), all or nothing per job.
* ``spark.readStream.format("pyharvest.kafka")``: Kafka topics as a stream, through confluent-kafka.
* :class:`ExactlyOnceSink`: a ``foreachBatch`` function applying each micro-batch to a
  database exactly once.

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

from pyharvest.bindings.spark.exactly_once import OUTBOX_HEADER, RECORD_ID_HEADER, ExactlyOnceSink
from pyharvest.bindings.spark.kafka_source import KafkaDataSource
from pyharvest.bindings.spark.outbox_writer import OutboxDataSource, StagedPartition, WriteJobError
from pyharvest.bindings.spark.registration import register
from pyharvest.bindings.spark.staging import drop_stale_staging

__all__ = [
    "OUTBOX_HEADER",
    "RECORD_ID_HEADER",
    "ExactlyOnceSink",
    "KafkaDataSource",
    "OutboxDataSource",
    "StagedPartition",
    "WriteJobError",
    "drop_stale_staging",
    "register",
]
