"""Dead letters and parked messages in their table (what is stored and why:
:mod:`pyharvest.core.inbox.letters`), and asking for their replay.

Replay is done by the consumer that owns the partition, inside its fenced transactions, so
it cannot interleave with live messages of the key: an operator only *asks*
(:func:`request_replay`, or ``reaper inbox -f … --replay``); the owner, within
``replayPollInterval``, applies the key's stored messages in order with the current
handler, deletes them, and un-parks the key. If one fails again, the messages before it stay
applied, it becomes the key's new dead letter with the new error, and the request is cleared.
"""

from __future__ import annotations

import base64
from collections.abc import Collection
from datetime import UTC, datetime

import sqlalchemy as sa

from pyharvest.core.inbox.letters import DEAD, DeadLetter, key_hash
from pyharvest.core.inbox.message import InboxMessage, delivery_id_for, source_identity
from pyharvest.core.outbox.headers import decode_nullable_headers, encode_headers

__all__ = ["DeadLetters", "list_dead_letters", "request_replay"]


def _decode_headers(text: str) -> tuple[tuple[str, bytes | None], ...]:
    # The outbox's header format (core.headers). A plain string value is a dead letter stored
    # before the formats were one (each value base64 text); the inbox itself stores bytes.
    return tuple(
        (n, base64.b64decode(v) if isinstance(v, str) else v) for n, v in decode_nullable_headers(text)
    )


class DeadLetters:
    """The dead letters of one consumer group in ``table``; a
    :class:`~pyharvest.core.inbox.ports.DeadLetterStore`."""

    def __init__(self, table: sa.Table, group_id: str) -> None:
        self.table = table
        self.group_id = group_id

    def parked_keys(self, conn: sa.Connection, topic: str, partition: int) -> set[str]:
        """Key hashes of the partition that have stored messages (and so park new ones)."""
        t = self.table.c
        rows = conn.execute(
            sa.select(t.key_hash)
            .where(
                t.group_id == self.group_id, t.topic == topic, t.kafka_partition == partition, t.key_hash.is_not(None)
            )
            .distinct()
        )
        return {r[0] for r in rows}

    def store(
        self, conn: sa.Connection, message: InboxMessage, status: str, error: str | None, khash: str | None
    ) -> None:
        conn.execute(
            sa.insert(self.table),
            {
                "group_id": self.group_id,
                "topic": message.topic,
                "kafka_partition": message.partition,
                "kafka_offset": message.offset,
                "key_hash": khash,
                "msg_key": message.key,
                "msg_value": message.value,
                "headers": encode_headers(message.headers),
                "timestamp_ms": message.timestamp_ms,
                "status": status,
                "error": error,
                "failed_at": datetime.now(UTC),
                "replay_requested": False,
            },
        )

    # -------------------------------------------------------------- replay, done by the owner

    def requested(self, conn: sa.Connection, topic: str, partition: int) -> list[str | None]:
        """Keys of the partition with a replay request, oldest first. A null-key dead letter
        is its own unit; it appears as None once per request (handled one at a time)."""
        t = self.table.c
        rows = conn.execute(
            sa.select(t.key_hash, sa.func.min(t.id))
            .where(
                t.group_id == self.group_id,
                t.topic == topic,
                t.kafka_partition == partition,
                t.replay_requested == sa.true(),
            )
            .group_by(t.key_hash)
            .order_by(sa.func.min(t.id))
        )
        return [r[0] for r in rows]

    def load(self, conn: sa.Connection, topic: str, partition: int, khash: str | None) -> list[DeadLetter]:
        """The stored messages of one key in arrival order (for a null key: the oldest
        requested null-key message alone)."""
        t = self.table.c
        q = sa.select(self.table).where(t.group_id == self.group_id, t.topic == topic, t.kafka_partition == partition)
        if khash is None:
            q = q.where(t.key_hash.is_(None), t.replay_requested == sa.true()).order_by(t.id).limit(1)
        else:
            q = q.where(t.key_hash == khash).order_by(t.id)
        return [self._letter(r) for r in conn.execute(q).mappings()]

    def _letter(self, r: sa.RowMapping) -> DeadLetter:
        headers = _decode_headers(r["headers"])
        source = source_identity(headers)
        msg = InboxMessage(
            topic=r["topic"],
            partition=int(r["kafka_partition"]),
            offset=int(r["kafka_offset"]),
            key=None if r["msg_key"] is None else bytes(r["msg_key"]),
            value=None if r["msg_value"] is None else bytes(r["msg_value"]),
            headers=headers,
            timestamp_ms=r["timestamp_ms"],
            source=source,
            delivery_id=delivery_id_for(
                self.group_id, r["topic"], int(r["kafka_partition"]), int(r["kafka_offset"]), source
            ),
        )
        return DeadLetter(int(r["id"]), r["status"], msg, r["error"], r["failed_at"], bool(r["replay_requested"]))

    def delete(self, conn: sa.Connection, ids: Collection[int]) -> None:
        if ids:
            conn.execute(sa.delete(self.table).where(self.table.c.id.in_(ids)))

    def fail_again(self, conn: sa.Connection, letter: DeadLetter, error: str, others: list[int]) -> None:
        """Make ``letter`` the key's dead letter with ``error``; clear the request on it and ``others``."""
        t = self.table.c
        conn.execute(
            sa.update(self.table)
            .where(t.id == letter.id)
            .values(status=DEAD, error=error, failed_at=datetime.now(UTC), replay_requested=False)
        )
        if others:
            conn.execute(sa.update(self.table).where(t.id.in_(others)).values(replay_requested=False))


# ------------------------------------------------------------------ for operators


def request_replay(
    conn: sa.Connection, table: sa.Table, group_id: str, *, topic: str | None = None, key: bytes | None = None
) -> int:
    """Ask the owning consumers to replay stored messages of ``group_id`` (optionally only
    ``topic``, only ``key``); returns how many rows were flagged."""
    t = table.c
    q = sa.update(table).where(t.group_id == group_id)
    if topic is not None:
        q = q.where(t.topic == topic)
    if key is not None:
        q = q.where(t.key_hash == key_hash(key))
    return int(conn.execute(q.values(replay_requested=True)).rowcount)


def list_dead_letters(conn: sa.Connection, table: sa.Table, group_id: str, limit: int = 100) -> list[DeadLetter]:
    t = table.c
    rows = conn.execute(sa.select(table).where(t.group_id == group_id).order_by(t.id).limit(limit)).mappings()
    dl = DeadLetters(table, group_id)
    return [dl._letter(r) for r in rows]

