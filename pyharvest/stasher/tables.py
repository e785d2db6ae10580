"""What the stasher knows of an outbox table, looked up once per engine: its layout (as its
dialect recognises it from the columns), whether it has the key hash column, its key column's
length, the insert statement built for it, and the dialect's bulk writer for it. A stasher
keeps what it made of them per engine (:mod:`pyharvest.stasher.plans`).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, NamedTuple

import sqlalchemy as sa

from pyharvest.bindings.sql.bulk_insert import BulkWriters
from pyharvest.bindings.sql.component_grants import Grant, refused_grant
from pyharvest.plugins.api import (
    GOHARVEST,
    KEY_HASH_COLUMN,
    KEY_HASH_GUARD_SUFFIX,
    NATIVE,
    BulkWriter,
    OutboxTable,
    TableName,
    dialect_of,
)
from pyharvest.stasher.errors import OutboxTableChangedError, OutboxTableMissingError
from pyharvest.stasher.limits import KEY_COLUMN

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "TableShape",
    "ashape_of",
    "bulk_writers_of",
    "forced",
    "refused_insert",
    "shape_of",
    "statement",
]


class TableShape(NamedTuple):
    """What the stasher needs to know of a table, looked up once per engine."""

    layout: str
    key_hash: bool  # the native layout's key hash column is there
    key_length: int | None  # the key column's length in characters, if it has one


_lock = threading.Lock()
# (dialect name, table, layout, has key hash) → (outbox table, insert statement)
_statements: dict[tuple[str, TableName, str, bool], tuple[OutboxTable, sa.Insert]] = {}
# engine → table → its shape; weak so that disposed engines do not linger
_shapes: weakref.WeakKeyDictionary[sa.Engine, dict[TableName, TableShape]] = weakref.WeakKeyDictionary()
#: How many times this process has forgotten a table's shape (:func:`refused_insert`): what a
#: stasher made of a shape before (its plan, :mod:`pyharvest.stasher.plans`) is to be made again.
#: A number, read without the lock, so that a plan's check costs an attribute read.
forgotten = 0


# (table, layout) → the dialect's bulk writer per engine: the one rule bindings/sql/bulk_insert.py keeps
_bulk_writers: dict[tuple[TableName, str], BulkWriters] = {}


def _known_shape(engine: sa.Engine, table: TableName) -> TableShape | None:
    with _lock:
        return _shapes.get(engine, {}).get(table)


def _missing_table(conn: sa.Connection, table: TableName) -> OutboxTableMissingError:
    url = conn.engine.url.render_as_string(hide_password=True)
    return OutboxTableMissingError(
        f"the outbox table {table} does not exist in {url}: create it with "
        f"`reaper init-db --data-source '{url}' --table {table}` (or `reaper schema` for its DDL)"
    )


def shape_of(conn: sa.Connection, table: TableName) -> TableShape:
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
    dialect = dialect_of(conn.dialect)
    layout = (dialect.detect_layout(columns) if dialect is not None else None) or NATIVE
    key = columns.get(KEY_COLUMN)
    length = getattr(key["type"], "length", None) if key is not None else None
    key_length = length if isinstance(length, int) else None
    shape = TableShape(layout, layout == NATIVE and KEY_HASH_COLUMN in columns, key_length)
    with _lock:
        _shapes.setdefault(conn.engine, {})[table] = shape
    return shape


async def ashape_of(conn: AsyncConnection, table: TableName) -> TableShape:
    # The cache is shared with the sync path: an AsyncEngine wraps a sync Engine.
    known = _known_shape(conn.sync_engine, table)
    if known is not None:
        return known
    # Inspection is synchronous in SQLAlchemy; run_sync runs it on the async driver.
    return await conn.run_sync(shape_of, table)


def forced(shape: TableShape, layout: str | None) -> tuple[str, bool]:
    """The layout and key hash of ``shape``, with the layout the caller named, if any (only
    the native one has a key hash)."""
    if layout is None:
        return shape.layout, shape.key_hash
    return layout, shape.key_hash and layout == NATIVE


def bulk_writers_of(outbox: OutboxTable) -> BulkWriters:
    """The dialect's bulk writer for ``outbox``'s stashed columns, per engine."""
    key = (outbox.name, outbox.layout)
    with _lock:
        found = _bulk_writers.get(key)
        if found is None:
            columns = outbox.stashed_columns

            def ask(conn: sa.Connection) -> BulkWriter | None:
                dialect = dialect_of(conn.dialect)
                return None if dialect is None else dialect.bulk_writer(conn, outbox.table, columns)

            found = _bulk_writers[key] = BulkWriters(ask)
    return found


def refused_insert(error: sa.exc.DBAPIError, engine: sa.Engine, outbox: OutboxTable) -> Exception | None:
    """What to raise instead of ``error``, an insert's failure: the role's missing privilege
    (:class:`~pyharvest.errors.MissingGrantError`, naming the grant), or the table's key
    hash guard refusing a row written without a hash, by a shape looked up before ``reaper
    init-db --shards`` added the column; None for anything else."""
    dialect = dialect_of(engine.dialect)
    if dialect is not None:
        grant = Grant(("INSERT",), outbox.table, "stashing records", serial_id=outbox.layout == GOHARVEST)
        missing = refused_grant(error, engine, dialect, grant, "stasher")
        if missing is not None:
            return missing
    return _refused_for_key_hash(error, engine, outbox)


def _refused_for_key_hash(
    error: sa.exc.DBAPIError, engine: sa.Engine, outbox: OutboxTable
) -> OutboxTableChangedError | None:
    """The shape is forgotten, so that the transaction run again reads the table anew."""
    global forgotten
    if outbox.key_hash or KEY_HASH_GUARD_SUFFIX not in str(error).lower():
        return None
    with _lock:
        _shapes.get(engine, {}).pop(outbox.name, None)
        forgotten += 1
    bulk_writers_of(outbox).forget(engine)
    return OutboxTableChangedError(
        f"the outbox table {outbox.name} now refuses rows without a key hash (`reaper init-db --shards` made it "
        "ready for shards after this process had read it): roll this transaction back and run it again; "
        "the stasher has reread the table and will store the hash"
    )


def statement(dialect: str, table: TableName, shape: tuple[str, bool]) -> tuple[OutboxTable, sa.Insert]:
    key = (dialect, table, *shape)
    found = _statements.get(key)
    if found is None:
        outbox = OutboxTable.build(table, shape[0], key_hash=shape[1])
        # inline(): no RETURNING of the generated id, which nothing reads and which would need
        # SELECT on the table where INSERT is all the stasher is granted (PostgreSQL).
        found = (outbox, sa.insert(outbox.table).inline())
        with _lock:
            _statements[key] = found
    return found
