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

import sqlalchemy as sa
from sqlalchemy.dialects import mssql

from pyharvest.plugins.api import (
    NATIVE,
    SHARD_EXPRESSION,
    Capabilities,
    DialectOptions,
    MarkOptions,
    MergeForm,
    OutboxTable,
    TableOptions,
    hookimpl,
    shard_column,
)

_preparer = mssql.dialect().identifier_preparer  # type: ignore[no-untyped-call]  # SQLAlchemy's dialect __init__ is unannotated
LOCK_HINT = "WITH (UPDLOCK, ROWLOCK)"

_NATIVE_DDL = TableOptions(
    # Without a length, SQL Server's VARBINARY and VARCHAR are rendered (MAX).
    types={"create_time": mssql.DATETIMEOFFSET(precision=6),  # type: ignore[no-untyped-call]
           "kafka_value": mssql.VARBINARY(), "kafka_headers": sa.VARCHAR()},  # type: ignore[no-untyped-call]
    defaults={"create_time": "SYSDATETIMEOFFSET()"},
    identity=sa.Identity(start=1, increment=1),
    if_not_exists=False,  # not SQL Server's syntax: the OBJECT_ID test instead
    if_missing="IF OBJECT_ID(N'{table}', N'U') IS NULL",
)

DIALECT = DialectOptions(
    name="mssql",
    url_backends=("mssql", "microsoft"),  # the second: Django's vendor name for mssql-django
    # 2,100 parameters a statement: lists stay at the default 1,000.
    capabilities=Capabilities(
        transactional_ddl=True, driver_packages=(("pymssql", "pyharvest[mssql]"), ("pyodbc", "pyodbc")),
        privilege_errors=(229, 230),  # the permission was denied on the object, on the column
        lock_timeout_errors=(1222,),  # the lock request time out period exceeded (SET LOCK_TIMEOUT)
    ),
    tables={NATIVE: _NATIVE_DDL},
    # literal_limit=False: SQLAlchemy renders an integer limit as TOP (n), a literal column as ROW_NUMBER().
    mark=MarkOptions(returning="rows", table_hint=LOCK_HINT, literal_limit=False),
    shard_column=True,  # a computed column (pyharvest_shard_ddl), indexed with the id
    # MERGE may not touch a target row twice: UpsertFromSelect reads each key's last row only.
    merge=MergeForm(target_hint=" WITH (HOLDLOCK)", not_matched="WHEN NOT MATCHED BY TARGET", terminator=";"),
)


@hookimpl
def pyharvest_dialect() -> DialectOptions:
    return DIALECT


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
def pyharvest_lock_timeout_statements(seconds: float) -> Sequence[str]:
    return [f"SET LOCK_TIMEOUT {max(1, round(seconds * 1000))}"]
