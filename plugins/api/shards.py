"""Shard filters for dialects that store a row's shard in a generated column (MariaDB cannot
index an expression; SQL Server matches indexes on computed columns more reliably than on
expressions). The column holds ``COALESCE(kafka_key_hash, 0) % shards``, one per ``shards``."""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["SHARD_EXPRESSION", "shard_column", "shard_column_filter"]

#: The shard of a row, in SQL, for ``shards`` shards (format with ``shards=``).
SHARD_EXPRESSION = "COALESCE(kafka_key_hash, 0) % {shards}"


def shard_column(shards: int) -> str:
    """The generated column holding a row's shard among ``shards``."""
    return f"kafka_shard_{int(shards)}"


def shard_column_filter(shards: int, shard: int) -> sa.ColumnElement[bool]:
    # Unqualified: inside a mark's row choice only the outbox (or its alias) has the column.
    return sa.literal_column(shard_column(shards)) == sa.literal_column(str(int(shard)))
