"""The shard index and filter, for dialects to build theirs from.

:func:`expression_index_ddl` indexes the default shard filter's expression (PostgreSQL,
SQLite). Dialects that cannot index an expression (MariaDB) or match computed columns more
reliably (SQL Server) keep the shard in a generated column instead (:func:`shard_column`,
:func:`shard_column_filter`), holding ``COALESCE(kafka_key_hash, 0) % shards``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from sqlalchemy.sql.compiler import IdentifierPreparer

    from pyharvest.plugins.api.table import OutboxTable

__all__ = ["SHARD_EXPRESSION", "expression_index_ddl", "shard_column", "shard_column_filter"]

#: The shard of a row, in SQL, for ``shards`` shards (format with ``shards=``).
SHARD_EXPRESSION = "COALESCE(kafka_key_hash, 0) % {shards}"


def shard_column(shards: int) -> str:
    """The generated column holding a row's shard among ``shards``."""
    return f"kafka_shard_{int(shards)}"


def shard_column_filter(shards: int, shard: int) -> sa.ColumnElement[bool]:
    # Unqualified: inside a mark's row choice only the outbox (or its alias) has the column.
    return sa.literal_column(shard_column(shards)) == sa.literal_column(str(int(shard)))


def expression_index_ddl(
    preparer: IdentifierPreparer, table: OutboxTable, shards: int, index: str, *, if_not_exists: bool = False
) -> str:
    """``CREATE INDEX index ON table ((COALESCE(kafka_key_hash, 0) % shards), id)``: the
    expression of the default shard filter, so that the planner matches it to the index."""
    exists = "IF NOT EXISTS " if if_not_exists else ""
    return (
        f"CREATE INDEX {exists}{preparer.quote(index)} ON {table.name.quoted(preparer)} "
        f"(({SHARD_EXPRESSION.format(shards=int(shards))}), id)"
    )
