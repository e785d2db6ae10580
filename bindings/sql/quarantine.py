"""The quarantine table: keys parked behind a poison record (``poisonPolicy: quarantine``).

One table per outbox, ``<outbox>_quarantine`` in the outbox's schema, one row per parked key:

========================  =====================================================
``kafka_key``             the parked key (primary key)
``record_id``             the outbox row Kafka refused for good (it stays in the outbox)
``kafka_topic``           its topic
``error``                 Kafka's last error for it
``attempts``              how many times it was sent
``quarantine_time``       when the key was parked (UTC)
========================  =====================================================

While a key has a row here, the mark skips every outbox row of that key (a correlated
``NOT EXISTS``), so the key's order is never broken and every other key keeps flowing.
**Replay** deletes the quarantine row: the poison record and everything behind it are marked
again, oldest first. **Discard** deletes the poison record from the outbox and the quarantine
row, in one transaction: the key resumes with the record after it.

The DDL is portable (SQLAlchemy Core); on MySQL the key column uses the outbox's
``utf8mb4_bin`` collation so the anti-join compares keys exactly, as the outbox does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from pyharvest.core.errors import BindingError
from pyharvest.core.ports.database import QuarantineEntry
from pyharvest.plugins.api import KEY_LENGTH, MAX_PART_LENGTH, TOPIC_LENGTH, OutboxTable, TableName, UTCDateTime

__all__ = [
    "ERROR_LENGTH",
    "QuarantineTable",
    "QuarantinedKey",
    "create_quarantine_table",
    "quarantine_table_name",
]

SUFFIX = "_quarantine"
# Error texts are truncated to this many characters (librdkafka's are one line).
ERROR_LENGTH = 2000


def quarantine_table_name(outbox: TableName) -> TableName:
    """``<outbox>_quarantine`` in the same schema; shortened with a hash when the result
    would exceed the identifier limit (PostgreSQL would silently truncate it)."""
    name = outbox.name + SUFFIX
    if len(name) > MAX_PART_LENGTH:
        digest = hashlib.sha1(outbox.name.encode(), usedforsecurity=False).hexdigest()[:8]
        name = f"{outbox.name[: MAX_PART_LENGTH - len(SUFFIX) - 9]}_{digest}{SUFFIX}"
    return TableName(name, outbox.schema)


@dataclass(frozen=True, slots=True)
class QuarantinedKey:
    """One row of the quarantine table."""

    key: str
    record_id: int
    topic: str
    error: str
    attempts: int
    quarantine_time: datetime | None


@dataclass(frozen=True, eq=False)
class QuarantineTable:
    """The quarantine table of one outbox, and the statements on it."""

    name: TableName
    table: sa.Table

    @classmethod
    def for_outbox(cls, outbox: OutboxTable | TableName) -> QuarantineTable:
        outbox_name = outbox.name if isinstance(outbox, OutboxTable) else outbox
        name = quarantine_table_name(outbox_name)
        table = sa.Table(
            name.name,
            sa.MetaData(),
            sa.Column("kafka_key", sa.Unicode(KEY_LENGTH), primary_key=True),
            sa.Column("record_id", sa.BigInteger, nullable=False),
            sa.Column("kafka_topic", sa.String(TOPIC_LENGTH), nullable=False),
            sa.Column("error", sa.String(ERROR_LENGTH), nullable=False),
            sa.Column("attempts", sa.Integer, nullable=False),
            sa.Column("quarantine_time", UTCDateTime, nullable=False),
            schema=name.schema,
            # MySQL/MariaDB: the outbox's collation, so keys compare exactly (and no
            # "illegal mix of collations" in the anti-join). Ignored by other dialects.
            mysql_engine="InnoDB",
            mysql_charset="utf8mb4",
            mysql_collate="utf8mb4_bin",
        )
        return cls(name, table)

    @property
    def key(self) -> sa.Column[Any]:
        return self.table.c.kafka_key

    def excludes(self, outbox_key: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
        """``NOT EXISTS (SELECT 1 FROM quarantine WHERE kafka_key = <outbox key>)``."""
        return ~sa.exists().where(self.key == outbox_key)

    def row_filter(self, source: sa.FromClause) -> sa.ColumnElement[bool]:
        """The outbox row filter (:attr:`OutboxTable.filters`): rows of ``source`` (the outbox
        or the alias a mark selects from) whose key is not quarantined."""
        return self.excludes(source.c.kafka_key)

    # ------------------------------------------------------------------ DDL

    def exists(self, engine: sa.Engine) -> bool:
        return bool(sa.inspect(engine).has_table(self.name.name, schema=self.name.schema))

    def create(self, engine: sa.Engine) -> None:
        """Create the table unless it exists (idempotent, also under a concurrent create)."""
        try:
            self.table.create(engine, checkfirst=True)
        except sa.exc.DatabaseError as e:
            # Two processes racing through checkfirst: the loser's CREATE fails; fine if it exists now.
            if not self.exists(engine):
                raise BindingError(
                    f"cannot create quarantine table {str(self.name)!r}: {str(getattr(e, 'orig', e)).splitlines()[0]}; "
                    "`reaper init-db -f FILE` (poisonPolicy: quarantine), run as the outbox's owner, creates it"
                ) from e

    # ------------------------------------------------------------------ operations

    def park(self, connection: sa.Connection, entries: Sequence[QuarantineEntry]) -> int:
        """Record the keys of these entries (in the caller's transaction); a key already
        parked keeps its first row. Returns how many keys were newly parked."""
        now = OutboxTable.now()
        parked = 0
        seen: set[str] = set()
        for e in entries:
            rec = e.record
            if rec.key in seen:
                continue
            seen.add(rec.key)
            exists = connection.execute(sa.select(self.key).where(self.key == rec.key)).first()
            if exists is not None:
                continue
            connection.execute(
                sa.insert(self.table),
                {
                    "kafka_key": rec.key,
                    "record_id": rec.id,
                    "kafka_topic": rec.topic,
                    "error": (e.error or "")[:ERROR_LENGTH],
                    "attempts": e.attempts,
                    "quarantine_time": now,
                },
            )
            parked += 1
        return parked

    def list(self, connection: sa.Connection, key: str | None = None) -> list[QuarantinedKey]:
        t = self.table
        stmt = sa.select(
            t.c.kafka_key, t.c.record_id, t.c.kafka_topic, t.c.error, t.c.attempts, t.c.quarantine_time
        ).order_by(t.c.quarantine_time, t.c.kafka_key)
        if key is not None:
            stmt = stmt.where(t.c.kafka_key == key)
        return [QuarantinedKey(*row) for row in connection.execute(stmt).all()]

    def replay(self, connection: sa.Connection, key: str) -> bool:
        """Lift the quarantine of ``key``; its records are marked again, oldest first."""
        return bool(connection.execute(sa.delete(self.table).where(self.key == key)).rowcount)

    def discard(self, connection: sa.Connection, outbox: OutboxTable, key: str) -> QuarantinedKey | None:
        """Delete the poison record of ``key`` from the outbox and lift the quarantine, in
        the caller's transaction. Returns what was discarded, or None if ``key`` is not parked."""
        found = self.list(connection, key)
        if not found:
            return None
        entry = found[0]
        connection.execute(
            sa.delete(outbox.table).where(outbox.id == entry.record_id, outbox.table.c.kafka_key == key)
        )
        connection.execute(sa.delete(self.table).where(self.key == key))
        return entry


def create_quarantine_table(engine: sa.Engine, outbox: OutboxTable | TableName) -> QuarantineTable:
    """Create the quarantine table of ``outbox`` unless it exists; return it."""
    q = QuarantineTable.for_outbox(outbox)
    q.create(engine)
    return q
