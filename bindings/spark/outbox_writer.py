"""``df.write.format("pyharvest.outbox")``: a DataFrame into the outbox, all or nothing per job.

How the job-level guarantee is kept (see :mod:`.staging`):

1. Planning (driver) checks the options and the tables and creates the job's staging tables.
2. Each task writes its partition into the staging tables in one transaction, tagged with
   its partition id and its task attempt id, and reports (partition, attempt, row counts).
3. Commit (driver) moves exactly the rows of the attempts named in the commit messages into
   the outbox (and the target table) in ONE transaction and drops the staging tables. Rows
   of failed or duplicate attempts are never named, so they never move.
4. Abort drops the staging tables whatever the messages say (Spark may pass ``None`` for
   tasks that did write), so a failed job leaves nothing.

The harvester only reads the outbox, so it sees none of a job's records before step 3
commits and all of them after.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import count, islice, repeat
from typing import Any, ClassVar

import sqlalchemy as sa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pyharvest.bindings.spark.arrow_rows import EventFunction, derive_events, outbox_payload
from pyharvest.bindings.spark.database import Database
from pyharvest.bindings.spark.outbox_layout import CREATE_TIME, KEY_HASH, PAYLOAD_COLUMNS
from pyharvest.bindings.spark.staging import (
    ATTEMPT,
    PARTITION,
    SEQ,
    create_outbox_staging,
    create_target_staging,
    drop_table,
    first_seq,
    outbox_staging_table,
    staging_name,
    target_staging_table,
)
from pyharvest.bindings.spark.writer_options import WriterOptions, parse_writer_options
from pyharvest.bindings.sql.bulk_insert import BulkInsert, Rows
from pyharvest.bindings.sql.schema import check_table, has_key_hash
from pyharvest.core.errors import BindingError, ConfigError
from pyharvest.plugins.api import NATIVE, TableName, UTCDateTime

__all__ = ["OutboxDataSource", "OutboxWriter", "StagedPartition", "WriteJobError"]

log = logging.getLogger("pyharvest.spark")

def _outbox_columns(key_hash: bool) -> list[str]:
    """What the tasks stage and the commit moves: the payload, and the key hash where the outbox has it."""
    return [*PAYLOAD_COLUMNS, *([KEY_HASH] if key_hash else [])]


class WriteJobError(BindingError):
    """The job's commit found the staged rows not as the tasks reported them; nothing was moved."""


@dataclass(frozen=True)
class StagedPartition(WriterCommitMessage):
    """What a successful task attempt staged."""

    partition: int
    attempt: int  # Spark's task attempt id: unique within the application
    outbox_rows: int
    target_rows: int


class OutboxDataSource(DataSource):
    """Registered as ``pyharvest.outbox`` by :func:`pyharvest.bindings.spark.register`."""

    # Filled by register(spark, events=...) on a subclass, so the functions travel with the
    # pickled data source to the Python processes that plan and run the job.
    event_functions: ClassVar[Mapping[str, EventFunction]] = {}

    @classmethod
    def name(cls) -> str:
        return "pyharvest.outbox"

    def writer(self, schema: StructType, overwrite: bool) -> OutboxWriter:
        if overwrite:
            raise ConfigError("mode", "the outbox is append-only: use .mode('append')")
        options = parse_writer_options(dict(self.options), schema, self.event_functions)
        return OutboxWriter.plan(options)


class OutboxWriter(DataSourceArrowWriter):
    def __init__(self, options: WriterOptions, job_id: str, outbox_staging: TableName,
                 target_staging: TableName | None, key_hash: bool = False) -> None:
        self.options = options
        self.job_id = job_id
        self.outbox_staging = outbox_staging
        self.target_staging = target_staging
        # The outbox has the key hash column: the tasks compute each record's (sharded harvesters read it).
        self.key_hash = key_hash

    def __repr__(self) -> str:
        return f"OutboxWriter(job={self.job_id}, outbox={self.options.outbox}, target={self.options.target})"

    # -- planning (driver) ---------------------------------------------------------------

    @classmethod
    def plan(cls, options: WriterOptions) -> OutboxWriter:
        db = Database(options.url, options.binding)
        try:
            layout = check_table(db.engine, options.outbox, db.dialect)
            if layout != NATIVE:
                raise BindingError(
                    f"outbox table {options.outbox} has the {layout!r} layout; the Spark writer supports the "
                    f"{NATIVE!r} layout only"
                )
            data_columns: list[str] = []
            if options.target is not None:
                data_columns = options.columns
                _check_target(db, options.target, data_columns)
            key_hash = has_key_hash(db.engine, options.outbox)
            job_id = uuid.uuid4().hex
            outbox_staging = staging_name(options.outbox, job_id)
            target_staging = staging_name(options.target, job_id) if options.target is not None else None
            if options.target is not None and target_staging is not None:
                # Built, not run: a database without upserts fails here, before any task runs.
                _target_move(db, target_staging, options.target, data_columns, options.key_columns, "1 = 1")
            create_outbox_staging(db, outbox_staging, key_hash)
            if options.target is not None and target_staging is not None:
                try:
                    create_target_staging(db, options.target, target_staging, data_columns)
                except BaseException:
                    with db.engine.begin() as conn:
                        drop_table(conn, db, outbox_staging)
                    raise
            log.info("pyharvest.outbox job %s planned: outbox %s at %s", job_id, options.outbox, db.display_url)
            return cls(options, job_id, outbox_staging, target_staging, key_hash)
        finally:
            db.engine.dispose()

    # -- tasks (executors) -----------------------------------------------------------------

    def write(self, iterator: Iterator[Any]) -> StagedPartition:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("OutboxWriter.write runs inside a Spark task")
        return self.stage(ctx.partitionId(), ctx.taskAttemptId(), iterator)

    def stage(self, partition: int, attempt: int, batches: Iterator[Any]) -> StagedPartition:
        """Stage one partition's rows in one transaction (a failed attempt leaves nothing;
        one that committed but failed afterwards is simply never named by the commit)."""
        o = self.options
        db = Database.shared(o.url, o.binding)
        where = f"Spark partition {partition}"
        # The outbox staging table was made from this definition: exact types (binary COPY).
        # The target's copies the target's types, known here by column names only.
        stage_outbox = BulkInsert(outbox_staging_table(self.outbox_staging, self.key_hash),
                                  [PARTITION, ATTEMPT, SEQ, *_outbox_columns(self.key_hash)],
                                  exact_types=True, dialect=db.dialect)
        stage_target = None
        if self.target_staging is not None:
            target_columns = [PARTITION, ATTEMPT, SEQ, *o.columns]
            stage_target = BulkInsert(target_staging_table(self.target_staging, o.columns), target_columns,
                                      dialect=db.dialect)
        seq0 = first_seq(partition)
        n_out = n_target = 0
        with db.engine.begin() as conn:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if o.record_columns is not None:
                    payload = outbox_payload(batch, o.record_columns, where, self.key_hash)
                else:
                    assert stage_target is not None
                    columns = [batch.column(c).to_pylist() for c in o.columns]
                    n_target += stage_target(conn, _staged_rows(partition, attempt, seq0 + n_target, columns))
                    if o.events is None:
                        continue
                    payload = derive_events(batch.to_pylist(), batch, o.events, where, self.key_hash)
                n_out += stage_outbox(conn, _staged_rows(partition, attempt, seq0 + n_out, payload))
        return StagedPartition(partition, attempt, n_out, n_target)

    # -- job end (driver) ------------------------------------------------------------------

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        staged = _winners(messages)
        started = time.monotonic()
        o = self.options
        db = Database(o.url, o.binding)
        try:
            transactional_ddl = db.dialect.capabilities.transactional_ddl
            with db.engine.begin() as conn:
                for statement in db.dialect.bulk_move_statements():  # e.g. room for the move's sort
                    conn.exec_driver_sql(statement)
                if self.target_staging is not None and o.target is not None:
                    self._move_target(conn, db, staged)
                moved = self._move_outbox(conn, db, staged)
                if transactional_ddl:
                    self._drop_staging(conn, db)
            if not transactional_ddl:
                self._drop_staging_after(db)
            log.info("pyharvest.outbox job %s committed %d record(s) from %d partition(s) in %.2fs",
                     self.job_id, moved, len(staged), time.monotonic() - started)
        finally:
            db.engine.dispose()

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        # The messages cannot be trusted to name every attempt that wrote: drop everything.
        o = self.options
        db = Database(o.url, o.binding)
        try:
            self._drop_staging_after(db)
            log.warning("pyharvest.outbox job %s aborted; its staged rows were discarded", self.job_id)
        finally:
            db.engine.dispose()

    def _move_outbox(self, conn: sa.Connection, db: Database, staged: list[StagedPartition]) -> int:
        expected = sum(m.outbox_rows for m in staged)
        if expected == 0:
            return 0
        payload = ", ".join(db.q(c) for c in _outbox_columns(self.key_hash))
        src, dst = db.table(self.outbox_staging), db.table(self.options.outbox)
        winners = _winners_clause(db, staged)
        # Ids are assigned in this order, so they follow the DataFrame's order within a partition.
        sql = (f"INSERT INTO {dst} ({db.q(CREATE_TIME)}, {payload}) "
               f"SELECT :now, {payload} FROM {src} WHERE {winners} ORDER BY {db.q(SEQ)}")
        stmt = sa.text(sql).bindparams(sa.bindparam("now", type_=UTCDateTime))
        moved = conn.execute(stmt, {"now": datetime.now(UTC)}).rowcount
        if moved != expected:
            raise WriteJobError(
                f"job {self.job_id}: the tasks staged {expected} outbox row(s) but {moved} were found; "
                "the staging table was altered or lost (e.g. a database restart); nothing was committed"
            )
        return int(moved)

    def _move_target(self, conn: sa.Connection, db: Database, staged: list[StagedPartition]) -> None:
        o = self.options
        assert o.target is not None and self.target_staging is not None
        expected = sum(m.target_rows for m in staged)
        if expected == 0:
            return
        winners = _winners_clause(db, staged)
        found = conn.exec_driver_sql(f"SELECT COUNT(*) FROM {db.table(self.target_staging)} WHERE {winners}").scalar()
        if found != expected:
            raise WriteJobError(
                f"job {self.job_id}: the tasks staged {expected} row(s) for {o.target} but {found} were found; "
                "nothing was committed"
            )
        conn.execute(_target_move(db, self.target_staging, o.target, o.columns, o.key_columns, winners))

    def _drop_staging(self, conn: sa.Connection, db: Database) -> None:
        drop_table(conn, db, self.outbox_staging)
        if self.target_staging is not None:
            drop_table(conn, db, self.target_staging)

    def _drop_staging_after(self, db: Database) -> None:
        try:
            with db.engine.begin() as conn:
                self._drop_staging(conn, db)
        except sa.exc.SQLAlchemyError as e:
            # Harmless for correctness (nothing reads staging tables); drop_stale_staging cleans up.
            log.warning(
                "pyharvest.outbox job %s: could not drop staging table(s): %s", self.job_id, str(e).splitlines()[0]
            )


def _check_target(db: Database, target: TableName, columns: Sequence[str]) -> None:
    try:
        found = {c["name"] for c in sa.inspect(db.engine).get_columns(target.name, schema=target.schema)}
    except sa.exc.NoSuchTableError:
        raise BindingError(f"target table {target} does not exist at {db.display_url}") from None
    unknown = [c for c in columns if c not in found]
    if unknown:
        raise ConfigError(
            "target_table", f"{target} has no column(s) {', '.join(unknown)} (it has: {', '.join(sorted(found))})"
        )


def _staged_rows(partition: int, attempt: int, first: int, columns: Sequence[Iterable[Any]]) -> Rows:
    """A batch's staged rows (partition, attempt, seq, *columns), made while they are written:
    a list of tuples would cost its allocation and the garbage collector's scans. Columns that
    are not lists (a repeated topic, values made by a generator) become lists of references
    first, so that the rows can be made again (a writer that declines leaves them to
    executemany)."""
    n = min(len(c) for c in columns if isinstance(c, list | tuple))  # the key column is always a list
    cols = [c if isinstance(c, list | tuple) else list(islice(c, n)) for c in columns]
    return Rows(n, lambda: zip(repeat(partition), repeat(attempt), count(first), *cols))


def _winners(messages: Sequence[WriterCommitMessage | None]) -> list[StagedPartition]:
    staged: dict[int, StagedPartition] = {}
    for m in messages:
        if not isinstance(m, StagedPartition):
            raise WriteJobError(f"commit received {m!r} instead of a staged partition; refusing to guess what to move")
        if m.partition in staged and staged[m.partition] != m:
            raise WriteJobError(f"commit received two attempts for partition {m.partition}; refusing to move both")
        staged[m.partition] = m
    return sorted(staged.values(), key=lambda m: m.partition)


def _winners_clause(db: Database, staged: Sequence[StagedPartition]) -> str:
    # OR of ANDs rather than a row-value IN, which SQL Server lacks; PostgreSQL turns the
    # one into the other anyway.
    p, a = db.q(PARTITION), db.q(ATTEMPT)
    return "(" + " OR ".join(f"({p} = {int(m.partition)} AND {a} = {int(m.attempt)})" for m in staged) + ")"


def _target_move(
    db: Database, staging: TableName, target: TableName, columns: Sequence[str], keys: Sequence[str], winners: str
) -> sa.Executable:
    """The statement moving the winning attempts' rows into the target, in order: an
    ``INSERT … SELECT``, or with ``keys`` the dialect's upsert (a key's last row wins)."""
    src = target_staging_table(staging, list(columns))
    dst = sa.Table(target.name, sa.MetaData(), *(sa.Column(c) for c in columns), schema=target.schema)
    source = sa.select(*(src.c[c] for c in columns)).where(sa.text(winners))
    order = [src.c[SEQ]]
    if not keys:
        return sa.insert(dst).from_select(list(columns), source.order_by(*order))
    upsert = db.dialect.upsert_from_select(dst, source, keys, order)
    if upsert is None:
        raise ConfigError(
            "target_key_columns",
            f"dialect {db.dialect.name!r} does not support upserts; omit target_key_columns to insert",
        )
    return upsert
