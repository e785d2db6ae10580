"""The exactly-once sink's tables, all named after its checkpoint table.

* ``<checkpoint>``: one row per applied micro-batch, ``(query id, batch id)``, written by the
  driver once every partition of the batch has committed; a replayed batch whose row exists
  is skipped whole.
* ``<checkpoint>_tasks``: one row per applied partition of a batch, ``(query id, batch id,
  partition)``, written by the task in the same transaction as the partition's changes; a
  retried task, or a batch replayed after a crash, finds it and does not apply the partition
  again.
* ``<checkpoint>_seen``: the identities of the records applied, per sink, written in the
  same transaction as the changes they caused.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from pyharvest.plugins.api import MAX_PART_LENGTH, UTCDateTime, parse_table_name

__all__ = ["IDENTITY_LENGTH", "SinkTables"]

IDENTITY_LENGTH = 255


def _suffixed(name: str, suffix: str) -> str:
    return f"{name}{suffix}"[:MAX_PART_LENGTH]


@dataclass(frozen=True)
class SinkTables:
    batches: sa.Table
    tasks: sa.Table
    seen: sa.Table

    @classmethod
    def build(cls, checkpoint_table: str) -> SinkTables:
        table = parse_table_name(checkpoint_table)
        md = sa.MetaData()
        batches = sa.Table(
            table.name, md,
            sa.Column("query_id", sa.String(64), primary_key=True),
            sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("applied_at", UTCDateTime, nullable=False),
            schema=table.schema,
        )
        tasks = sa.Table(
            _suffixed(table.name, "_tasks"), md,
            sa.Column("query_id", sa.String(64), primary_key=True),
            sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("spark_partition", sa.Integer, primary_key=True, autoincrement=False),
            # Spark's task attempt id of the attempt that applied the partition (for the curious).
            sa.Column("spark_attempt", sa.BigInteger, nullable=False),
            # Messages the partition held, and those applied (the rest were duplicates).
            sa.Column("input_rows", sa.BigInteger, nullable=False),
            sa.Column("applied_rows", sa.BigInteger, nullable=False),
            sa.Column("applied_at", UTCDateTime, nullable=False),
            schema=table.schema,
        )
        seen = sa.Table(
            _suffixed(table.name, "_seen"), md,
            sa.Column("sink", sa.String(100), primary_key=True),
            sa.Column("identity", sa.String(IDENTITY_LENGTH), primary_key=True),
            sa.Column("applied_at", UTCDateTime, nullable=False),
            schema=table.schema,
        )
        return cls(batches, tasks, seen)

    def create(self, engine: sa.Engine) -> None:
        self.batches.metadata.create_all(engine, checkfirst=True)
