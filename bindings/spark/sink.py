"""``ExactlyOnceSink``: a ``foreachBatch`` function applying each micro-batch to a database
exactly once, on the executors.

Each Spark task applies its own partition of the batch, in one transaction with a row naming
the partition (:mod:`.partition_apply`); the driver then records the batch. Nothing is
collected to the driver, so the sink grows with the executors.

Three things can make a message arrive twice, and each has its own defence:

* Spark retries a task (or runs a speculative copy). The partition's row, written in the
  same transaction as its changes, lets one attempt commit; the others apply nothing.
* Spark replays a micro-batch after the driver died (same query id, batch id, offsets). A
  batch the driver recorded is skipped whole; in one it had not, the partitions that had
  committed are not applied again.
* The harvester publishes at least once, so one outbox record may appear at two offsets.
  It stamps ``pyharvest-outbox`` and ``pyharvest-record-id`` headers; the sink remembers the
  identities it applied (for ``dedupe_retention``) and drops repeats. Messages without
  those headers are identified by topic/partition/offset.

Storage stays bounded: batch and partition rows more than ``keep_batches`` behind are deleted
with each batch, identities older than ``dedupe_retention`` every ten minutes.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from pyharvest.bindings.spark.database import Database
from pyharvest.bindings.spark.partition_apply import IDENTITY_COLUMN, ApplyFunction, PartitionApply
from pyharvest.bindings.spark.sink_tables import IDENTITY_LENGTH
from pyharvest.bindings.spark.sink_tasks import APPLIED_SCHEMA, TaskApply
from pyharvest.bindings.sql.bulk_insert import BulkInsert
from pyharvest.core.errors import BindingError, ConfigError
from pyharvest.core.outbox.identity import OUTBOX_HEADER, RECORD_ID_HEADER
from pyharvest.plugins.api import parse_table_name

__all__ = [
    "IDENTITY_COLUMN",
    "IDENTITY_LENGTH",
    "OUTBOX_HEADER",
    "RECORD_ID_HEADER",
    "ApplyFunction",
    "ExactlyOnceSink",
    "insert_rows",
]

log = logging.getLogger("pyharvest.spark")

PRUNE_INTERVAL_SECONDS = 600.0


_inserts: dict[tuple[str, tuple[str, ...]], BulkInsert] = {}
_MAX_INSERTS = 256


def insert_rows(conn: sa.Connection, table: str, columns: list[str], rows: Iterable[tuple[Any, ...]]) -> int:
    """Bulk-insert rows into ``table`` (``name`` or ``schema.name``) in ``conn``'s transaction,
    through the dialect's bulk writer where it has one (PostgreSQL: ``COPY``, text format: the
    table's types are not known here), else ``executemany`` (multi-row inserts on MySQL). For
    use inside ``apply``."""
    key = (table, tuple(columns))
    insert = _inserts.get(key)
    if insert is None:
        name = parse_table_name(table)
        described = sa.Table(name.name, sa.MetaData(), *(sa.Column(c) for c in columns), schema=name.schema)
        if len(_inserts) >= _MAX_INSERTS:
            _inserts.clear()
        insert = _inserts[key] = BulkInsert(described, columns)
    return insert(conn, rows)


def _identity_sql() -> str:
    def header(name: str) -> str:
        return f"cast(try_element_at(filter(headers, h -> h.key = '{name}'), 1).value as string)"

    ident = (f"coalesce(concat('o:', {header(OUTBOX_HEADER)}, ':', {header(RECORD_ID_HEADER)}), "
             f"concat('k:', topic, ':', cast(partition as string), ':', cast(offset as string)))")
    return f"CASE WHEN length({ident}) > 200 THEN sha2({ident}, 256) ELSE {ident} END"


class ExactlyOnceSink:
    """``query.writeStream.foreachBatch(ExactlyOnceSink(url, apply=fn)).start()``.

    ``apply(conn, batch)`` runs on the executors, once per partition of each micro-batch, with
    a SQLAlchemy connection inside that partition's transaction and a pyarrow Table of the
    partition's messages not applied before. It travels to the executors pickled (a
    module-level function, or a closure over picklable values). ``name`` scopes the
    remembered identities (give each logical sink its own). ``query_id`` defaults to the
    streaming query's id, which survives restarts from the same checkpoint location.
    ``columns`` limits what the tasks hand to ``apply`` (default: every column).
    """

    def __init__(
        self,
        url: str,
        apply: ApplyFunction,
        checkpoint_table: str = "pyharvest_spark_batches",
        *,
        binding: str | None = None,
        name: str = "default",
        dedupe: bool = True,
        dedupe_retention: timedelta = timedelta(days=7),
        keep_batches: int = 100,
        query_id: str | None = None,
        columns: list[str] | None = None,
    ) -> None:
        if not callable(apply):
            raise ConfigError("apply", f"expected a function (connection, pyarrow.Table) -> None, got {apply!r}")
        if not name or len(name) > 100:
            raise ConfigError("name", "expected 1-100 characters")
        if keep_batches < 1:
            raise ConfigError("keep_batches", "must be at least 1")
        parse_table_name(checkpoint_table)
        self._url = url
        self._binding = binding
        self.apply = apply
        self.name = name
        self.dedupe = dedupe
        self.dedupe_retention = dedupe_retention
        self.keep_batches = keep_batches
        self.query_id = query_id
        self.columns = list(columns) if columns else None
        self._tasks = PartitionApply(url, binding, checkpoint_table, name, dedupe, apply)
        self._tables = self._tasks.tables
        self._db: Database | None = None
        self._next_prune = 0.0
        self.applied_batches = 0
        self.skipped_batches = 0
        self.dropped_duplicates = 0

    def __repr__(self) -> str:
        return f"ExactlyOnceSink(name={self.name!r}, checkpoint_table={self._tables.batches.fullname!r})"

    def _database(self) -> Database:
        if self._db is None:
            db = Database(self._url, self._binding)
            self._tables.create(db.engine)
            self._db = db
        return self._db

    @staticmethod
    def _require_pandas() -> None:
        if importlib.util.find_spec("pandas") is None:
            raise BindingError(
                "the exactly-once sink runs its tasks through PySpark's mapInArrow, which needs pandas "
                "(>= 2.2): pip install 'pyharvest[spark]'; nothing was applied"
            )

    def _resolve_query_id(self, df: Any) -> str:
        if self.query_id:
            return self.query_id
        qid = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if not qid:
            raise ConfigError(
                "query_id", "cannot tell the streaming query's id here; pass ExactlyOnceSink(query_id=...)"
            )
        return str(qid)

    def __call__(self, df: Any, batch_id: int) -> None:
        self._require_pandas()  # before the batch is looked at: PySpark would fail only once it runs
        db = self._database()
        query_id = self._resolve_query_id(df)
        b = self._tables.batches
        done = sa.select(sa.literal(1)).where(b.c.query_id == query_id, b.c.batch_id == batch_id)
        with db.engine.connect() as conn:
            if conn.execute(done).first() is not None:
                self.skipped_batches += 1
                log.info("batch %d of query %s was applied before; skipped", batch_id, query_id)
                return
        if self.dedupe:
            missing = [c for c in ("topic", "partition", "offset", "headers") if c not in df.columns]
            if missing:
                raise ConfigError(
                    "dedupe",
                    f"needs the Kafka columns topic, partition, offset, headers (missing {', '.join(missing)}); "
                    "keep them in the batch (Spark's Kafka connector adds headers only with "
                    '.option("includeHeaders", "true")) or pass dedupe=False',
                )
            df = df.selectExpr("*", f"{_identity_sql()} AS {IDENTITY_COLUMN}")
        if self.columns:
            # Only what apply needs goes to the Python workers (nested headers are costly to convert).
            df = df.select(*self.columns, *([IDENTITY_COLUMN] if self.dedupe else []))
        batch_time = datetime.now(UTC)
        # Each task applies its partition and commits (partition_apply); collect() returns once all have.
        try:
            df.mapInArrow(TaskApply(self._tasks, query_id, batch_id, batch_time), APPLIED_SCHEMA).collect()
        except Exception:
            log.warning("batch %d of query %s failed; partitions that committed stay applied and are not applied "
                        "again when the batch is replayed", batch_id, query_id)
            raise
        t = self._tables.tasks
        with db.engine.begin() as conn:
            conn.execute(sa.insert(b), {"query_id": query_id, "batch_id": batch_id, "applied_at": datetime.now(UTC)})
            totals = sa.select(sa.func.coalesce(sa.func.sum(t.c.input_rows), 0),
                               sa.func.coalesce(sa.func.sum(t.c.applied_rows), 0))
            given, applied = conn.execute(totals.where(t.c.query_id == query_id, t.c.batch_id == batch_id)).one()
            self._prune(conn, query_id, batch_id, batch_time)
        self.applied_batches += 1
        self.dropped_duplicates += int(given) - int(applied)

    def _prune(self, conn: sa.Connection, query_id: str, batch_id: int, now: datetime) -> None:
        b, t, s = self._tables.batches, self._tables.tasks, self._tables.seen
        conn.execute(sa.delete(b).where(b.c.query_id == query_id, b.c.batch_id < batch_id - self.keep_batches))
        conn.execute(sa.delete(t).where(t.c.query_id == query_id, t.c.batch_id < batch_id - self.keep_batches))
        # Unindexed on purpose (an index on the time would slow every batch's inserts): a scan
        # now and then is cheaper.
        if self.dedupe and time.monotonic() >= self._next_prune:
            conn.execute(sa.delete(s).where(s.c.sink == self.name, s.c.applied_at < now - self.dedupe_retention))
            self._next_prune = time.monotonic() + PRUNE_INTERVAL_SECONDS
