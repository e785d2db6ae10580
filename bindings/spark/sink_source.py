"""The exactly-once sink's Spark side: a Python data source writer per sink, through which
``df.write.format(name).save()`` hands each task its partition's Arrow batches.

Spark runs ``writer()`` and ``commit()`` in Python processes of their own, once per
micro-batch, and each imports what unpickling the data source needs. So this module imports
only PySpark, and the sink's :class:`~.partition_apply.PartitionApply` (the user's ``apply``
and the database code) travels as pickled bytes, unpickled only inside the tasks: planning a
batch's write costs no SQLAlchemy import.
"""

from __future__ import annotations

import logging
import pickle
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pyharvest.core.errors import BindingError

__all__ = ["AppliedPartition", "SinkDataSource", "SinkWriter", "sink_source", "task_time"]

log = logging.getLogger("pyharvest.spark")


@dataclass(frozen=True)
class AppliedPartition(WriterCommitMessage):
    """What one task attempt did with its partition."""

    partition: int
    attempt: int  # Spark's task attempt id: unique within the application
    input_rows: int
    applied_rows: int
    skipped: bool  # an earlier attempt, or an earlier run of the batch, had applied it


def task_time(batch_time: datetime, attempt: int) -> datetime:
    """The time a task attempt stamps on what it writes: unique per attempt within a run."""
    return batch_time + timedelta(microseconds=attempt)


class SinkDataSource(DataSource):
    """One subclass per sink (:func:`sink_source`) carries its pickled ``PartitionApply``."""

    partition_apply: ClassVar[bytes]
    format_name: ClassVar[str] = "pyharvest.sink"

    @classmethod
    def name(cls) -> str:
        return cls.format_name

    def writer(self, schema: StructType, overwrite: bool) -> SinkWriter:
        o = self.options
        return SinkWriter(self.partition_apply, o["query_id"], int(o["batch_id"]),
                          datetime.fromisoformat(o["batch_time"]))


class SinkWriter(DataSourceArrowWriter):
    def __init__(self, partition_apply: bytes, query_id: str, batch_id: int, batch_time: datetime) -> None:
        self.partition_apply = partition_apply
        self.query_id = query_id
        self.batch_id = batch_id
        self.batch_time = batch_time

    def write(self, iterator: Iterator[Any]) -> AppliedPartition:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("the exactly-once sink's writer runs inside a Spark task")
        attempt = ctx.taskAttemptId()
        apply = pickle.loads(self.partition_apply)  # noqa: S301 - made by sink_source in the driver
        done: AppliedPartition = apply(self.query_id, self.batch_id, ctx.partitionId(), attempt,
                                       task_time(self.batch_time, attempt), iterator)
        return done

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        # Every partition committed in its own task; the driver records the batch next.
        for m in messages:
            if not isinstance(m, AppliedPartition):
                raise BindingError(f"batch {self.batch_id}: a task reported {m!r} instead of its applied partition")

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        log.warning("batch %d of query %s failed; partitions that committed stay applied and are not applied "
                    "again when the batch is replayed", self.batch_id, self.query_id)


def sink_source(partition_apply: Any) -> type[SinkDataSource]:
    """A data source class of its own for one sink, registered under a name of its own, with
    the sink's ``PartitionApply`` pickled by value (the user's ``apply`` travels with it)."""
    from pyspark import cloudpickle

    return type("ExactlyOnceSinkSource", (SinkDataSource,), {
        "partition_apply": cloudpickle.dumps(partition_apply),  # type: ignore[no-untyped-call]
        "format_name": f"pyharvest.sink.{uuid.uuid4().hex[:16]}",
        "__module__": __name__,
    })
