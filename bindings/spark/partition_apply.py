"""The exactly-once sink's work on the executors: each Spark task applies its own partition.

A task applies its partition of a micro-batch in one database transaction that also writes
the partition's row in the sink's task table (:mod:`.sink_tables`): its changes, the
identities it remembered and that row commit together or not at all. So:

* a task attempt that fails before its commit leaves nothing, and Spark's retry applies the
  partition;
* a task attempt that fails after its commit (or a speculative duplicate) finds the row and
  applies nothing; two attempts running at once cannot both commit, since the row's key
  (query id, batch id, partition) admits one;
* a micro-batch replayed after the driver died (same query id, batch id and offsets) applies
  only the partitions that had not committed.

With ``dedupe`` (the default) a partition found applied is not trusted to hold the same
messages as before: its messages go through the identity check again, which drops every one
already applied, so a replay that splits the batch differently still applies each record
once. Without it, the replay must split the batch the same way (the Kafka sources do, unless
the DataFrame is reshuffled on the way); a partition whose message count differs from the
first time fails with an error rather than guess.

The driver (:class:`~pyharvest.bindings.spark.sink.ExactlyOnceSink`) runs the tasks
through ``mapInArrow`` (:mod:`.sink_tasks`: the Arrow batches of each partition go straight to
the task's Python worker, nothing is collected) and, once all of them succeeded, records the
batch itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from itertools import chain
from typing import TypeVar

import pyarrow as pa
import sqlalchemy as sa

from pyharvest.bindings.spark.database import Database
from pyharvest.bindings.spark.sink_tables import SinkTables
from pyharvest.bindings.spark.sink_tasks import AppliedPartition
from pyharvest.bindings.sql.inbox.dedupe import IdentityStore
from pyharvest.core.errors import BindingError
from pyharvest.plugins.api import Dialect

__all__ = ["IDENTITY_COLUMN", "AppliedPartition", "ApplyFunction", "PartitionApply"]

log = logging.getLogger("pyharvest.spark")

IDENTITY_COLUMN = "_pyharvest_identity"

# apply(connection, batch): make the batch's changes through ``connection`` (inside the
# partition's transaction; do not commit). ``batch`` is a pyarrow Table of the new messages.
ApplyFunction = Callable[[sa.Connection, pa.Table], None]

_Batch = TypeVar("_Batch", pa.Table, pa.RecordBatch)


class _AppliedConcurrentlyError(Exception):
    """Another attempt committed the partition while this one was applying it."""


class PartitionApply:
    """Applies one partition of a micro-batch; pickled to the executors with the sink's data
    source (the user's ``apply`` travels with it)."""

    def __init__(self, url: str, binding: str | None, checkpoint_table: str, name: str, dedupe: bool,
                 apply: ApplyFunction) -> None:
        self.url = url
        self.binding = binding
        self.name = name
        self.dedupe = dedupe
        self.apply = apply
        self.tables = SinkTables.build(checkpoint_table)
        # The identities applied, per sink: the inbox's store (:mod:`pyharvest.bindings.sql.inbox.dedupe`).
        self._seen = IdentityStore(self.tables.seen, ("sink",), "identity", columns=("sink", "identity", "applied_at"))

    def __repr__(self) -> str:
        return f"PartitionApply(name={self.name!r}, tasks={self.tables.tasks.fullname!r})"

    def database(self) -> Database:
        return Database.shared(self.url, self.binding)

    def __call__(self, query_id: str, batch_id: int, partition: int, attempt: int, applied_at: datetime,
                 batches: Iterable[pa.RecordBatch]) -> AppliedPartition:
        """Apply one partition's messages (Arrow batches, with the identity column when
        deduplicating) in one transaction, unless an earlier attempt did. The identities of
        each Arrow batch are checked as it arrives, while Spark reads the next."""
        chunks = (b for b in batches if b.num_rows)
        first = next(chunks, None)
        if first is None:
            return AppliedPartition(partition, attempt, 0, 0, skipped=False)
        db = self.database()
        t = self.tables.tasks
        this = sa.and_(t.c.query_id == query_id, t.c.batch_id == batch_id, t.c.spark_partition == partition)
        n = 0
        try:
            with db.engine.begin() as conn:
                prior = conn.execute(sa.select(t.c.input_rows).where(this)).first()
                if prior is not None and not self.dedupe:
                    n = first.num_rows + sum(b.num_rows for b in chunks)
                    if prior.input_rows != n:
                        raise BindingError(
                            f"batch {batch_id} of query {query_id}, Spark partition {partition}: applied before with "
                            f"{prior.input_rows} message(s), replayed with {n}. Without dedupe the sink needs each "
                            "replayed batch split into the same partitions (no reshuffle before the sink); "
                            "nothing was applied"
                        )
                    return AppliedPartition(partition, attempt, n, 0, skipped=True)
                kept: list[pa.RecordBatch] = []
                earlier: set[str] = set()
                for chunk in chain((first,), chunks):
                    n += chunk.num_rows
                    kept.append(self.drop_seen(conn, db.dialect, chunk, applied_at, earlier) if self.dedupe else chunk)
                batch = pa.Table.from_batches(kept)
                if batch.num_rows:
                    self.apply(conn, batch)
                if prior is None:
                    row = {"query_id": query_id, "batch_id": batch_id, "spark_partition": partition,
                           "spark_attempt": attempt, "input_rows": n, "applied_rows": batch.num_rows,
                           "applied_at": applied_at}
                    try:
                        conn.execute(sa.insert(t), row)
                    except sa.exc.IntegrityError:
                        raise _AppliedConcurrentlyError from None
                else:  # applied before; the identities dropped whatever it had applied
                    conn.execute(sa.update(t).where(this).values(
                        spark_attempt=attempt, applied_rows=t.c.applied_rows + batch.num_rows, applied_at=applied_at))
        except _AppliedConcurrentlyError:
            log.info("batch %d partition %d: applied by another attempt meanwhile; this one rolled back",
                     batch_id, partition)
            return AppliedPartition(partition, attempt, n, 0, skipped=True)
        return AppliedPartition(partition, attempt, n, batch.num_rows, skipped=prior is not None)

    # -- identities ------------------------------------------------------------------------

    def drop_seen(self, conn: sa.Connection, dialect: Dialect, batch: _Batch, now: datetime,
                  earlier: set[str] | None = None) -> _Batch:
        """Remember the batch's identities; return the batch without the messages applied
        before, without repeats within it (or of ``earlier``, the identities of the
        partition's batches before it, which this adds to) and without the identity column."""
        identities: list[str] = batch.column(IDENTITY_COLUMN).to_pylist()
        before = earlier if earlier is not None else set()
        unique = [i for i in dict.fromkeys(identities) if i not in before]  # a repeat within the partition goes too
        # Rows this transaction remembered for an earlier batch carry the same time as those it
        # remembers now, so none of those identities may be passed again (the dialect's way tells
        # its own rows by the time).
        # The dialect's way tells its own rows by the time (see IdentityStore.insert_new).
        scope, values = {"sink": self.name}, {"applied_at": now}
        fresh = set(unique) - self._seen.insert_new(conn, scope, unique, values, dialect=dialect) if unique else set()
        before.update(unique)
        keep: list[bool] = []
        for ident in identities:
            if ident in fresh:
                keep.append(True)
                fresh.discard(ident)
            else:
                keep.append(False)
        kept = sum(keep)
        out = batch.drop_columns([IDENTITY_COLUMN])
        return out if kept == len(identities) else out.filter(pa.array(keep))
