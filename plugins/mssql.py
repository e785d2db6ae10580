"""Microsoft SQL Server 2016+ (and Azure SQL), through pymssql.

Mark: one statement, the shared row choice with a table hint in place of ``FOR UPDATE``::

    UPDATE t SET leader_id = :leader_id OUTPUT inserted.id, …
    WHERE t.id IN (SELECT TOP 1000 oldest.id FROM t AS oldest WITH (UPDLOCK, ROWLOCK)
                   WHERE (oldest.leader_id IS NULL OR oldest.leader_id != :leader_id)
                     AND <every row filter: quarantine …> ORDER BY oldest.id)

``UPDLOCK`` holds the chosen rows until the update commits, so two markers never take the
same row; without ``READPAST`` a locked row is waited for, never skipped (skipping an older
row of a key would publish the key out of order). ``OUTPUT`` is SQLAlchemy's rendering of
``RETURNING``; without ``INTO`` SQL Server refuses it on a table with enabled triggers, so
keep the outbox trigger-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mssql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from pyharvest.plugins.api import (
    SHARD_EXPRESSION,
    Capabilities,
    MarkQuery,
    MarkStrategy,
    MergeForm,
    OutboxTable,
    ReturningMark,
    TableOptions,
    UpsertFromSelect,
    compile_merge,
    create_table_ddl,
    hookimpl,
    shard_column,
    shard_column_filter,
)

NAME = "mssql"
_preparer = mssql.dialect().identifier_preparer  # type: ignore[no-untyped-call]  # SQLAlchemy's dialect __init__ is unannotated
_sa_dialect = mssql.dialect()  # type: ignore[no-untyped-call]  # compiles the DDL
LOCK_HINT = "WITH (UPDLOCK, ROWLOCK)"


@hookimpl
def pyharvest_dialect_name() -> str:
    return NAME


@hookimpl
def pyharvest_url_backends() -> Sequence[str]:
    return ("mssql", "microsoft")  # the second: Django's vendor name for mssql-django


@hookimpl
def pyharvest_capabilities() -> Capabilities:
    # 2,100 parameters a statement: lists stay at the default 1,000.
    return Capabilities(
        transactional_ddl=True, driver_packages=(("pymssql", "pyharvest[mssql]"), ("pyodbc", "pyodbc")),
        privilege_errors=(229, 230),  # the permission was denied on the object, on the column
    )


_NATIVE_DDL = TableOptions(
    # Without a length, SQL Server's VARBINARY and VARCHAR are rendered (MAX).
    types={"create_time": mssql.DATETIMEOFFSET(precision=6),  # type: ignore[no-untyped-call]
           "kafka_value": mssql.VARBINARY(), "kafka_headers": sa.VARCHAR()},  # type: ignore[no-untyped-call]
    defaults={"create_time": "SYSDATETIMEOFFSET()"},
    identity=sa.Identity(start=1, increment=1),
    if_not_exists=False,  # not SQL Server's syntax: the OBJECT_ID test below instead
)


@hookimpl
def pyharvest_outbox_ddl(table: OutboxTable) -> Sequence[str] | None:
    if table.layout != "native":
        return None
    t = table.name.quoted(_preparer)
    return [f"IF OBJECT_ID(N'{t}', N'U') IS NULL\n" + create_table_ddl(table, _sa_dialect, _NATIVE_DDL)]


@hookimpl
def pyharvest_mark_strategy(table: OutboxTable) -> MarkStrategy:
    # literal=False: SQLAlchemy renders an integer limit as TOP (n), a literal column as ROW_NUMBER().
    return ReturningMark(MarkQuery(table, table_hint=LOCK_HINT, literal=False))


@hookimpl
def pyharvest_shard_filter(source: sa.FromClause, shards: int, shard: int) -> sa.ColumnElement[bool]:
    return shard_column_filter(shards, shard)


@hookimpl
def pyharvest_shard_ddl(table: OutboxTable, shards: int, index: str) -> Sequence[str]:
    t, column = table.name.quoted(_preparer), _preparer.quote(shard_column(shards))
    return [
        f"ALTER TABLE {t} ADD {column} AS ({SHARD_EXPRESSION.format(shards=int(shards))})",
        f"CREATE INDEX {_preparer.quote(index)} ON {t} ({column}, id)",
    ]


@hookimpl
def pyharvest_key_hash_guard(table: OutboxTable, name: str) -> Sequence[str]:
    # WITH NOCHECK: new rows are checked at once, existing ones are left for init-db to fill in.
    return [
        f"ALTER TABLE {table.name.quoted(_preparer)} WITH NOCHECK ADD CONSTRAINT {_preparer.quote(name)} "
        "CHECK (kafka_key_hash IS NOT NULL)"
    ]


# MERGE may not touch a target row twice: UpsertFromSelect reads each key's last row only.
_MERGE = MergeForm(target_hint=" WITH (HOLDLOCK)", not_matched="WHEN NOT MATCHED BY TARGET", terminator=";")


@compiles(UpsertFromSelect, "mssql")
def _merge(element: UpsertFromSelect, compiler: SQLCompiler, **kw: Any) -> str:
    return compile_merge(element, compiler, _MERGE, **kw)


@hookimpl
def pyharvest_upsert_from_select(
    target: sa.Table, source: sa.Select[Any], keys: Sequence[str], order: Sequence[sa.ColumnElement[Any]]
) -> sa.Executable:
    return UpsertFromSelect(target, source, keys, order)
