"""The batch handler of the kill-and-rerun test, run by ``reaper inbox --batch-handler``.

Each message is ``{"k": key, "s": seq}``; one :class:`~pyharvest.inbox.BulkInsert` (``COPY`` on
PostgreSQL, ``executemany`` elsewhere) logs a row per message with where it was read, in the
inbox's transaction. With ``BATCH_STALL_FILE`` set, the ``BATCH_STALL_AFTER``-th call writes its
rows, creates that file and hangs: the test then SIGKILLs the process inside an open
transaction. Tables come from ``BATCH_PREFIX``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import sqlalchemy as sa

from pyharvest.inbox import BulkInsert, InboxMessage

PREFIX = os.environ.get("BATCH_PREFIX", "batch")
STALL_FILE = os.environ.get("BATCH_STALL_FILE")
STALL_AFTER = int(os.environ.get("BATCH_STALL_AFTER", "0"))


def log_table(prefix: str) -> sa.Table:
    return sa.Table(
        f"{prefix}_log",
        sa.MetaData(),
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("kafka_offset", sa.BigInteger, nullable=False),
        sa.Column("k", sa.String(50), nullable=False),
        sa.Column("s", sa.Integer, nullable=False),
    )


_write = BulkInsert(log_table(PREFIX), ["kafka_partition", "kafka_offset", "k", "s"])
_calls = 0


def apply(tx: sa.Connection, messages: list[InboxMessage]) -> None:
    global _calls
    _calls += 1
    rows = []
    for m in messages:
        body = json.loads(m.value or b"{}")
        rows.append((m.partition, m.offset, body["k"], body["s"]))
    _write(tx, rows)
    if STALL_FILE and _calls == STALL_AFTER:
        Path(STALL_FILE).touch()
        while True:  # killed here, its transaction open (a handled signal does not end the wait)
            signal.pause()
