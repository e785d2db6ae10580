"""``litesql``: a third-party pyharvest dialect, as small as one can be.

SQLite under another name, marking with pyharvest's generic transactional mark (select,
update, read back) instead of the built-in ``UPDATE … RETURNING``. SQLite has no
``SELECT … FOR UPDATE``, so every transaction starts with ``BEGIN IMMEDIATE``: the write
lock is taken before the select, and concurrent markers queue instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from pyharvest.plugins.api import DialectOptions, OutboxTable, hookimpl


@hookimpl
def pyharvest_dialect() -> DialectOptions:
    # No url_backends: never chosen from a URL, select it by name. No mark options: the
    # generic transactional mark applies.
    return DialectOptions(name="litesql", url_backends=())


@hookimpl
def pyharvest_engine_options(url: sa.URL) -> Mapping[str, Any]:
    # isolation_level=None: the driver issues no BEGIN of its own; we do, below.
    return {"connect_args": {"timeout": 30, "isolation_level": None}}


@hookimpl
def pyharvest_configure_engine(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "begin")
    def _begin_immediate(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


@hookimpl
def pyharvest_outbox_ddl(table: OutboxTable) -> Sequence[str] | None:
    if table.layout != "native":
        return None
    from sqlalchemy.dialects import sqlite

    t = table.name.quoted(sqlite.dialect().identifier_preparer)
    return [
        f"""CREATE TABLE IF NOT EXISTS {t} (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  create_time TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
  kafka_topic VARCHAR(249) NOT NULL,
  kafka_key VARCHAR(255) NOT NULL,
  kafka_value BLOB,
  kafka_headers TEXT NOT NULL DEFAULT '[]',
  leader_id VARCHAR(36)
)"""
    ]

