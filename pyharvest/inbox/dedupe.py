"""Dropping copies the harvester published twice.

The harvester publishes at least once: a record acknowledged by Kafka but not yet purged
when its leader dies is published again by the next leader. Every copy carries the same
``(outbox, record id)``, so the inbox remembers the identities it applied (in the same
transaction as their effects) and drops repeats.

Why identities and not a per-key high-water mark of record ids: two writers that are not
causally related may commit a lower id after a higher one for the same key (ids are
allocated at insert, commits land in any order), and the harvester then publishes the
lower id second. A high-water mark would drop that record as "already seen": a loss.

Storage is bounded by position: a copy lands in the same partition as its original (same
key), a short distance after it — MP/R republishes only records that were in flight when a
leader died, so per outbox the distance is at most about the harvester's in-flight window
(``maxInFlightRecords``). Identities more than ``window`` offsets behind a partition's
checkpoint are pruned.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import sqlalchemy as sa

__all__ = ["Dedupe", "Source"]

Source = tuple[str, int]
_CHUNK = 500  # identities per IN (...): well under every database's parameter limit


def _is_psycopg(conn: sa.Connection) -> bool:
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


class Dedupe:
    def __init__(self, table: sa.Table, group_id: str) -> None:
        self.table = table
        self.group_id = group_id
        t = table.c
        self._lookup = sa.select(t.record_id).where(
            t.group_id == sa.bindparam("g"),
            t.outbox == sa.bindparam("o"),
            t.record_id.in_(sa.bindparam("ids", expanding=True)),
        )
        self._insert = sa.insert(table)
        self._prune = sa.delete(table).where(
            t.group_id == sa.bindparam("g"),
            t.topic == sa.bindparam("t"),
            t.kafka_partition == sa.bindparam("p"),
            t.kafka_offset < sa.bindparam("below"),
        )

    def applied(self, conn: sa.Connection, sources: Iterable[Source]) -> set[Source]:
        """Which of ``sources`` were applied already (by any transaction that committed)."""
        by_outbox: dict[str, list[int]] = defaultdict(list)
        for outbox, record_id in sources:
            by_outbox[outbox].append(record_id)
        found: set[Source] = set()
        if _is_psycopg(conn):
            # One round trip per outbox, the ids as one array parameter.
            sql = (
                f"SELECT record_id FROM {self._quoted(conn)} "  # noqa: S608 - a validated, quoted identifier
                "WHERE group_id = %s AND outbox = %s AND record_id = ANY(%s::int8[])"
            )
            with conn.connection.driver_connection.cursor() as cur:  # type: ignore[union-attr]
                for outbox, ids in by_outbox.items():
                    cur.execute(sql, (self.group_id, outbox, ids))
                    found.update((outbox, int(r[0])) for r in cur.fetchall())
            return found
        for outbox, ids in by_outbox.items():
            for i in range(0, len(ids), _CHUNK):
                rows = conn.execute(self._lookup, {"g": self.group_id, "o": outbox, "ids": ids[i : i + _CHUNK]})
                found.update((outbox, int(r[0])) for r in rows)
        return found

    def remember(self, conn: sa.Connection, rows: list[dict[str, object]]) -> None:
        """Insert applied identities: ``{"outbox", "record_id", "topic", "kafka_partition",
        "kafka_offset"}`` each (one executemany)."""
        if not rows:
            return
        g = self.group_id
        if _is_psycopg(conn):
            # COPY in binary: several times faster than even multi-row INSERTs, and the dedupe
            # rows are most of what the inbox itself writes.
            sql = (
                f"COPY {self._quoted(conn)} (group_id, outbox, record_id, topic, kafka_partition, kafka_offset) "
                "FROM STDIN (FORMAT BINARY)"
            )
            with conn.connection.driver_connection.cursor() as cur, cur.copy(sql) as copy:  # type: ignore[union-attr]
                copy.set_types(["text", "text", "int8", "text", "int4", "int8"])
                write = copy.write_row
                for r in rows:
                    write((g, r["outbox"], r["record_id"], r["topic"], r["kafka_partition"], r["kafka_offset"]))
            return
        conn.execute(self._insert, [{"group_id": g, **r} for r in rows])

    def _quoted(self, conn: sa.Connection) -> str:
        p = conn.dialect.identifier_preparer
        q = p.quote(self.table.name)
        return f"{p.quote_schema(self.table.schema)}.{q}" if self.table.schema else q

    @staticmethod
    def row(source: Source, topic: str, partition: int, offset: int) -> dict[str, object]:
        return {
            "outbox": source[0],
            "record_id": source[1],
            "topic": topic,
            "kafka_partition": partition,
            "kafka_offset": offset,
        }

    def prune(self, conn: sa.Connection, topic: str, partition: int, below_offset: int) -> int:
        if below_offset <= 0:
            return 0
        result = conn.execute(self._prune, {"g": self.group_id, "t": topic, "p": partition, "below": below_offset})
        return max(result.rowcount, 0)
