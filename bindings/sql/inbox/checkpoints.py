"""Checkpoints with a write fence, after Gazette's SQLStore.

Taking a partition over (:meth:`Checkpoints.claim`) increments its fence in a transaction
of its own and reads back the next offset; the claimant remembers the fence it wrote.
Every later transaction that applies messages of the partition moves the offset with
``UPDATE … WHERE fence = :mine`` (:meth:`Checkpoints.advance`) and commits only if that
matched one row. A consumer that lost the partition — even one that does not know it yet,
cut off from Kafka — finds the fence moved and rolls back: its effects never commit, and
the new owner resumes exactly where the last committed transaction left off.

Row locks order the two: if the old owner's fenced update runs first, the claim waits for
its commit and reads its offset; if the claim runs first, the old owner's update matches
nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import sqlalchemy as sa

from pyharvest.core.inbox.ports import Claim, TopicPartition

__all__ = ["Checkpoints"]


def _now() -> datetime:
    return datetime.now(UTC)


class Checkpoints:
    """The fenced checkpoints of one consumer group in ``table``; a
    :class:`~pyharvest.core.inbox.ports.CheckpointStore`."""

    def __init__(self, table: sa.Table, group_id: str, owner: str) -> None:
        self.table = table
        self.group_id = group_id
        self.owner = owner[:255]
        t = table.c
        where = sa.and_(
            t.group_id == sa.bindparam("g"), t.topic == sa.bindparam("t"), t.kafka_partition == sa.bindparam("p")
        )
        self._where = where
        self._bump = (
            sa.update(table)
            .where(where)
            .values(fence=t.fence + 1, owner=sa.bindparam("o"), updated_at=sa.bindparam("now"))
        )
        self._advance = (
            sa.update(table)
            .where(where, t.fence == sa.bindparam("f"))
            .values(next_offset=sa.bindparam("n"), updated_at=sa.bindparam("now"))
        )
        self._touch = sa.update(table).where(where, t.fence == sa.bindparam("f")).values(updated_at=sa.bindparam("now"))
        self._read = sa.select(t.fence, t.next_offset).where(where)

    def _key(self, tp: TopicPartition) -> dict[str, object]:
        return {"g": self.group_id, "t": tp[0], "p": tp[1]}

    def claim(self, conn: sa.Connection, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, Claim]:
        """Bump the fence of each partition (creating its row if missing) within ``conn``'s
        transaction, which the caller commits. Partitions are visited in sorted order so that
        two claimants cannot deadlock on each other's rows."""
        out: dict[TopicPartition, Claim] = {}
        now = _now()
        for tp in sorted(set(partitions)):
            key = self._key(tp)
            if conn.execute(self._bump, {**key, "o": self.owner, "now": now}).rowcount != 1:
                # A first claim. Two first claimants race to insert: the loser's transaction
                # fails with IntegrityError and its caller claims again (then bumping).
                conn.execute(
                    sa.insert(self.table),
                    {
                        "group_id": self.group_id,
                        "topic": tp[0],
                        "kafka_partition": tp[1],
                        "next_offset": None,
                        "fence": 1,
                        "owner": self.owner,
                        "updated_at": now,
                    },
                )
            fence, next_offset = conn.execute(self._read, key).one()
            out[tp] = Claim(int(fence), None if next_offset is None else int(next_offset))
        return out

    def advance(self, conn: sa.Connection, tp: TopicPartition, next_offset: int, fence: int) -> bool:
        """Move the partition's offset in ``conn``'s transaction if ``fence`` still holds."""
        result = conn.execute(self._advance, {**self._key(tp), "f": fence, "n": next_offset, "now": _now()})
        return result.rowcount == 1

    def verify(self, conn: sa.Connection, tp: TopicPartition, fence: int) -> bool:
        """Check (and lock, until ``conn`` commits) the fence without moving the offset."""
        return conn.execute(self._touch, {**self._key(tp), "f": fence, "now": _now()}).rowcount == 1

    def read(self, conn: sa.Connection, tp: TopicPartition) -> Claim | None:
        row = conn.execute(self._read, self._key(tp)).one_or_none()
        return None if row is None else Claim(int(row[0]), None if row[1] is None else int(row[1]))
