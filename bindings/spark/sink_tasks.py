"""The exactly-once sink's Spark side: the function each task runs, through ``mapInArrow``.

``df.mapInArrow(TaskApply(...), APPLIED_SCHEMA).collect()`` hands each task its partition's
Arrow batches in the task's Python worker (nothing is collected but one row per partition,
saying what the task did). Spark retries a failed task and may run a speculative copy; the
partition's row in the sink's tables (:mod:`.partition_apply`) lets one attempt commit, and
``collect`` keeps one result per partition.

A Python data source writer would do the same, but Spark plans each batch's write and commits
it in Python processes of their own (two more interpreters starting, importing PySpark from its
zip archive, on the first batch: 2-5 s on two cores), where ``mapInArrow`` runs in the worker
that the tasks use anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

import pyarrow as pa

__all__ = ["APPLIED_SCHEMA", "AppliedPartition", "TaskApply", "task_time"]

#: What each task reports, as ``mapInArrow`` returns it (a DDL string for Spark).
APPLIED_SCHEMA = "partition int, attempt long, input_rows long, applied_rows long, skipped boolean"
_ARROW_SCHEMA = pa.schema([("partition", pa.int32()), ("attempt", pa.int64()), ("input_rows", pa.int64()),
                           ("applied_rows", pa.int64()), ("skipped", pa.bool_())])


@dataclass(frozen=True)
class AppliedPartition:
    """What one task attempt did with its partition."""

    partition: int
    attempt: int  # Spark's task attempt id: unique within the application
    input_rows: int
    applied_rows: int
    skipped: bool  # an earlier attempt, or an earlier run of the batch, had applied it

    def to_arrow(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([asdict(self)], schema=_ARROW_SCHEMA)


def task_time(batch_time: datetime, attempt: int) -> datetime:
    """The time a task attempt stamps on what it writes: unique per attempt within a run."""
    return batch_time + timedelta(microseconds=attempt)


# (query id, batch id, partition, attempt, time, batches) -> what the attempt did: PartitionApply.
PartitionFunction = Callable[[str, int, int, int, datetime, Iterable[pa.RecordBatch]], AppliedPartition]


class TaskApply:
    """The function a batch's tasks run: one partition, applied by the sink's ``PartitionApply``
    (pickled to the executors with the user's ``apply``)."""

    def __init__(self, partition_apply: PartitionFunction, query_id: str, batch_id: int,
                 batch_time: datetime) -> None:
        self.partition_apply = partition_apply
        self.query_id = query_id
        self.batch_id = batch_id
        self.batch_time = batch_time

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("the exactly-once sink's tasks run inside Spark")
        attempt = ctx.taskAttemptId()
        done = self.partition_apply(self.query_id, self.batch_id, ctx.partitionId(), attempt,
                                    task_time(self.batch_time, attempt), batches)
        yield done.to_arrow()
