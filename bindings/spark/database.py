"""Database access shared by the Spark writer and the exactly-once sink: engines, quoting,
and the fastest bulk insert each database offers.

Everything here runs in Spark's Python workers as well as on the driver, so it keeps no
global state beyond a per-process engine cache (workers are reused across tasks).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from pyharvest.bindings.sql.connect import create_engine, resolve
from pyharvest.plugins.api import TableName, mask_url

__all__ = ["Database", "bulk_insert"]

# Rows per executemany on databases without COPY: PyMySQL folds each call into multi-row
# INSERTs of at most max_allowed_packet; SQLite gains nothing beyond a few thousand.
EXECUTEMANY_CHUNK = 5000


class Database:
    """An engine for one data source plus what the SQL we generate needs to know about it.

    Connections are not pooled across tasks (``NullPool``): a Spark job opens one connection
    per task, and idle pooled connections in long-lived Python workers would only pin server
    sessions.
    """

    _cache: ClassVar[dict[tuple[str, str | None], Database]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str, binding: str | None = None) -> None:
        sa_url, plugin = resolve(url, binding)
        self.display_url = mask_url(url)
        self.plugin = plugin
        self.engine: sa.Engine = create_engine(sa_url, plugin, poolclass=NullPool)
        self.name: str = self.engine.dialect.name
        self.preparer = self.engine.dialect.identifier_preparer

    @classmethod
    def shared(cls, url: str, binding: str | None = None) -> Database:
        """One instance per (url, binding) per process."""
        key = (url, binding)
        with cls._lock:
            db = cls._cache.get(key)
            if db is None:
                db = cls._cache[key] = cls(url, binding)
            return db

    @property
    def is_postgresql(self) -> bool:
        return self.name == "postgresql"

    @property
    def transactional_ddl(self) -> bool:
        """Whether CREATE/DROP TABLE can share a transaction with DML (MySQL commits implicitly)."""
        return self.name in ("postgresql", "sqlite", "mssql")

    def q(self, identifier: str) -> str:
        return str(self.preparer.quote(identifier))

    def table(self, name: TableName) -> str:
        return name.quoted(self.preparer)


def bulk_insert(conn: sa.Connection, table_sql: str, columns: Sequence[str], rows: Iterable[Sequence[Any]],
                pg_types: Sequence[str] | None = None) -> int:
    """Insert ``rows`` (tuples in ``columns`` order) into ``table_sql`` (already quoted) inside
    ``conn``'s transaction; return how many.

    PostgreSQL with psycopg 3 uses ``COPY … FROM STDIN`` (binary when ``pg_types`` names the
    column types, which skips text parsing on the server); everything else uses executemany,
    which PyMySQL rewrites into multi-row INSERTs.
    """
    dialect = conn.dialect
    cols = ", ".join(dialect.identifier_preparer.quote(c) for c in columns)
    raw = conn.connection.driver_connection
    assert raw is not None, "a connection checked out of its pool has a DBAPI connection"
    n = 0
    if dialect.name == "postgresql" and dialect.driver == "psycopg":
        binary = pg_types is not None
        sql = f"COPY {table_sql} ({cols}) FROM STDIN" + (" (FORMAT BINARY)" if binary else "")
        with raw.cursor() as cur, cur.copy(sql) as copy:
            if pg_types is not None:
                copy.set_types(list(pg_types))
            write = copy.write_row
            for row in rows:
                write(row)
                n += 1
        return n
    mark = "?" if dialect.paramstyle in ("qmark", "numeric") else "%s"
    sql = f"INSERT INTO {table_sql} ({cols}) VALUES ({', '.join([mark] * len(columns))})"
    cursor = raw.cursor()
    try:
        chunk: list[Sequence[Any]] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) >= EXECUTEMANY_CHUNK:
                cursor.executemany(sql, chunk)
                n += len(chunk)
                chunk = []
        if chunk:
            cursor.executemany(sql, chunk)
            n += len(chunk)
    finally:
        cursor.close()
    return n
