"""Microsoft SQL Server 2016+ (and Azure SQL), through pymssql.

Mark: one statement over a CTE, so the choice of rows and their update are atomic::

    WITH oldest AS (SELECT TOP (n) * FROM t WITH (UPDLOCK, ROWLOCK)
                    WHERE leader_id IS NULL OR leader_id <> :leader_id ORDER BY id)
    UPDATE oldest SET leader_id = :leader_id OUTPUT inserted.id, …

``UPDLOCK`` without ``READPAST``: a locked row is waited for, never skipped (skipping an
older row of a key would publish the key out of order). ``OUTPUT`` without ``INTO`` is
refused by SQL Server on a table with enabled triggers; keep the outbox trigger-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mssql

from pyharvest.bindings.sql.marking import MarkStrategy, _PerLimitCache
from pyharvest.bindings.sql.outbox import KEY_LENGTH, OutboxTable
from pyharvest.plugins import hookimpl

NAME = "mssql"
_preparer = mssql.dialect().identifier_preparer  # type: ignore[no-untyped-call]  # SQLAlchemy's dialect __init__ is unannotated


def mark_sql(table: OutboxTable, limit: int) -> str:
    t = table.name.quoted(_preparer)
    cols = ", ".join(f"inserted.{_preparer.quote(c.name)}" for c in table.columns)
    return (
        f"WITH oldest AS (SELECT TOP ({int(limit)}) * FROM {t} WITH (UPDLOCK, ROWLOCK) "
        "WHERE leader_id IS NULL OR leader_id <> :leader_id ORDER BY id) "
        f"UPDATE oldest SET leader_id = :leader_id OUTPUT {cols}"
    )


class MssqlMark:
    def __init__(self, table: OutboxTable) -> None:
        self.table = table
        self._cache = _PerLimitCache()

    def statement(self, limit: int) -> sa.TextualSelect:
        return self._cache.get(limit, self._build)  # type: ignore[no-any-return]

    def _build(self, limit: int) -> sa.TextualSelect:
        # Typed columns give the result the layout's conversions (UTC timestamps, bytes).
        return (
            sa.text(mark_sql(self.table, limit))
            .bindparams(sa.bindparam("leader_id", type_=self.table.leader_id.type))
            .columns(*self.table.columns)
        )

    def mark(self, connection: sa.Connection, leader_id: str, limit: int) -> Sequence[Sequence[Any]]:
        with connection.begin():
            return connection.execute(self.statement(limit), {"leader_id": leader_id}).all()


@hookimpl
def pyharvest_dialect_name() -> str:
    return NAME


@hookimpl
def pyharvest_url_backends() -> Sequence[str]:
    return ("mssql",)


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
  leader_id     VARCHAR(36) NULL
)"""
    ]


@hookimpl
def pyharvest_mark_strategy(table: OutboxTable) -> MarkStrategy:
    return MssqlMark(table)
