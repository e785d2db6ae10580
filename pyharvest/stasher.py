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

Statements are built once per (dialect, table, layout) and SQLAlchemy's compiled cache
keeps their compiled form. On PostgreSQL the layout (native or goharvest's) is recognised
from the table's columns once per engine; pass ``layout=`` to skip the look-up.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

import sqlalchemy as sa

from pyharvest.bindings.sql.identifiers import TableName, parse_table_name
from pyharvest.bindings.sql.outbox import GOHARVEST, NATIVE, OutboxTable
from pyharvest.core.records import OutboxRecord, validate_record

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["BatchStasher", "PreparedStasher", "Stasher", "stash"]

_lock = threading.Lock()
# (dialect name, table, layout) → (outbox table, insert statement)
_statements: dict[tuple[str, TableName, str], tuple[OutboxTable, sa.Insert]] = {}
# engine → table → layout; weak so that disposed engines do not linger
_layouts: weakref.WeakKeyDictionary[sa.Engine, dict[TableName, str]] = weakref.WeakKeyDictionary()


def _connection(tx: sa.Connection | Session) -> sa.Connection:
    if isinstance(tx, sa.Connection):
        return tx
    connection = getattr(tx, "connection", None)
    if connection is None:
        raise TypeError(f"stash needs a SQLAlchemy Connection or Session, got {type(tx).__name__}")
    conn: sa.Connection = connection()  # Session.connection(): the session's transaction
    return conn


def _layout_of(conn: sa.Connection, table: TableName) -> str:
    if conn.dialect.name != "postgresql":
        return NATIVE  # only PostgreSQL has a second layout
    engine = conn.engine
    with _lock:
        known = _layouts.get(engine, {}).get(table)
    if known is not None:
        return known
    columns = {c["name"] for c in sa.inspect(conn).get_columns(table.name, schema=table.schema)}
    layout = GOHARVEST if "kafka_header_keys" in columns else NATIVE
    with _lock:
        _layouts.setdefault(engine, {})[table] = layout
    return layout


def _statement(dialect: str, table: TableName, layout: str) -> tuple[OutboxTable, sa.Insert]:
    key = (dialect, table, layout)
    found = _statements.get(key)
    if found is None:
        outbox = OutboxTable.build(table, layout)
        found = (outbox, sa.insert(outbox.table))
        with _lock:
            _statements[key] = found
    return found


class PreparedStasher:
    """Stashes records on one connection with one statement; see :meth:`Stasher.prepare`."""

    __slots__ = ("_conn", "_encode", "_insert", "outbox")

    def __init__(self, conn: sa.Connection, outbox: OutboxTable, insert: sa.Insert) -> None:
        self._conn = conn
        self._insert = insert
        self._encode = outbox.encode
        self.outbox = outbox

    def stash(self, record: OutboxRecord) -> None:
        params = self._encode(validate_record(record), OutboxTable.now())
        self._conn.execute(self._insert, params)

    def stash_many(self, records: Iterable[OutboxRecord]) -> int:
        """Validate all, then insert all in one executemany; return how many."""
        now = OutboxTable.now()
        encode = self._encode
        params = [encode(validate_record(r), now) for r in records]
        if params:
            self._conn.execute(self._insert, params)
        return len(params)


class BatchStasher:
    """Buffers records and writes them with one executemany per ``flush_every`` records and
    on leaving the ``with`` block; see :meth:`Stasher.batch`. One round trip per record
    bounds single-row stashing (a few thousand per second on PostgreSQL); batching does not.
    """

    __slots__ = ("_buffer", "_flush_every", "_prepared")

    def __init__(self, prepared: PreparedStasher, flush_every: int) -> None:
        self._prepared = prepared
        self._buffer: list[OutboxRecord] = []
        self._flush_every = flush_every

    def stash(self, record: OutboxRecord) -> None:
        self._buffer.append(validate_record(record))
        if len(self._buffer) >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        buffered, self._buffer = self._buffer, []
        self._prepared.stash_many(buffered)

    def __enter__(self) -> BatchStasher:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.flush()
        else:
            self._buffer.clear()  # the caller's transaction is failing anyway


class Stasher:
    """Stashes records into one outbox table; cheap to create, safe to share between threads."""

    def __init__(self, table: str | TableName = "outbox", *, layout: str | None = None) -> None:
        self.table = parse_table_name(table)
        if layout is not None and layout not in (NATIVE, GOHARVEST):
            raise ValueError(f"unknown outbox layout {layout!r}; expected {NATIVE!r} or {GOHARVEST!r}")
        self.layout = layout

    def __repr__(self) -> str:
        return f"Stasher(table={str(self.table)!r}, layout={self.layout!r})"

    def prepare(self, tx: sa.Connection | Session) -> PreparedStasher:
        """A stasher bound to ``tx``'s connection (and so to its transaction)."""
        conn = _connection(tx)
        layout = self.layout or _layout_of(conn, self.table)
        outbox, insert = _statement(conn.dialect.name, self.table, layout)
        return PreparedStasher(conn, outbox, insert)

    def batch(self, tx: sa.Connection | Session, flush_every: int = 100) -> BatchStasher:
        """A buffering writer for ``with``: records reach the database in batches, all of
        them before the block ends, so still inside ``tx``'s transaction::

            with engine.begin() as tx, Stasher("outbox").batch(tx) as out:
                for r in records:
                    out.stash(r)
        """
        if flush_every < 1:
            raise ValueError("flush_every must be at least 1")
        return BatchStasher(self.prepare(tx), flush_every)

    def stash(self, tx: sa.Connection | Session, record: OutboxRecord) -> None:
        validate_record(record)  # before touching the connection at all
        self.prepare(tx).stash(record)

    def stash_many(self, tx: sa.Connection | Session, records: Iterable[OutboxRecord]) -> int:
        return self.prepare(tx).stash_many(records)


_default_stashers: dict[str, Stasher] = {}


def stash(tx: sa.Connection | Session, record: OutboxRecord, table: str = "outbox") -> None:
    """Write ``record`` into ``table`` within ``tx``'s transaction."""
    stasher = _default_stashers.get(table)
    if stasher is None:
        stasher = _default_stashers[table] = Stasher(table)
    stasher.stash(tx, record)
