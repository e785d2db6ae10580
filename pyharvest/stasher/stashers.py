"""The stasher and its prepared stashers (sync and async): validation, trace headers, encoding,
and the insert into the caller's transaction. The public surface is :mod:`pyharvest.stasher`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import sqlalchemy as sa

from pyharvest import tracing
from pyharvest.core.outbox.records import Header, OutboxRecord, validate_record
from pyharvest.plugins.api import GOHARVEST, NATIVE, OutboxTable, TableName, parse_table_name
from pyharvest.stasher.batch import BatchStasher
from pyharvest.stasher.errors import DEFAULT_MAX_RECORD_BYTES
from pyharvest.stasher.limits import StashLimits
from pyharvest.stasher.notify import awake_harvester, wake_harvester
from pyharvest.stasher.tables import (
    TableShape,
    ashape_of,
    bulk_writers_of,
    forced,
    refused_insert,
    shape_of,
    statement,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session

    AsyncTx = AsyncConnection | AsyncSession | async_scoped_session[Any]

__all__ = ["AsyncPreparedStasher", "PreparedStasher", "Stasher", "astash", "stash"]


def _connection(tx: sa.Connection | Session) -> sa.Connection:
    if isinstance(tx, sa.Connection):
        return tx
    if type(tx).__module__.startswith("sqlalchemy.ext.asyncio"):
        # Calling an AsyncSession's connection() here would only make a coroutine.
        raise TypeError(f"{type(tx).__name__} is asynchronous: use astash / Stasher.aprepare")
    connection = getattr(tx, "connection", None)
    if connection is None:
        raise TypeError(f"stash needs a SQLAlchemy Connection or Session, got {type(tx).__name__}")
    conn: sa.Connection = connection()  # Session.connection(): the session's transaction
    return conn


async def _async_connection(tx: AsyncTx) -> AsyncConnection:
    # Imported here: the sync stasher must not need greenlet, which SQLAlchemy's asyncio does.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    if isinstance(tx, AsyncConnection):
        return tx
    if isinstance(tx, AsyncSession | async_scoped_session):
        return await tx.connection()  # the session's transaction, begun if need be
    raise TypeError(f"astash needs a SQLAlchemy AsyncConnection or AsyncSession, got {type(tx).__name__}")


def _has_traceparent(headers: Sequence[Header]) -> bool:
    return any(name.lower() == "traceparent" for name, _ in headers)


def _traced(records: list[OutboxRecord]) -> list[OutboxRecord]:
    """``records`` with the current trace's headers added to those without a ``traceparent``
    (the caller's explicit choice wins). The trace headers are computed at most once (an
    inject costs microseconds); records are copied, never changed in place."""
    extra: list[tuple[str, str]] | None = None
    out = records
    for i, r in enumerate(records):
        if _has_traceparent(r.headers):
            continue
        if extra is None:
            extra = tracing.trace_headers()
            if not extra:
                return records  # no OpenTelemetry, or no span: nothing to add
            out = list(records)
        out[i] = dataclasses.replace(r, headers=[*r.headers, *extra])
    return out


C = TypeVar("C")


class _Prepared(Generic[C]):
    """What the sync and async prepared stashers share: validation, trace headers and the
    encoding into statement parameters. Only the execute differs."""

    __slots__ = ("_check", "_conn", "_encode", "_insert", "outbox", "propagate_trace")

    def __init__(
        self, conn: C, outbox: OutboxTable, insert: sa.Insert, propagate_trace: bool = False,
        limits: StashLimits | None = None,
    ) -> None:
        self._conn = conn
        self._insert = insert
        self._encode = outbox.encode
        self._check = (limits or StashLimits(outbox.name, None, None)).check
        self.outbox = outbox
        self.propagate_trace = propagate_trace

    @property
    def connection(self) -> C:
        """The connection (and so the transaction) this stasher writes on."""
        return self._conn

    def encode(self, record: OutboxRecord) -> dict[str, Any]:
        """``record`` validated, traced and encoded into the insert's parameters."""
        record = validate_record(record)
        if self.propagate_trace:
            (record,) = _traced([record])
        return self._encode(self._check(record), OutboxTable.now())

    def _params_many(self, records: Iterable[OutboxRecord]) -> list[dict[str, Any]]:
        now = OutboxTable.now()
        encode, check = self._encode, self._check
        if not self.propagate_trace:
            # The hot path: one pass, every record validated and encoded before any write.
            return [encode(check(validate_record(r)), now) for r in records]
        validated = _traced([validate_record(r) for r in records])
        return [encode(check(r), now) for r in validated]


class PreparedStasher(_Prepared[sa.Connection]):
    """Stashes records on one connection with one statement; see :meth:`Stasher.prepare`."""

    __slots__ = ("_row", "bulk")

    def __init__(
        self, conn: sa.Connection, outbox: OutboxTable, insert: sa.Insert, propagate_trace: bool = False,
        bulk: bool = True, limits: StashLimits | None = None,
    ) -> None:
        super().__init__(conn, outbox, insert, propagate_trace, limits)
        self.bulk = bulk
        self._row = itemgetter(*outbox.stashed_columns)  # encoded parameters → a bulk writer's row

    def stash(self, record: OutboxRecord) -> None:
        params = self.encode(record)
        try:
            self._conn.execute(self._insert, params)
        except sa.exc.DBAPIError as e:
            changed = refused_insert(e, self._conn.engine, self.outbox)
            if changed is None:
                raise
            raise changed from e

    def stash_many(self, records: Iterable[OutboxRecord]) -> int:
        """Validate all, then insert all in one executemany (or the dialect's bulk writer,
        e.g. ``COPY``, for a large enough batch); return how many."""
        params = self._params_many(records)
        self.write(params)
        return len(params)

    def write(self, params: list[dict[str, Any]]) -> None:
        """Insert encoded records (:meth:`encode`): through the dialect's bulk writer when the
        batch is large enough, else one executemany."""
        if not params:
            return
        writers = bulk_writers_of(self.outbox) if self.bulk and len(params) > 1 else None
        conn = self._conn
        try:
            writer = writers.get(conn) if writers is not None else None
            if writer is not None and len(params) >= writer.min_rows and writer(conn, list(map(self._row, params))):
                return
            conn.execute(self._insert, params)
        except sa.exc.DBAPIError as e:
            if writers is not None:
                writers.insert_failed(conn.engine)
            changed = refused_insert(e, conn.engine, self.outbox)
            if changed is None:
                raise
            raise changed from e


class AsyncPreparedStasher(_Prepared["AsyncConnection"]):
    """:class:`PreparedStasher` for an :class:`~sqlalchemy.ext.asyncio.AsyncConnection`;
    see :meth:`Stasher.aprepare`."""

    __slots__ = ()

    async def stash(self, record: OutboxRecord) -> None:
        await self._execute(self.encode(record))

    async def stash_many(self, records: Iterable[OutboxRecord]) -> int:
        """Validate all, then insert all in one executemany; return how many."""
        params = self._params_many(records)
        if params:
            await self._execute(params)
        return len(params)

    async def _execute(self, params: dict[str, Any] | list[dict[str, Any]]) -> None:
        try:
            await self._conn.execute(self._insert, params)
        except sa.exc.DBAPIError as e:
            changed = refused_insert(e, self._conn.sync_engine, self.outbox)
            if changed is None:
                raise
            raise changed from e


class Stasher:
    """Stashes records into one outbox table; cheap to create, safe to share between threads
    and event loops.

    ``propagate_trace=True`` adds the current OpenTelemetry trace's ``traceparent`` and
    ``tracestate`` headers to each record without a ``traceparent`` (after validation; a
    no-op without OpenTelemetry or outside a span).

    ``bulk=False`` keeps every write an ``INSERT`` (by default a large ``stash_many`` uses the
    dialect's bulk writer, such as PostgreSQL's ``COPY``, which SQLAlchemy's statement events
    do not see).

    Before anything is written, a record is refused (:class:`KeyTooLongError`) if its key is
    longer than the table's key column, and (:class:`RecordTooLargeError`) if its key, value and
    headers come to more than ``max_record_bytes`` (default: what the harvester's producer
    publishes at librdkafka's default ``message.max.bytes``, once it has added its own headers;
    a larger record would fail at publish and hold back its key; ``None``: no limit).
    A missing table raises :class:`OutboxTableMissingError`, saying how to create it.
    """

    def __init__(
        self,
        table: str | TableName = "outbox",
        *,
        layout: str | None = None,
        propagate_trace: bool = False,
        bulk: bool = True,
        max_record_bytes: int | None = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self.table = parse_table_name(table)
        if layout is not None and layout not in (NATIVE, GOHARVEST):
            raise ValueError(f"unknown outbox layout {layout!r}; expected {NATIVE!r} or {GOHARVEST!r}")
        if max_record_bytes is not None and (
            isinstance(max_record_bytes, bool) or not isinstance(max_record_bytes, int) or max_record_bytes < 1
        ):
            raise ValueError(f"max_record_bytes must be a positive number of bytes or None, got {max_record_bytes!r}")
        self.layout = layout
        self.propagate_trace = propagate_trace
        self.bulk = bulk
        self.max_record_bytes = max_record_bytes

    def __repr__(self) -> str:
        return (
            f"Stasher(table={str(self.table)!r}, layout={self.layout!r}, "
            f"propagate_trace={self.propagate_trace!r}, bulk={self.bulk!r}, "
            f"max_record_bytes={self.max_record_bytes!r})"
        )

    def _limits(self, shape: TableShape) -> StashLimits:
        return StashLimits(self.table, shape.key_length, self.max_record_bytes)

    def prepare(self, tx: sa.Connection | Session) -> PreparedStasher:
        """A stasher bound to ``tx``'s connection (and so to its transaction)."""
        conn = _connection(tx)
        shape = shape_of(conn, self.table)
        outbox, insert = statement(conn.dialect.name, self.table, forced(shape, self.layout))
        wake_harvester(conn, self.table)  # PostgreSQL: NOTIFY on commit, now and then
        return PreparedStasher(conn, outbox, insert, self.propagate_trace, self.bulk, self._limits(shape))

    async def aprepare(self, tx: AsyncTx) -> AsyncPreparedStasher:
        """:meth:`prepare` for an ``AsyncConnection`` or ``AsyncSession``."""
        conn = await _async_connection(tx)
        shape = await ashape_of(conn, self.table)
        outbox, insert = statement(conn.dialect.name, self.table, forced(shape, self.layout))
        await awake_harvester(conn, self.table)
        return AsyncPreparedStasher(conn, outbox, insert, self.propagate_trace, self._limits(shape))

    def batch(self, tx: sa.Connection | Session, flush_every: int = 100) -> BatchStasher:
        """A buffering writer: records reach the database in batches of ``flush_every``, and
        the rest before the transaction commits, takes a savepoint or runs any other statement,
        so always inside ``tx``'s transaction and always visible to its queries::

            with engine.begin() as tx, Stasher("outbox").batch(tx) as out:
                for r in records:
                    out.stash(r)
        """
        if flush_every < 1:
            raise ValueError("flush_every must be at least 1")
        return BatchStasher(self.prepare(tx), flush_every)

    def stash(self, tx: sa.Connection | Session, record: OutboxRecord) -> None:
        validate_record(record)  # before touching the connection at all
        StashLimits(self.table, None, self.max_record_bytes).check(record)
        self.prepare(tx).stash(record)

    def stash_many(self, tx: sa.Connection | Session, records: Iterable[OutboxRecord]) -> int:
        return self.prepare(tx).stash_many(records)

    async def astash(self, tx: AsyncTx, record: OutboxRecord) -> None:
        # Before touching the connection (or beginning a session's transaction).
        validate_record(record)
        StashLimits(self.table, None, self.max_record_bytes).check(record)
        await (await self.aprepare(tx)).stash(record)

    async def astash_many(self, tx: AsyncTx, records: Iterable[OutboxRecord]) -> int:
        return await (await self.aprepare(tx)).stash_many(records)


# One shared Stasher per (table, propagate_trace) for the module-level functions.
_default_stashers: dict[tuple[str, bool], Stasher] = {}


def _default_stasher(table: str, propagate_trace: bool) -> Stasher:
    key = (table, propagate_trace)
    stasher = _default_stashers.get(key)
    if stasher is None:
        stasher = _default_stashers[key] = Stasher(table, propagate_trace=propagate_trace)
    return stasher


def stash(
    tx: sa.Connection | Session, record: OutboxRecord, table: str = "outbox", *, propagate_trace: bool = False
) -> None:
    """Write ``record`` into the outbox ``table`` within ``tx``'s transaction.

    ``tx`` is the SQLAlchemy ``Connection`` or ORM ``Session`` of the service's own change:
    the record commits with it or not at all, and the harvester publishes it after the commit,
    in order with the other records of its key. Nothing is committed here.

    The record is checked before anything is written; :class:`~pyharvest.errors.InvalidRecordError`
    (or its subclasses :class:`KeyTooLongError` and :class:`RecordTooLargeError`, over
    :data:`DEFAULT_MAX_RECORD_BYTES`) says which field is wrong, and
    :class:`OutboxTableMissingError` how to create a missing table. ``propagate_trace=True``
    adds the current OpenTelemetry trace's headers. For many records, or another size limit,
    use a :class:`Stasher`.

    >>> with engine.begin() as tx:                                    # doctest: +SKIP
    ...     tx.execute(orders.insert(), {"id": 42})
    ...     stash(tx, OutboxRecord("orders", key="order-42", value=b'{"status": "paid"}'))
    """
    _default_stasher(table, propagate_trace).stash(tx, record)


async def astash(tx: AsyncTx, record: OutboxRecord, table: str = "outbox", *, propagate_trace: bool = False) -> None:
    """Write ``record`` into ``table`` within the transaction of ``tx``, an ``AsyncConnection``
    or ``AsyncSession``."""
    await _default_stasher(table, propagate_trace).astash(tx, record)
