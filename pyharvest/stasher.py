"""Write outbox records inside the caller's own transaction.

>>> with engine.begin() as tx:                                   # doctest: +SKIP
...     tx.execute(orders.insert(), {...})
...     stash(tx, OutboxRecord("orders", key="order-42", value=b"..."))

The record commits or rolls back with the caller's other changes: that is the point of
the transactional outbox. ``tx`` is a SQLAlchemy :class:`~sqlalchemy.Connection` or ORM
:class:`~sqlalchemy.orm.Session`. Records are validated before anything is written.

For many records, prepare once and reuse the statement::

    writer = Stasher("outbox").prepare(tx)
    for r in records:
        writer.stash(r)          # or writer.stash_many(records): one executemany

``stash_many`` (and a :meth:`Stasher.batch` flush) of 16 records or more uses the dialect's
bulk writer where it has one: on PostgreSQL with psycopg 3, ``COPY … FROM STDIN`` into the
same transaction, several times cheaper than ``executemany``. ``COPY`` bypasses SQLAlchemy's
statement events (``before_cursor_execute``, ``echo``); ``Stasher(..., bulk=False)`` keeps
every write an ``INSERT``.

With asyncio, the same on an :class:`~sqlalchemy.ext.asyncio.AsyncConnection` or
:class:`~sqlalchemy.ext.asyncio.AsyncSession`::

    async with engine.begin() as tx:                  # engine = create_async_engine(...)
        await astash(tx, OutboxRecord("orders", key="order-42", value=b"..."))
        writer = await Stasher("outbox").aprepare(tx)
        await writer.stash_many(records)

``propagate_trace=True`` adds the current OpenTelemetry span's W3C ``traceparent`` (and
``tracestate``) headers to records that carry no ``traceparent`` (see :mod:`pyharvest.tracing`).

Statements are built once per (dialect, table, layout) and SQLAlchemy's compiled cache
keeps their compiled form. Where the database's dialect supports several layouts
(PostgreSQL: native and goharvest's), the dialect recognises the table's from its columns,
once per engine (``layout=`` forces one); the same look-up reads the key column's length.

Before anything is written, a key longer than the table's key column, a record over
``max_record_bytes`` and a missing table are refused: :class:`KeyTooLongError`,
:class:`RecordTooLargeError`, :class:`OutboxTableMissingError`.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import sqlalchemy as sa

from pyharvest import tracing
from pyharvest.core.records import Header, OutboxRecord, validate_record
from pyharvest.notify import awake_harvester, wake_harvester
from pyharvest.plugins.api import (
    GOHARVEST,
    KEY_HASH_COLUMN,
    NATIVE,
    BulkWriter,
    OutboxTable,
    TableName,
    dialect_of,
    parse_table_name,
)
from pyharvest.stash_errors import (
    KAFKA_MESSAGE_MAX_BYTES,
    KeyTooLongError,
    OutboxTableMissingError,
    RecordTooLargeError,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session

    AsyncTx = AsyncConnection | AsyncSession | async_scoped_session[Any]

__all__ = [
    "KAFKA_MESSAGE_MAX_BYTES",
    "AsyncPreparedStasher",
    "BatchStasher",
    "KeyTooLongError",
    "OutboxTableMissingError",
    "PreparedStasher",
    "RecordTooLargeError",
    "Stasher",
    "astash",
    "stash",
]

#: The outbox's key column, in both layouts.
_KEY_COLUMN = "kafka_key"


class _Shape(NamedTuple):
    """What the stasher needs to know of a table, looked up once per engine."""

    layout: str
    key_hash: bool  # the native layout's key hash column is there
    key_length: int | None  # the key column's length in characters, if it has one


_lock = threading.Lock()
# (dialect name, table, layout, has key hash) → (outbox table, insert statement)
_statements: dict[tuple[str, TableName, str, bool], tuple[OutboxTable, sa.Insert]] = {}
# engine → table → its shape; weak so that disposed engines do not linger
_shapes: weakref.WeakKeyDictionary[sa.Engine, dict[TableName, _Shape]] = weakref.WeakKeyDictionary()


class _Bulk(NamedTuple):
    """The dialect's bulk writer for a table, and how to turn encoded parameters into its rows."""

    writer: BulkWriter
    row: Callable[[dict[str, Any]], tuple[Any, ...]]


# engine → (table, layout) → the dialect's bulk writer, or None where it has none
_bulk_writers: weakref.WeakKeyDictionary[sa.Engine, dict[tuple[TableName, str], _Bulk | None]] = (
    weakref.WeakKeyDictionary()
)


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


def _known_shape(engine: sa.Engine, table: TableName) -> _Shape | None:
    with _lock:
        return _shapes.get(engine, {}).get(table)


def _missing_table(conn: sa.Connection, table: TableName) -> OutboxTableMissingError:
    url = conn.engine.url.render_as_string(hide_password=True)
    return OutboxTableMissingError(
        f"the outbox table {table} does not exist in {url}: create it with "
        f"`reaper init-db --data-source '{url}' --table {table}` (or `reaper schema` for its DDL)"
    )


def _shape_of(conn: sa.Connection, table: TableName) -> _Shape:
    """The table's layout, as its dialect recognises it from the columns, whether it has the
    key hash column, and its key column's length; looked up once per engine."""
    known = _known_shape(conn.engine, table)
    if known is not None:
        return known
    try:
        reflected = sa.inspect(conn).get_columns(table.name, schema=table.schema)
    except sa.exc.NoSuchTableError:
        raise _missing_table(conn, table) from None  # not remembered: it may be created later
    columns = {c["name"].lower(): c for c in reflected}
    plugin = dialect_of(conn.dialect)
    layout = (plugin.detect_layout(columns) if plugin is not None else None) or NATIVE
    key = columns.get(_KEY_COLUMN)
    length = getattr(key["type"], "length", None) if key is not None else None
    shape = _Shape(layout, layout == NATIVE and KEY_HASH_COLUMN in columns, length if isinstance(length, int) else None)
    with _lock:
        _shapes.setdefault(conn.engine, {})[table] = shape
    return shape


async def _ashape_of(conn: AsyncConnection, table: TableName) -> _Shape:
    # The cache is shared with the sync path: an AsyncEngine wraps a sync Engine.
    known = _known_shape(conn.sync_engine, table)
    if known is not None:
        return known
    # Inspection is synchronous in SQLAlchemy; run_sync runs it on the async driver.
    return await conn.run_sync(_shape_of, table)


def _forced(shape: _Shape, layout: str | None) -> tuple[str, bool]:
    """The layout and key hash of ``shape``, with the layout the caller named, if any (only
    the native one has a key hash)."""
    if layout is None:
        return shape.layout, shape.key_hash
    return layout, shape.key_hash and layout == NATIVE


def _bulk_writer_of(conn: sa.Connection, outbox: OutboxTable) -> _Bulk | None:
    key = (outbox.name, outbox.layout)
    with _lock:
        known = _bulk_writers.get(conn.engine)
        if known is not None and key in known:
            return known[key]
    plugin = dialect_of(conn.dialect)
    columns = outbox.stashed_columns
    writer = None if plugin is None else plugin.bulk_writer(conn, outbox.table, columns)
    bulk = None if writer is None else _Bulk(writer, itemgetter(*columns))
    with _lock:
        _bulk_writers.setdefault(conn.engine, {})[key] = bulk
    return bulk


def _forget_bulk_writer(engine: sa.Engine, outbox: OutboxTable) -> None:
    with _lock:
        _bulk_writers.get(engine, {}).pop((outbox.name, outbox.layout), None)


def _statement(dialect: str, table: TableName, shape: tuple[str, bool]) -> tuple[OutboxTable, sa.Insert]:
    key = (dialect, table, *shape)
    found = _statements.get(key)
    if found is None:
        outbox = OutboxTable.build(table, shape[0], key_hash=shape[1])
        found = (outbox, sa.insert(outbox.table))
        with _lock:
            _statements[key] = found
    return found


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


def _text_bytes(text: str | bytes) -> int:
    if isinstance(text, bytes):
        return len(text)
    return len(text) if text.isascii() else len(text.encode())


def record_bytes(record: OutboxRecord) -> int:
    """The size Kafka counts against ``max.message.bytes`` for ``record``'s payload: its key,
    value and headers (names and values), in bytes."""
    size = _text_bytes(record.key)
    if record.value is not None:
        size += _text_bytes(record.value)
    for name, value in record.headers:
        size += _text_bytes(name) + _text_bytes(value)
    return size


class _Limits(NamedTuple):
    """What a record must fit: the table's key column and the stasher's size limit."""

    table: TableName
    key_length: int | None
    max_record_bytes: int | None

    def check(self, record: OutboxRecord) -> OutboxRecord:
        if self.key_length is not None and len(record.key) > self.key_length:
            raise KeyTooLongError(
                f"record key is {len(record.key)} characters long, but the key column ({_KEY_COLUMN}) of "
                f"the outbox table {self.table} holds at most {self.key_length}: shorten the key "
                f"(a hash or an id of the entity), or widen the column (key {record.key[:40]!r}...)"
            )
        if self.max_record_bytes is not None:
            size = record_bytes(record)
            if size > self.max_record_bytes:
                raise RecordTooLargeError(
                    f"record for topic {record.topic!r} with key {record.key[:40]!r} is {size} bytes "
                    f"(key, value and headers), over max_record_bytes={self.max_record_bytes}, which Kafka "
                    f"would refuse at publish (its default message.max.bytes is {KAFKA_MESSAGE_MAX_BYTES}): store "
                    f"the payload elsewhere and stash a reference, or raise the topic's max.message.bytes "
                    f"and the Stasher's max_record_bytes together"
                )
        return record


C = TypeVar("C")


class _Prepared(Generic[C]):
    """What the sync and async prepared stashers share: validation, trace headers and the
    encoding into statement parameters. Only the execute differs."""

    __slots__ = ("_check", "_conn", "_encode", "_insert", "outbox", "propagate_trace")

    def __init__(
        self, conn: C, outbox: OutboxTable, insert: sa.Insert, propagate_trace: bool = False,
        limits: _Limits | None = None,
    ) -> None:
        self._conn = conn
        self._insert = insert
        self._encode = outbox.encode
        self._check = (limits or _Limits(outbox.name, None, None)).check
        self.outbox = outbox
        self.propagate_trace = propagate_trace

    def _params(self, record: OutboxRecord) -> dict[str, Any]:
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

    __slots__ = ("bulk",)

    def __init__(
        self, conn: sa.Connection, outbox: OutboxTable, insert: sa.Insert, propagate_trace: bool = False,
        bulk: bool = True, limits: _Limits | None = None,
    ) -> None:
        super().__init__(conn, outbox, insert, propagate_trace, limits)
        self.bulk = bulk

    def stash(self, record: OutboxRecord) -> None:
        self._conn.execute(self._insert, self._params(record))

    def stash_many(self, records: Iterable[OutboxRecord]) -> int:
        """Validate all, then insert all in one executemany (or the dialect's bulk writer,
        e.g. ``COPY``, for a large enough batch); return how many."""
        params = self._params_many(records)
        self._write(params)
        return len(params)

    def _write(self, params: list[dict[str, Any]]) -> None:
        if not params:
            return
        bulk: _Bulk | None = None
        if self.bulk and len(params) > 1:
            bulk = _bulk_writer_of(self._conn, self.outbox)
            if (
                bulk is not None
                and len(params) >= bulk.writer.min_rows
                and bulk.writer(self._conn, list(map(bulk.row, params)))
            ):
                return
        try:
            self._conn.execute(self._insert, params)
        except sa.exc.DBAPIError:
            if self.bulk and bulk is None:
                # The dialect may have declined for want of the table, which is why this failed
                # too: ask it again once the table exists rather than keep executemany for good.
                _forget_bulk_writer(self._conn.engine, self.outbox)
            raise


class AsyncPreparedStasher(_Prepared["AsyncConnection"]):
    """:class:`PreparedStasher` for an :class:`~sqlalchemy.ext.asyncio.AsyncConnection`;
    see :meth:`Stasher.aprepare`."""

    __slots__ = ()

    async def stash(self, record: OutboxRecord) -> None:
        await self._conn.execute(self._insert, self._params(record))

    async def stash_many(self, records: Iterable[OutboxRecord]) -> int:
        """Validate all, then insert all in one executemany; return how many."""
        params = self._params_many(records)
        if params:
            await self._conn.execute(self._insert, params)
        return len(params)


class BatchStasher:
    """Buffers records and writes them with one executemany (or ``COPY``) per ``flush_every``
    records, and whenever the transaction needs them; see :meth:`Stasher.batch`. One round
    trip per record bounds single-row stashing (a few thousand per second on PostgreSQL);
    batching does not.

    What is buffered is written before anything else reaches the database on the connection
    (so the transaction's own queries see every record stashed), before a commit, a savepoint
    or a rollback to one, and on leaving the ``with`` block. A rollback discards it with the
    rest of the transaction. So no record can be lost to a commit that forgot the batch.

    Each record is validated, given its trace headers and encoded when stashed, so a bad
    record is refused at once and carries the trace current at its own stash. A database error
    in a flush (a constraint of yours) surfaces from the statement or commit that flushed.
    """

    __slots__ = ("__weakref__", "_buffer", "_conn", "_flush_every", "_flushing", "_hooks", "_prepared")

    def __init__(self, prepared: PreparedStasher, flush_every: int) -> None:
        self._prepared = prepared
        self._conn = prepared._conn
        self._buffer: list[dict[str, Any]] = []
        self._flush_every = flush_every
        self._flushing = False
        flush_first = self._flush_first
        hooks = (
            ("before_cursor_execute", flush_first),  # any statement: it may read the outbox
            ("commit", flush_first),
            ("prepare_twophase", flush_first),
            ("savepoint", flush_first),  # else a rollback to it would take earlier records
            ("rollback_savepoint", flush_first),  # written inside it, rolled back with it
            ("rollback", self._discard),
        )
        for name, hook in hooks:
            sa.event.listen(self._conn, name, hook)
        self._hooks: tuple[tuple[str, Callable[..., None]], ...] | None = hooks

    def stash(self, record: OutboxRecord) -> None:
        if self._hooks is None:
            raise RuntimeError("this batch is closed: stash through a new Stasher.batch(tx)")
        params = self._prepared._params(record)
        if not self._buffer and not self._conn.in_transaction():
            # As a write would (autobegin): else the commit that should flush has nothing to commit.
            self._conn.begin()
        self._buffer.append(params)
        if len(self._buffer) >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered now."""
        if not self._buffer or self._flushing:
            return
        buffered, self._buffer = self._buffer, []
        self._flushing = True  # our own statements pass the hooks
        try:
            self._prepared._write(buffered)
        finally:
            self._flushing = False

    def _flush_first(self, *_: object) -> None:
        self.flush()

    def _discard(self, *_: object) -> None:
        self._buffer.clear()

    def close(self) -> None:
        """Write what is buffered and stop watching the connection."""
        try:
            self.flush()
        finally:
            self._unhook()

    def _unhook(self) -> None:
        hooks, self._hooks = self._hooks, None
        for name, hook in hooks or ():
            sa.event.remove(self._conn, name, hook)

    def __enter__(self) -> BatchStasher:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._buffer.clear()  # the caller's transaction is failing anyway
            self._unhook()


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
    headers come to more than ``max_record_bytes`` (default: Kafka's default
    ``message.max.bytes``, which a larger record would fail at publish; ``None``: no limit).
    A missing table raises :class:`OutboxTableMissingError`, saying how to create it.
    """

    def __init__(
        self,
        table: str | TableName = "outbox",
        *,
        layout: str | None = None,
        propagate_trace: bool = False,
        bulk: bool = True,
        max_record_bytes: int | None = KAFKA_MESSAGE_MAX_BYTES,
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

    def _limits(self, shape: _Shape) -> _Limits:
        return _Limits(self.table, shape.key_length, self.max_record_bytes)

    def prepare(self, tx: sa.Connection | Session) -> PreparedStasher:
        """A stasher bound to ``tx``'s connection (and so to its transaction)."""
        conn = _connection(tx)
        shape = _shape_of(conn, self.table)
        outbox, insert = _statement(conn.dialect.name, self.table, _forced(shape, self.layout))
        wake_harvester(conn, self.table)  # PostgreSQL: NOTIFY on commit, now and then
        return PreparedStasher(conn, outbox, insert, self.propagate_trace, self.bulk, self._limits(shape))

    async def aprepare(self, tx: AsyncTx) -> AsyncPreparedStasher:
        """:meth:`prepare` for an ``AsyncConnection`` or ``AsyncSession``."""
        conn = await _async_connection(tx)
        shape = await _ashape_of(conn, self.table)
        outbox, insert = _statement(conn.dialect.name, self.table, _forced(shape, self.layout))
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
        _Limits(self.table, None, self.max_record_bytes).check(record)
        self.prepare(tx).stash(record)

    def stash_many(self, tx: sa.Connection | Session, records: Iterable[OutboxRecord]) -> int:
        return self.prepare(tx).stash_many(records)

    async def astash(self, tx: AsyncTx, record: OutboxRecord) -> None:
        # Before touching the connection (or beginning a session's transaction).
        validate_record(record)
        _Limits(self.table, None, self.max_record_bytes).check(record)
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
    """Write ``record`` into ``table`` within ``tx``'s transaction."""
    _default_stasher(table, propagate_trace).stash(tx, record)


async def astash(tx: AsyncTx, record: OutboxRecord, table: str = "outbox", *, propagate_trace: bool = False) -> None:
    """Write ``record`` into ``table`` within the transaction of ``tx``, an ``AsyncConnection``
    or ``AsyncSession``."""
    await _default_stasher(table, propagate_trace).astash(tx, record)
