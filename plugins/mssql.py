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

from pyharvest.plugins.api import (
    KEY_LENGTH,
    SHARD_EXPRESSION,
    Capabilities,
    MarkQuery,
    MarkStrategy,
    OutboxTable,
    ReturningMark,
    hookimpl,
    shard_column,
    shard_column_filter,
)

NAME = "mssql"
_preparer = mssql.dialect().identifier_preparer  # type: ignore[no-untyped-call]  # SQLAlchemy's dialect __init__ is unannotated
_sa_dialect = mssql.dialect()  # type: ignore[no-untyped-call]  # compiles the upsert's source
LOCK_HINT = "WITH (UPDLOCK, ROWLOCK)"


@hookimpl
def pyharvest_dialect_name() -> str:
    return NAME


@hookimpl
def pyharvest_url_backends() -> Sequence[str]:
    return ("mssql",)


@hookimpl
def pyharvest_capabilities() -> Capabilities:
    # 2,100 parameters a statement: lists stay at the default 1,000.
    return Capabilities(transactional_ddl=True, driver_packages=(("pymssql", "pyharvest[mssql]"), ("pyodbc", "pyodbc")))


@hookimpl
def pyharvest_outbox_ddl(table: OutboxTable) -> Sequence[str] | None:
    if table.layout != "native":
        return None
    t = table.name.quoted(_preparer)
    return [
        f"""IF OBJECT_ID(N'{t}', N'U') IS NULL
CREATE TABLE {t} (
  id            BIGINT IDENTITY(1,1) NOT NULL PRIMARY KEY CLUSTERED,
  create_time   DATETIMEOFFSET(6) NOT NULL DEFAULT SYSDATETIMEOFFSET(),
  kafka_topic   VARCHAR(249) NOT NULL,
  kafka_key     NVARCHAR({KEY_LENGTH}) NOT NULL,
  kafka_value   VARBINARY(MAX) NULL,
  kafka_headers VARCHAR(MAX) NOT NULL DEFAULT '[]',
  leader_id     VARCHAR(36) NULL,
  kafka_key_hash INT NULL
)"""
    ]


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


@hookimpl
def pyharvest_upsert_from_select(
    target: sa.Table, source: sa.Select[Any], keys: Sequence[str], order: Sequence[sa.ColumnElement[Any]]
) -> sa.Executable:
    # MERGE may not touch a target row twice: each key's last row only (ROW_NUMBER). HOLDLOCK
    # keeps a concurrent insert of the same key from slipping between the match and the insert.
    names = [c.name for c in source.selected_columns]
    q = _preparer.quote
    rank = sa.func.row_number().over(
        partition_by=[source.selected_columns[k] for k in keys], order_by=[o.desc() for o in order]
    )
    ranked = source.add_columns(rank.label("pyharvest_rank")).subquery("ranked")
    latest = sa.select(*(ranked.c[n] for n in names)).where(ranked.c.pyharvest_rank == 1)
    on = " AND ".join(f"tgt.{q(k)} = src.{q(k)}" for k in keys)
    others = [c for c in names if c not in keys]
    update = f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{q(c)} = src.{q(c)}' for c in others)} " if others else ""
    sql = (
        f"MERGE INTO {_preparer.format_table(target)} WITH (HOLDLOCK) AS tgt "
        f"USING ({_literal_sql(latest)}) AS src ON {on} {update}"
        f"WHEN NOT MATCHED BY TARGET THEN INSERT ({', '.join(q(c) for c in names)}) "
        f"VALUES ({', '.join(f'src.{q(c)}' for c in names)});"  # MERGE must end with a semicolon
    )
    return sa.text(sql.replace(":", r"\:"))


def _literal_sql(select: sa.Select[Any]) -> str:
    return str(select.compile(dialect=_sa_dialect, compile_kwargs={"literal_binds": True}))
