"""``ExactlyOnceSink``: a ``foreachBatch`` function applying each micro-batch to a database
exactly once.

Two things can make a message arrive twice, and each has its own defence:

* Spark replays a micro-batch after a crash (same query id, same batch id, same offsets).
  The sink writes a ``(query id, batch id)`` row in the same transaction as the batch's
  changes; a batch whose row exists is skipped.
* The harvester publishes at least once, so one outbox record may appear at two offsets.
  It stamps ``pyharvest-outbox`` and ``pyharvest-record-id`` headers; the sink remembers the
  identities it applied (for ``dedupe_retention``) and drops repeats. Messages without
  those headers are identified by topic/partition/offset.

Storage stays bounded: checkpoint rows more than ``keep_batches`` behind are deleted with
each batch, identities older than ``dedupe_retention`` every ten minutes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from pyharvest.bindings.spark.database import Database
from pyharvest.bindings.sql.bulk_insert import BulkInsert
from pyharvest.core.errors import ConfigError
from pyharvest.core.identity import OUTBOX_HEADER, RECORD_ID_HEADER
from pyharvest.plugins.api import Dialect, UTCDateTime, parse_table_name

__all__ = ["IDENTITY_COLUMN", "OUTBOX_HEADER", "RECORD_ID_HEADER", "ApplyFunction", "ExactlyOnceSink", "insert_rows"]

log = logging.getLogger("pyharvest.spark")

IDENTITY_COLUMN = "_pyharvest_identity"
IDENTITY_LENGTH = 255
PRUNE_INTERVAL_SECONDS = 600.0

# apply(connection, batch): make the batch's changes through ``connection`` (inside the
# sink's transaction; do not commit). ``batch`` is a pyarrow Table of the new messages.
ApplyFunction = Callable[[sa.Connection, pa.Table], None]


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

    ``apply(conn, batch)`` gets a SQLAlchemy connection inside the batch's transaction and a
    pyarrow Table of the messages not applied before. ``name`` scopes the remembered
    identities (give each logical sink its own). ``query_id`` defaults to the streaming
    query's id, which survives restarts from the same checkpoint location. ``columns``
    limits what is collected to the driver for ``apply`` (default: every column).
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
        self._url = url
        self._binding = binding
        self.apply = apply
        self.name = name
        self.dedupe = dedupe
        self.dedupe_retention = dedupe_retention
        self.keep_batches = keep_batches
        self.query_id = query_id
        self.columns = list(columns) if columns else None
        table = parse_table_name(checkpoint_table)
        self._md = sa.MetaData()
        self._batches = sa.Table(
            table.name, self._md,
            sa.Column("query_id", sa.String(64), primary_key=True),
            sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("applied_at", UTCDateTime, nullable=False),
            schema=table.schema,
        )
        self._seen = sa.Table(
            f"{table.name}_seen"[:63], self._md,
            sa.Column("sink", sa.String(100), primary_key=True),
            sa.Column("identity", sa.String(IDENTITY_LENGTH), primary_key=True),
            sa.Column("applied_at", UTCDateTime, nullable=False),
            schema=table.schema,
        )
        # The sink created the table from this definition: exact types (binary COPY).
        self._remember_new = BulkInsert(self._seen, ["sink", "identity", "applied_at"], exact_types=True)
        self._db: Database | None = None
        self._next_prune = 0.0
        self.applied_batches = 0
        self.skipped_batches = 0
        self.dropped_duplicates = 0

    def __repr__(self) -> str:
        return f"ExactlyOnceSink(name={self.name!r}, checkpoint_table={self._batches.fullname!r})"

    def _database(self) -> Database:
        if self._db is None:
            db = Database(self._url, self._binding)
            self._md.create_all(db.engine, checkfirst=True)
            self._remember_new.dialect = db.plugin
            self._db = db
        return self._db

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
        db = self._database()
        query_id = self._resolve_query_id(df)
        done = sa.select(sa.literal(1)).where(
            self._batches.c.query_id == query_id, self._batches.c.batch_id == batch_id
        )
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
                    "keep them in the batch or pass dedupe=False",
                )
            df = df.selectExpr("*", f"{_identity_sql()} AS {IDENTITY_COLUMN}")
        if self.columns:
            # Only what apply needs crosses to the driver (nested headers are costly to collect).
            df = df.select(*self.columns, *([IDENTITY_COLUMN] if self.dedupe else []))
        batch = df.toArrow()
        now = datetime.now(UTC)
        with db.engine.begin() as conn:
            # First, so that a concurrent duplicate run of this batch fails on the key instead of applying twice.
            conn.execute(sa.insert(self._batches), {"query_id": query_id, "batch_id": batch_id, "applied_at": now})
            if self.dedupe:
                batch = self._drop_seen(conn, db.plugin, batch, now)
            if batch.num_rows:
                self.apply(conn, batch)
            self._prune(conn, query_id, batch_id, now)
        self.applied_batches += 1

    def _drop_seen(self, conn: sa.Connection, dialect: Dialect, batch: pa.Table, now: datetime) -> pa.Table:
        identities: list[str] = batch.column(IDENTITY_COLUMN).to_pylist()
        unique = list(dict.fromkeys(identities))  # a repeat within the batch goes too
        fresh = set(unique) - self._remember(conn, dialect, unique, now) if unique else set()
        keep: list[bool] = []
        for ident in identities:
            if ident in fresh:
                keep.append(True)
                fresh.discard(ident)
            else:
                keep.append(False)
        kept = sum(keep)
        self.dropped_duplicates += len(identities) - kept
        out = batch.drop_columns([IDENTITY_COLUMN])
        return out if kept == len(identities) else out.filter(pa.array(keep))

    def _remember(self, conn: sa.Connection, dialect: Dialect, identities: list[str], now: datetime) -> set[str]:
        """Remember the identities not remembered yet; return those that were (to drop).

        The dialect's way where it has one (PostgreSQL: one COPY into a temporary table and
        one INSERT … ON CONFLICT DO NOTHING, no look-up), else look up, then insert the others."""
        values = {"sink": self.name, "applied_at": now}
        present = dialect.insert_new_keys(conn, self._seen, "identity", identities, values)
        if present is not None:
            return set(present)
        found = self._lookup(conn, dialect, identities)
        self._remember_new(conn, [(self.name, i, now) for i in identities if i not in found])
        return found

    def _lookup(self, conn: sa.Connection, dialect: Dialect, identities: list[str]) -> set[str]:
        t = self._seen
        stmt = sa.select(t.c.identity).where(t.c.sink == self.name, dialect.list_filter(t.c.identity, "ids"))
        step = dialect.capabilities.list_limit or len(identities)
        found: set[str] = set()
        for i in range(0, len(identities), step):
            found.update(conn.execute(stmt, {"ids": identities[i : i + step]}).scalars())
        return found

    def _prune(self, conn: sa.Connection, query_id: str, batch_id: int, now: datetime) -> None:
        b, s = self._batches, self._seen
        conn.execute(sa.delete(b).where(b.c.query_id == query_id, b.c.batch_id < batch_id - self.keep_batches))
        # Unindexed on purpose (an index on the time would slow every batch's inserts): a scan
        # now and then is cheaper.
        if self.dedupe and time.monotonic() >= self._next_prune:
            conn.execute(sa.delete(s).where(s.c.sink == self.name, s.c.applied_at < now - self.dedupe_retention))
            self._next_prune = time.monotonic() + PRUNE_INTERVAL_SECONDS

