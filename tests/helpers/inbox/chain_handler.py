"""The handler of the end-to-end chain test, run by ``reaper inbox`` subprocesses.

Each message of topic 1 is ``{"k": key, "s": seq, "a": amount}``. Applying it adds
``amount`` to the key's balance, logs ``(key, seq)`` (the test checks each is applied once
and in order) and stashes a derived record into outbox B — all in the inbox's transaction.
Tables and topic come from the environment: ``CHAIN_PREFIX``, ``CHAIN_TOPIC2``.
"""

from __future__ import annotations

import json
import os

import sqlalchemy as sa

from pyharvest import OutboxRecord
from pyharvest.inbox import InboxMessage
from pyharvest.stasher import Stasher

PREFIX = os.environ.get("CHAIN_PREFIX", "chain")
TOPIC2 = os.environ.get("CHAIN_TOPIC2", "chain-2")


def tables(prefix: str) -> tuple[sa.Table, sa.Table]:
    md = sa.MetaData()
    balances = sa.Table(
        f"{prefix}_bal",
        md,
        sa.Column("k", sa.String(50), primary_key=True),
        sa.Column("balance", sa.BigInteger, nullable=False),
    )
    log = sa.Table(
        f"{prefix}_log",
        md,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("k", sa.String(50), nullable=False),
        sa.Column("s", sa.Integer, nullable=False),
        sa.Column("delivery_id", sa.String(32), nullable=False),
    )
    return balances, log


_balances, _log = tables(PREFIX)
_credit = (
    sa.update(_balances)
    .where(_balances.c.k == sa.bindparam("key"))
    .values(balance=_balances.c.balance + sa.bindparam("amount"))
)
_append = sa.insert(_log)
_outbox_b = Stasher(f"{PREFIX}_b")


def apply(tx: sa.Connection, message: InboxMessage) -> None:
    body = json.loads(message.value or b"{}")
    key, seq, amount = body["k"], body["s"], body["a"]
    if tx.execute(_credit, {"key": key, "amount": amount}).rowcount != 1:
        raise LookupError(f"no balance row for key {key!r}")
    tx.execute(_append, {"k": key, "s": seq, "delivery_id": message.delivery_id})
    _outbox_b.stash(tx, OutboxRecord(TOPIC2, key, f"{key}:{seq}".encode()))
