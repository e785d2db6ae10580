"""MySQL 8 and MariaDB 10.6+, through PyMySQL.

PyMySQL is pure Python and maintained: no C toolchain or client library to install.

Mark: the generic transactional mark (neither MySQL nor MariaDB has ``UPDATE …
RETURNING``): ``SELECT id … ORDER BY id LIMIT n FOR UPDATE``, ``UPDATE … WHERE id IN
(…)``, read back, commit. The binding's sessions run at READ COMMITTED: under InnoDB's
default REPEATABLE READ the locking read would also take gap and next-key locks, blocking
services inserting new outbox rows until the mark commits.

Timestamps are ``DATETIME(6)`` holding UTC (the stasher converts); the column default
``CURRENT_TIMESTAMP(6)`` is in the writer's session time zone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from pyharvest.plugins.api import (
    NATIVE,
    SHARD_EXPRESSION,
    Capabilities,
    DialectOptions,
    OutboxTable,
    TableOptions,
    hookimpl,
    shard_column,
)

_preparer = mysql.dialect().identifier_preparer

_NATIVE_DDL = TableOptions(
    types={"create_time": mysql.DATETIME(fsp=6), "kafka_value": mysql.LONGBLOB(), "kafka_headers": mysql.LONGTEXT()},
    # A TEXT column takes no literal default (before MySQL 8.0.13).
    defaults={"create_time": "CURRENT_TIMESTAMP(6)", "kafka_headers": None},
    # utf8mb4 for any Unicode key; binary collation so comparisons are exact.
    table_kwargs={"mysql_engine": "InnoDB", "mysql_default_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"},
)

DIALECT = DialectOptions(
    name="mysql",
    url_backends=("mysql", "mariadb"),
    capabilities=Capabilities(
        account_grantees=True, privilege_errors=(1142, 1143),  # table, column access denied
        driver_packages=(
            ("pymysql", "pyharvest[mysql]"), ("mysqldb", "mysqlclient"), ("mysqlconnector", "mysql-connector-python"),
            ("mariadbconnector", "mariadb"), ("asyncmy", "asyncmy"), ("aiomysql", "aiomysql"),
        ),
    ),
    tables={NATIVE: _NATIVE_DDL},
    # The generic transactional mark: neither MySQL nor MariaDB has UPDATE … RETURNING.
    shard_column=True,  # a virtual column (pyharvest_shard_ddl), indexed with the id
)


@hookimpl
def pyharvest_dialect() -> DialectOptions:
    return DIALECT


@hookimpl
def pyharvest_engine_options(url: sa.URL) -> Mapping[str, Any]:
    return {"isolation_level": "READ COMMITTED"}


@hookimpl
def pyharvest_shard_ddl(table: OutboxTable, shards: int, index: str) -> Sequence[str]:
    t, column = table.name.quoted(_preparer), _preparer.quote(shard_column(shards))
    return [
        f"ALTER TABLE {t} ADD COLUMN {column} SMALLINT AS ({SHARD_EXPRESSION.format(shards=int(shards))}) VIRTUAL, "
        f"ADD INDEX {_preparer.quote(index)} ({column}, id)"
    ]


@hookimpl
def pyharvest_key_hash_guard(table: OutboxTable, name: str) -> Sequence[str]:
    # A CHECK constraint added later would check the existing rows too: a trigger checks new ones only.
    schema = f"{_preparer.quote(table.name.schema)}." if table.name.schema else ""
    return [
        f"CREATE TRIGGER {schema}{_preparer.quote(name)} BEFORE INSERT ON {table.name.quoted(_preparer)} "
        f"FOR EACH ROW IF NEW.kafka_key_hash IS NULL THEN "
        f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{name}: a row needs its kafka_key_hash'; END IF"
    ]


@hookimpl
def pyharvest_upsert_from_select(
    target: sa.Table, source: sa.Select[Any], keys: Sequence[str], order: Sequence[sa.ColumnElement[Any]]
) -> sa.Executable:
    # Rows apply in order, so a key's last row wins; the unique key is whichever the table has.
    # The update reads the source's columns (``VALUES(c)`` is deprecated since MySQL 8.0.20,
    # and the ``AS new`` row alias cannot follow a SELECT).
    names = [c.name for c in source.selected_columns]
    insert = mysql.insert(target).from_select(names, source.order_by(*order))
    others = [c for c in names if c not in keys] or list(keys[:1])  # only keys: a no-op update
    return insert.on_duplicate_key_update({c: source.selected_columns[c] for c in others})
