"""The mark: how the oldest unmarked rows are escrowed for one leader, atomically.

Every dialect builds its mark from one builder, :class:`MarkQuery`, which decides *which*
rows a mark takes: those not marked by this leader, passing every row filter of the table
(the quarantine's today), oldest first, at most ``limit``, locked as the database needs. A
dialect chooses only *how* to run it:

* :class:`ReturningMark` — one ``UPDATE … WHERE id IN (oldest) RETURNING …`` (PostgreSQL and
  SQLite ``RETURNING``; SQL Server, where SQLAlchemy renders it ``OUTPUT inserted.…``);
* :class:`ReturningIdsMark` — the same update returning only the ids, then the rows read back
  in the transaction that locked them (Oracle, whose ``RETURNING`` goes through out-binds);
* :class:`TransactionalMark` — ``SELECT id … FOR UPDATE``, ``UPDATE``, read back (the generic
  mark, for MySQL and any database without ``UPDATE … RETURNING``).

A strategy runs the whole mark (its own transaction included) on a connection that has no
transaction begun, and returns the marked rows with the outbox table's columns in order, in
any row order (the binding sorts by id). :meth:`MarkStrategy.statements` lists what it runs,
for ``reaper schema --statements`` and the conformance kit's compiled checks.

Rows are locked with a plain, waiting lock, never ``SKIP LOCKED`` / ``READPAST`` / ``NOWAIT``:
skipping an older row of a key that another transaction holds (say a reset by a failing
leader) while marking a newer row of the same key would publish the key out of order.

The ``LIMIT`` is rendered as a literal: a server-side prepared statement with a bound limit
may get a generic plan that scans the whole table instead of walking the primary key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import sqlalchemy as sa

if TYPE_CHECKING:
    from pyharvest.plugins.api.table import OutboxTable

__all__ = [
    "IdMatcher",
    "MarkOptions",
    "MarkQuery",
    "MarkStrategy",
    "ReturningIdsMark",
    "ReturningMark",
    "TransactionalMark",
    "literal_limit",
]

# Oracle's IN-list limit; read-backs of more ids go in chunks.
READ_BACK_CHUNK = 1000


@runtime_checkable
class MarkStrategy(Protocol):
    def mark(self, connection: sa.Connection, leader_id: str, limit: int, after: int = 0) -> Sequence[Sequence[Any]]:
        """Mark up to ``limit`` of the oldest rows not marked by ``leader_id`` whose id is above
        ``after`` (the binding's key-set cursor: ``bindings/sql/mark_cursor.py``); commit; return
        them. A strategy written before ``after`` existed (no such parameter) is called without
        it and marks from the lowest id."""
        ...

    def statements(self, limit: int) -> Sequence[sa.Executable]:
        """The statements :meth:`mark` runs for ``limit``, in order (compiled by the caller for
        review; the one that chooses the rows must be :meth:`MarkQuery.oldest`'s)."""
        ...


def literal_limit(limit: int) -> sa.ColumnElement[int]:
    # int() guards the literal: only a number can reach the SQL text.
    return sa.literal_column(str(int(limit)), sa.Integer)


IdMatcher = Callable[[sa.Column[Any], sa.Select[Any]], sa.ColumnElement[bool]]


def _in_subquery(id_column: sa.Column[Any], oldest: sa.Select[Any]) -> sa.ColumnElement[bool]:
    return id_column.in_(oldest.scalar_subquery())


class MarkQuery:
    """The one mark builder: the ids of the oldest rows a mark takes, and the update marking them.

    ``lock=True`` adds a waiting ``FOR UPDATE`` to the row choice; ``lock=False`` is for
    databases that serialise writers (SQLite) or lock in the update itself (Oracle).
    ``table_hint`` instead locks through a table hint on an alias of the outbox (SQL Server's
    ``WITH (UPDLOCK, ROWLOCK)``: ``FOR UPDATE`` does not exist there). ``literal=False`` binds
    the limit as an integer that SQLAlchemy renders per execution (SQL Server's ``TOP (n)``
    needs it: a literal column makes SQLAlchemy fall back to ``ROW_NUMBER()``).
    ``match_ids`` replaces the ``id IN (…)`` join with the dialect's better form.
    """

    def __init__(
        self,
        outbox: OutboxTable,
        *,
        lock: bool = True,
        table_hint: str | None = None,
        literal: bool = True,
        match_ids: IdMatcher | None = None,
    ) -> None:
        self.outbox = outbox
        self.lock = lock and table_hint is None
        self.table_hint = table_hint
        self.literal = literal
        self.match_ids: IdMatcher = match_ids or _in_subquery
        self._cache: dict[tuple[str, int], Any] = {}

    def leader(self) -> sa.BindParameter[Any]:
        """The ``:leader_id`` parameter, typed like the column (a UUID in goharvest's layout)."""
        return sa.bindparam("leader_id", type_=self.outbox.leader_id.type)

    def after(self) -> sa.BindParameter[Any]:
        """The ``:after`` parameter: the id the mark starts above; 0 (the lowest) where a
        strategy's execution does not give it (one written before the cursor existed)."""
        return sa.bindparam("after", 0, type_=self.outbox.id.type)

    def oldest(self, limit: int) -> sa.Select[Any]:
        """``SELECT id FROM outbox WHERE id > :after AND <not marked by :leader_id> AND <every
        row filter> ORDER BY id LIMIT n [FOR UPDATE]``: the key-set cursor's ``id > :after``
        lets the primary key's walk start past what the leader already marked."""
        return self._cached("oldest", limit, self._oldest)  # type: ignore[no-any-return]

    def update(self, limit: int) -> sa.Update:
        """``UPDATE outbox SET leader_id = :leader_id WHERE id IN (oldest)``, no ``RETURNING``."""
        return self._cached("update", limit, self._update)  # type: ignore[no-any-return]

    def _oldest(self, limit: int) -> sa.Select[Any]:
        o = self.outbox
        source: sa.FromClause = o.table.alias("oldest") if self.table_hint else o.table
        choose = (
            sa.select(source.c.id)
            .where(source.c.id > self.after(), o.unmarked_by(self.leader(), source))
            .order_by(source.c.id)
            .limit(literal_limit(limit) if self.literal else int(limit))
        )
        if self.table_hint:
            choose = choose.with_hint(source, self.table_hint)
        elif self.lock:
            choose = choose.with_for_update()
        return choose

    def _update(self, limit: int) -> sa.Update:
        o = self.outbox
        return sa.update(o.table).where(self.match_ids(o.id, self.oldest(limit))).values(leader_id=self.leader())

    def _cached(self, kind: str, limit: int, build: Callable[[int], Any]) -> Any:
        # Statements differ only in their literal limit, which comes from config: build each once.
        key = (kind, limit)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) > 256:
                self._cache.clear()
            found = self._cache[key] = build(limit)
        return found


class ReturningMark:
    """One statement: ``UPDATE … SET leader_id = :leader_id WHERE id IN (oldest) RETURNING …``
    (``OUTPUT inserted.…`` on SQL Server).

    ``prelude`` runs first, in the mark's transaction: settings the dialect scopes to the mark
    alone (PostgreSQL's ``SET LOCAL``)."""

    def __init__(self, query: MarkQuery, prelude: Sequence[sa.Executable] = ()) -> None:
        self.query = query
        self.prelude = tuple(prelude)
        self._statements: dict[int, sa.Update] = {}

    def statement(self, limit: int) -> sa.Update:
        stmt = self._statements.get(limit)
        if stmt is None:
            stmt = self._statements[limit] = self.query.update(limit).returning(*self.query.outbox.columns)
        return stmt

    def statements(self, limit: int) -> Sequence[sa.Executable]:
        return [*self.prelude, self.statement(limit)]

    def mark(self, connection: sa.Connection, leader_id: str, limit: int, after: int = 0) -> Sequence[Sequence[Any]]:
        stmt = self.statement(limit)
        with connection.begin():
            for setting in self.prelude:
                connection.execute(setting)
            return connection.execute(stmt, {"leader_id": leader_id, "after": after}).all()


def _read_back(outbox: OutboxTable) -> sa.Select[Any]:
    return sa.select(*outbox.columns).where(outbox.id.in_(sa.bindparam("ids", expanding=True)))


class ReturningIdsMark:
    """``UPDATE … WHERE id IN (oldest) RETURNING id``, then the rows read back in the same
    transaction (the update's row locks keep them as marked). For databases whose
    ``RETURNING`` of whole rows is costly or limited (Oracle: out-binds, LOB columns)."""

    def __init__(self, query: MarkQuery) -> None:
        self.query = query
        self._read_back = _read_back(query.outbox)

    def statements(self, limit: int) -> Sequence[sa.Executable]:
        return [self.query.update(limit).returning(self.query.outbox.id), self._read_back]

    def mark(self, connection: sa.Connection, leader_id: str, limit: int, after: int = 0) -> Sequence[Sequence[Any]]:
        update, read_back = self.statements(limit)
        with connection.begin():
            marked = connection.execute(update, {"leader_id": leader_id, "after": after}).scalars()
            ids = [i for i in marked if i is not None]
            rows: list[Sequence[Any]] = []
            for start in range(0, len(ids), READ_BACK_CHUNK):
                rows.extend(connection.execute(read_back, {"ids": ids[start : start + READ_BACK_CHUNK]}).all())
            return rows


class TransactionalMark:
    """The generic mark, for any dialect without ``UPDATE … RETURNING``: in one transaction,
    ``SELECT id … ORDER BY id LIMIT n FOR UPDATE``, ``UPDATE … WHERE id IN (…)``, read the
    rows back, commit. The locks taken by the select keep the read-back consistent."""

    def __init__(self, query: MarkQuery) -> None:
        self.query = query
        o = query.outbox
        ids: sa.BindParameter[Any] = sa.bindparam("ids", expanding=True)
        self._update = sa.update(o.table).where(o.id.in_(ids)).values(leader_id=query.leader())
        self._read_back = _read_back(o)

    def statements(self, limit: int) -> Sequence[sa.Executable]:
        return [self.query.oldest(limit), self._update, self._read_back]

    def mark(self, connection: sa.Connection, leader_id: str, limit: int, after: int = 0) -> Sequence[Sequence[Any]]:
        with connection.begin():
            chosen = connection.execute(self.query.oldest(limit), {"leader_id": leader_id, "after": after})
            ids = chosen.scalars().all()
            if not ids:
                return []
            connection.execute(self._update, {"leader_id": leader_id, "ids": ids})
            return connection.execute(self._read_back, {"ids": ids}).all()


@dataclass(frozen=True, slots=True)
class MarkOptions:
    """How a dialect marks with the shared strategies, where it needs no code of its own
    (``pyharvest_mark_strategy``): the update's ``RETURNING`` and the row choice's locking, as
    SQLAlchemy's dialects declare ``update_returning``."""

    #: ``"rows"``: ``UPDATE … RETURNING`` the marked rows (:class:`ReturningMark`); ``"ids"``:
    #: returning their ids only, the rows read back in the same transaction
    #: (:class:`ReturningIdsMark`, Oracle's ``RETURNING … INTO``); None: select the rows, update
    #: and read them back (:class:`TransactionalMark`, which any SQL database runs).
    returning: Literal["rows", "ids"] | None = None
    #: ``FOR UPDATE`` on the row choice; False where writers are serialised anyway (SQLite) or
    #: the update's own row locks serialise markers (Oracle, which refuses ``FOR UPDATE`` beside
    #: ``FETCH FIRST``).
    lock: bool = True
    #: A table hint that locks the chosen rows instead (SQL Server's ``WITH (UPDLOCK, ROWLOCK)``).
    table_hint: str | None = None
    #: The limit as a literal (False: an integer SQLAlchemy renders per execution, which SQL
    #: Server's ``TOP (n)`` needs).
    literal_limit: bool = True

    def strategy(self, table: OutboxTable) -> MarkStrategy:
        """The strategy these options describe, marking ``table``."""
        query = MarkQuery(table, lock=self.lock, table_hint=self.table_hint, literal=self.literal_limit)
        if self.returning == "rows":
            return ReturningMark(query)
        if self.returning == "ids":
            return ReturningIdsMark(query)
        return TransactionalMark(query)
