"""SQLite (3.35+ for ``UPDATE … RETURNING``), through the standard library's ``sqlite3``.

Mark: one ``UPDATE … WHERE id IN (SELECT id … ORDER BY id LIMIT n) RETURNING …``; SQLite
has no row locks, the write lock serialises markers. ``id`` is ``INTEGER PRIMARY KEY
AUTOINCREMENT`` so an id is never reused after a purge (a late purge or reset of an old id
must not hit a new row). The database file is put in WAL mode so that readers and the
single writer do not block each other, and writers wait up to 30 s for the lock.
An in-memory database (``sqlite://``) is private to one connection: use a file.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from pyharvest.plugins.api import (
    NATIVE,
    Capabilities,
    DialectOptions,
    MarkOptions,
    OutboxTable,
    TableName,
    TableOptions,
    expression_index_ddl,
    hookimpl,
)

BUSY_TIMEOUT_SECONDS = 30.0
_preparer = sqlite.dialect().identifier_preparer

# AUTOINCREMENT: an id is never reused after a purge (a late purge or reset of an old id must
# not hit a new row); SQLite gives it only to a column declared exactly INTEGER PRIMARY KEY.
_NATIVE_DDL = TableOptions(types={"id": sa.Integer(), "create_time": sa.TIMESTAMP()},
                           table_kwargs={"sqlite_autoincrement": True})

DIALECT = DialectOptions(
    name="sqlite",
    capabilities=Capabilities(
        transactional_ddl=True,
        integer_ids=True,
        grants=False,  # no roles: the file's permissions decide
        driver_packages=(("pysqlite", "(Python's sqlite3)"), ("aiosqlite", "aiosqlite")),
        commits_in_id_order=True,  # the write lock: an id is handed out and committed under it
    ),
    tables={NATIVE: _NATIVE_DDL},
    # No row locks: the write lock serialises markers.
    mark=MarkOptions(returning="rows", lock=False),
)


@hookimpl
def pyharvest_dialect() -> DialectOptions:
    return DIALECT


@hookimpl
def pyharvest_engine_options(url: sa.URL) -> Mapping[str, Any]:
    return {"connect_args": {"timeout": BUSY_TIMEOUT_SECONDS}}


@hookimpl
def pyharvest_on_connect(dbapi_connection: Any, url: sa.URL) -> None:
    if url.database and url.database != ":memory:":
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()


@hookimpl
def pyharvest_shard_ddl(table: OutboxTable, shards: int, index: str) -> Sequence[str]:
    # SQLAlchemy does not reflect expression indexes on SQLite: IF NOT EXISTS keeps init-db idempotent.
    return [expression_index_ddl(_preparer, table, shards, index, if_not_exists=True)]


@hookimpl
def pyharvest_key_hash_guard(table: OutboxTable, name: str) -> Sequence[str]:
    # SQLite cannot add a constraint to a table: a trigger refuses new rows instead.
    schema = f"{_preparer.quote(table.name.schema)}." if table.name.schema else ""
    return [
        f"CREATE TRIGGER IF NOT EXISTS {schema}{_preparer.quote(name)} BEFORE INSERT ON "
        f"{_preparer.quote(table.name.name)} WHEN NEW.kafka_key_hash IS NULL "
        f"BEGIN SELECT RAISE(ABORT, '{name}: a row needs its kafka_key_hash'); END"
    ]


@hookimpl
def pyharvest_index_names(connection: sa.Connection, table: TableName) -> Collection[str]:
    # SQLAlchemy does not reflect SQLite's expression indexes (the shard index is one).
    schema = f"{_preparer.quote(table.schema)}." if table.schema else ""
    rows = connection.exec_driver_sql(
        f"SELECT name FROM {schema}sqlite_master WHERE type = 'index' AND tbl_name = ?", (table.name,)
    )
    return [r[0] for r in rows]


@hookimpl
def pyharvest_upsert_from_select(
    target: sa.Table, source: sa.Select[Any], keys: Sequence[str], order: Sequence[sa.ColumnElement[Any]]
) -> sa.Executable:
    # Rows apply in order, so a key's last row wins. The SELECT needs a WHERE before the upsert
    # clause, or SQLite would read ON CONFLICT as a join constraint.
    if source.whereclause is None:
        source = source.where(sa.true())
    names = [c.name for c in source.selected_columns]
    insert = sqlite.insert(target).from_select(names, source.order_by(*order))
    others = [c for c in names if c not in keys]
    if not others:
        return insert.on_conflict_do_nothing(index_elements=list(keys))
    return insert.on_conflict_do_update(index_elements=list(keys), set_={c: insert.excluded[c] for c in others})
