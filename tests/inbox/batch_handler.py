"""The batch handler of the kill-and-rerun test, run by ``reaper inbox --batch-handler``.

Each message is ``{"k": key, "s": seq}``; one ``executemany`` logs a row per message with
where it was read. With ``BATCH_STALL_FILE`` set, the ``BATCH_STALL_AFTER``-th call writes its
rows, creates that file and hangs: the test then SIGKILLs the process inside an open
transaction. Tables come from ``BATCH_PREFIX``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import sqlalchemy as sa

from pyharvest.inbox import InboxMessage

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


_insert = sa.insert(log_table(PREFIX))
_calls = 0


def apply(tx: sa.Connection, messages: list[InboxMessage]) -> None:
    global _calls
    _calls += 1
    rows = []
    for m in messages:
        body = json.loads(m.value or b"{}")
        rows.append({"kafka_partition": m.partition, "kafka_offset": m.offset, "k": body["k"], "s": body["s"]})
    tx.execute(_insert, rows)
    if STALL_FILE and _calls == STALL_AFTER:
        Path(STALL_FILE).touch()
        time.sleep(3600)  # killed here, its transaction open
