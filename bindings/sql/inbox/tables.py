"""The inbox's three tables, as portable SQLAlchemy Core definitions.

* **checkpoint** — one row per (group, topic, partition): the next offset to apply and the
  partition's *fence*, a counter bumped by every consumer that takes the partition over.
  Each transaction that applies messages also moves the offset, guarded by the fence.
* **dedupe** — the (outbox, record id) identities applied, per group, so that a copy the
  harvester published twice is dropped. Pruned to a window of offsets per partition.
* **dead letter** — messages whose handler failed under the ``dead-letter`` policy
  (``status='dead'``) and the later messages of the same key, parked behind them
  (``status='parked'``), in arrival order (``id``); see :mod:`pyharvest.core.inbox.letters`.

Column names avoid words reserved by some databases (``partition``, ``offset``, ``key``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import sqlalchemy as sa

from pyharvest.bindings.sql.component_grants import Grant
from pyharvest.plugins.api import GeneratedId, UTCDateTime, parse_table_name

__all__ = ["InboxTables"]

GROUP_LENGTH = 249  # Kafka's limit for group ids and topic names
TOPIC_LENGTH = 249
OUTBOX_LENGTH = 400  # "<leaderGroupID>/<outboxTable>"
KEY_HASH_LENGTH = 64



@dataclass(frozen=True, slots=True)
class InboxTables:
    metadata: sa.MetaData
    checkpoint: sa.Table
    dedupe: sa.Table
    dead_letter: sa.Table

    @classmethod
    def build(cls, checkpoint: str, dedupe: str, dead_letter: str) -> InboxTables:
        md = sa.MetaData()
        cp_name, dd_name, dl_name = (parse_table_name(n) for n in (checkpoint, dedupe, dead_letter))
        cp = sa.Table(
            cp_name.name,
            md,
            sa.Column("group_id", sa.String(GROUP_LENGTH), primary_key=True),
            sa.Column("topic", sa.String(TOPIC_LENGTH), primary_key=True),
            sa.Column("kafka_partition", sa.Integer, primary_key=True, autoincrement=False),
            # NULL until the first commit: start from the consumer's auto.offset.reset.
            sa.Column("next_offset", sa.BigInteger, nullable=True),
            sa.Column("fence", sa.BigInteger, nullable=False),
            sa.Column("owner", sa.String(255), nullable=True),
            sa.Column("updated_at", UTCDateTime, nullable=False),
            schema=cp_name.schema,
        )
        dd = sa.Table(
            dd_name.name,
            md,
            sa.Column("group_id", sa.String(GROUP_LENGTH), primary_key=True),
            sa.Column("outbox", sa.String(OUTBOX_LENGTH), primary_key=True),
            sa.Column("record_id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("topic", sa.String(TOPIC_LENGTH), nullable=False),
            sa.Column("kafka_partition", sa.Integer, nullable=False),
            sa.Column("kafka_offset", sa.BigInteger, nullable=False),
            # Pruning deletes by position: (group, topic, partition, offset < low-water).
            sa.Index(f"{dd_name.name}_pos", "group_id", "topic", "kafka_partition", "kafka_offset"),
            schema=dd_name.schema,
        )
        dl = sa.Table(
            dl_name.name,
            md,
            sa.Column("id", GeneratedId, primary_key=True, autoincrement=True),
            sa.Column("group_id", sa.String(GROUP_LENGTH), nullable=False),
            sa.Column("topic", sa.String(TOPIC_LENGTH), nullable=False),
            sa.Column("kafka_partition", sa.Integer, nullable=False),
            sa.Column("kafka_offset", sa.BigInteger, nullable=False),
            # sha256 of the key: indexable whatever the key's length; NULL for a null key.
            sa.Column("key_hash", sa.String(KEY_HASH_LENGTH), nullable=True),
            sa.Column("msg_key", sa.LargeBinary, nullable=True),
            sa.Column("msg_value", sa.LargeBinary, nullable=True),
            sa.Column("headers", sa.Text, nullable=False),  # JSON: [[name, base64 | null], ...]
            sa.Column("timestamp_ms", sa.BigInteger, nullable=True),
            sa.Column("status", sa.String(16), nullable=False),
            sa.Column("error", sa.Text, nullable=True),
            sa.Column("failed_at", UTCDateTime, nullable=False),
            sa.Column("replay_requested", sa.Boolean, nullable=False, default=False),
            sa.Index(f"{dl_name.name}_key", "group_id", "topic", "kafka_partition", "key_hash"),
            schema=dl_name.schema,
        )
        return cls(md, cp, dd, dl)

    def grants(self) -> list[Grant]:
        """The privileges a running inbox needs on its tables, and nothing more (with
        ``createTables: false``; ``reaper inbox --init-db``, run by their owner, creates them)."""
        return [
            Grant(("SELECT", "INSERT", "UPDATE"), self.checkpoint, "claiming partitions and moving their offsets"),
            Grant(("SELECT", "INSERT", "DELETE"), self.dedupe, "dropping copies published twice, and pruning"),
            Grant(("SELECT", "INSERT", "UPDATE", "DELETE"), self.dead_letter,
                  "parking failed messages and replaying them", serial_id=True),
        ]

    def create(self, engine: sa.Engine, attempts: int = 5) -> None:
        """Create whichever of the tables is missing (idempotent).

        Consumers of one group often start together; ``checkfirst`` is not atomic, so another
        process may create a table between the check and the ``CREATE``. Losing that race is
        fine: check again.
        """
        for attempt in range(attempts):
            try:
                self.metadata.create_all(engine, checkfirst=True)
                return
            except sa.exc.DBAPIError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.1 * (attempt + 1))
