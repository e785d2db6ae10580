"""Dropping copies the harvester published twice: the one store of applied identities, used by
the inbox (:class:`Dedupe`) and by Spark's exactly-once sink
(:mod:`pyharvest.bindings.spark.partition_apply`).

The harvester publishes at least once: a record acknowledged by Kafka but not yet purged
when its leader dies is published again by the next leader. Every copy carries the same
``(outbox, record id)``, so a consumer remembers the identities it applied (in the same
transaction as their effects) and drops repeats.

Why identities and not a per-key high-water mark of record ids: two writers that are not
causally related may commit a lower id after a higher one for the same key (ids are
allocated at insert, commits land in any order), and the harvester then publishes the
lower id second. A high-water mark would drop that record as "already seen": a loss.

The inbox's storage is bounded by position: a copy lands in the same partition as its
original (same key), a short distance after it — MP/R republishes only records that were in
flight when a leader died, so per outbox the distance is at most about the harvester's
in-flight window (``maxInFlightRecords``). Identities more than ``window`` offsets behind a
partition's checkpoint are pruned. (The Spark sink prunes by age instead.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from pyharvest.bindings.sql.bulk_insert import BulkInsert, Rows
from pyharvest.core.inbox.message import InboxMessage, Source
from pyharvest.plugins.api import Dialect, dialect_of

__all__ = ["Dedupe", "IdentityStore"]

_CHUNK = 1000  # identities per look-up where no pyharvest dialect serves the database


class IdentityStore:
    """Identities applied, in ``table``: each row one ``identity`` within a scope (the values
    of the ``scope`` columns: a consumer group and an outbox, or a sink's name). Looks them up
    in bulk through the dialect's list filter, and inserts them through its bulk writer.

    ``bounded``: the look-up also bounds the identity by the smallest and largest asked, which
    changes no answer but keeps it an index range scan whatever the planner believes
    (PostgreSQL, without statistics on a young table, took an id list for a filter and read
    every identity of the group: 120 ms instead of 6 ms for 5,000 ids among 200,000). The
    table was created from its definition: its types are exact (a binary ``COPY``).
    Each method asks the pyharvest ``dialect`` given, by default the one serving the connection.
    """

    def __init__(
        self,
        table: sa.Table,
        scope: Sequence[str],
        identity: str,
        *,
        columns: Sequence[str] | None = None,
        bounded: bool = False,
    ) -> None:
        self.table = table
        self.scope = tuple(scope)
        self.identity = identity
        self.bounded = bounded
        self.columns = tuple(columns) if columns is not None else tuple(c.name for c in table.columns)
        self._insert = BulkInsert(table, self.columns, exact_types=True)
        # BulkInsert asks a dialect named at the call (insert_new's) through one of these.
        self._inserts: dict[str, BulkInsert] = {}
        # SQLAlchemy dialect name → (look-up statement, identities per execution or None for all)
        self._lookups: dict[str, tuple[sa.Select[Any], int | None]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lookups"] = {}  # statements are rebuilt where the store is unpickled
        return state

    def _lookup(self, conn: sa.Connection, dialect: Dialect | None) -> tuple[sa.Select[Any], int | None]:
        found = self._lookups.get(conn.dialect.name)
        if found is None:
            c = self.table.c
            column = c[self.identity]
            dialect = dialect or dialect_of(conn)
            ids: sa.ColumnElement[bool]
            limit: int | None
            if dialect is None:
                ids, limit = column.in_(sa.bindparam("ids", expanding=True)), _CHUNK
            else:
                ids, limit = dialect.list_filter(column, "ids"), dialect.capabilities.list_limit
            where = [c[name] == sa.bindparam(f"scope_{name}") for name in self.scope]
            if self.bounded:
                where += [column >= sa.bindparam("lo"), column <= sa.bindparam("hi")]
            found = self._lookups[conn.dialect.name] = (sa.select(column).where(*where, ids), limit)
        return found

    def present(
        self,
        conn: sa.Connection,
        scope: Mapping[str, object],
        identities: Sequence[Any],
        dialect: Dialect | None = None,
    ) -> set[Any]:
        """Which of ``identities`` (of the ``scope`` given by column) the table holds."""
        found: set[Any] = set()
        if not identities:
            return found
        stmt, limit = self._lookup(conn, dialect)
        base = {f"scope_{name}": scope[name] for name in self.scope}
        step = limit or len(identities)
        for i in range(0, len(identities), step):
            chunk = identities[i : i + step]
            params: dict[str, object] = {**base, "ids": chunk}
            if self.bounded:
                params.update(lo=min(chunk), hi=max(chunk))
            found.update(r[0] for r in conn.execute(stmt, params))
        return found

    def insert(self, conn: sa.Connection, rows: Iterable[Sequence[Any]], dialect: Dialect | None = None) -> int:
        """Insert rows of :attr:`columns` (the dialect's bulk writer, e.g. ``COPY``, else one
        ``executemany``)."""
        if dialect is None:
            return self._insert(conn, rows)
        insert = self._inserts.get(dialect.name)
        if insert is None:
            insert = BulkInsert(self.table, self.columns, exact_types=True, dialect=dialect)
            self._inserts[dialect.name] = insert
        return insert(conn, rows)

    def insert_new(
        self,
        conn: sa.Connection,
        scope: Mapping[str, object],
        identities: Sequence[Any],
        values: Mapping[str, object],
        dialect: Dialect | None = None,
    ) -> set[Any]:
        """Remember the ``identities`` (distinct) the table does not hold yet, with the other
        columns' ``values``; return those it held. The dialect's way where it has one
        (PostgreSQL: one ``COPY`` into a temporary table and one ``INSERT … ON CONFLICT DO
        NOTHING``, no look-up; ``values`` must then differ from every earlier call's), else a
        look-up and an insert of the others."""
        asked = dialect or dialect_of(conn)
        if asked is not None:
            held = asked.insert_new_keys(conn, self.table, self.identity, identities, {**scope, **values})
            if held is not None:
                return set(held)
        found = self.present(conn, scope, identities, dialect)
        fixed = {**scope, **values}
        positions = [(name, self.columns.index(name)) for name in fixed]
        at = self.columns.index(self.identity)
        template: list[Any] = [None] * len(self.columns)
        for name, i in positions:
            template[i] = fixed[name]

        def row(identity: Any) -> tuple[Any, ...]:
            out = list(template)
            out[at] = identity
            return tuple(out)

        self.insert(conn, [row(i) for i in identities if i not in found], dialect)
        return found


class Dedupe:
    """The inbox's applied identities of one consumer group, in ``table``; a
    :class:`~pyharvest.core.inbox.ports.DedupeStore`."""

    def __init__(self, table: sa.Table, group_id: str) -> None:
        self.table = table
        self.group_id = group_id
        t = table.c
        self._store = IdentityStore(
            table,
            ("group_id", "outbox"),
            "record_id",
            columns=("group_id", "outbox", "record_id", "topic", "kafka_partition", "kafka_offset"),
            bounded=True,
        )
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
        for outbox, ids in by_outbox.items():
            held = self._store.present(conn, {"group_id": self.group_id, "outbox": outbox}, ids)
            found.update((outbox, int(i)) for i in held)
        return found

    def remember(self, conn: sa.Connection, messages: Sequence[InboxMessage]) -> None:
        """Insert the identities of the applied ``messages`` that have one."""
        n = sum(1 for m in messages if m.source is not None)
        if not n:
            return
        g = self.group_id

        def tuples() -> Iterator[tuple[object, ...]]:
            for m in messages:
                source = m.source
                if source is not None:
                    yield (g, source[0], source[1], m.topic, m.partition, m.offset)

        self._store.insert(conn, Rows(n, tuples))  # made while written, not held in a list

    def prune(self, conn: sa.Connection, topic: str, partition: int, below_offset: int) -> int:
        if below_offset <= 0:
            return 0
        result = conn.execute(self._prune, {"g": self.group_id, "t": topic, "p": partition, "below": below_offset})
        return max(result.rowcount, 0)
