"""``register(spark)``: make the ``pyharvest.outbox`` and ``pyharvest.kafka`` formats known to a session."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession

from pyharvest.bindings.spark.arrow_rows import EventFunction
from pyharvest.bindings.spark.kafka_source import KafkaDataSource
from pyharvest.bindings.spark.outbox_writer import OutboxDataSource
from pyharvest.core.errors import ConfigError

__all__ = ["register"]


def register(spark: SparkSession, events: Mapping[str, EventFunction] | None = None) -> None:
    """Register the data sources with ``spark``.

    ``events`` names functions the writer's ``events`` option can refer to: each takes a row
    (a dict) and returns the outbox records (``OutboxRecord`` or ``(topic, key, value[,
    headers])``) to stash for it. Calling ``register`` again replaces the set.
    """
    functions = dict(events or {})
    for name, fn in functions.items():
        if not isinstance(name, str) or not name or not callable(fn):
            raise ConfigError("events", f"expected names mapped to callables, got {name!r}: {fn!r}")
    # A class built here is pickled by value, carrying the functions to the Python workers
    # that plan and run the job (a module-level registry would be empty there).
    source = type("OutboxDataSource", (OutboxDataSource,), {"event_functions": functions, "__module__": __name__})
    spark.dataSource.register(source)
    spark.dataSource.register(KafkaDataSource)
