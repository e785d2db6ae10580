"""Mark strategies: how the oldest unmarked rows are escrowed for one leader, atomically.

A strategy runs the whole mark (its own transaction included) on a connection that has no
transaction begun, and returns the marked rows with the outbox table's columns in order,
in any row order (the binding sorts by id).

Rows are locked with a plain, waiting ``FOR UPDATE``, never ``SKIP LOCKED``: skipping an
older row of a key that another transaction holds (say a reset by a failing leader) while
marking a newer row of the same key would publish the key out of order.

The ``LIMIT`` is rendered as a literal: a server-side prepared statement with a bound
limit may get a generic plan that scans the whole table instead of walking the primary key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import sqlalchemy as sa

from pyharvest.bindings.sql.outbox import OutboxTable

__all__ = ["MarkStrategy", "ReturningMark", "TransactionalMark", "literal_limit"]


@runtime_checkable
class MarkStrategy(Protocol):
    def mark(self, connection: sa.Connection, leader_id: str, limit: int) -> Sequence[Sequence[Any]]:
        """Mark up to ``limit`` of the oldest rows not marked by ``leader_id``; commit; return them."""
        ...


def literal_limit(limit: int) -> sa.ColumnElement[int]:
    # int() guards the literal: only a number can reach the SQL text.
    return sa.literal_column(str(int(limit)), sa.Integer)


def leader_param(outbox: OutboxTable) -> sa.BindParameter[Any]:
    return sa.bindparam("leader_id", type_=outbox.leader_id.type)


class _PerLimitCache:
    """Statements differ only in their literal limit; build each once."""

    def __init__(self) -> None:
        self._statements: dict[int, Any] = {}

    def get(self, limit: int, build: Any) -> Any:
        stmt = self._statements.get(limit)
        if stmt is None:
            if len(self._statements) > 256:  # limits come from config; bound it anyway
                self._statements.clear()
            stmt = self._statements[limit] = build(limit)
        return stmt


IdMatcher = Callable[[sa.Column[Any], sa.Select[Any]], sa.ColumnElement[bool]]


def _in_subquery(id_column: sa.Column[Any], oldest: sa.Select[Any]) -> sa.ColumnElement[bool]:
    return id_column.in_(oldest.scalar_subquery())


class ReturningMark:
    """One statement: ``UPDATE … SET leader_id = :leader WHERE id IN (SELECT id … ORDER BY id
    LIMIT n FOR UPDATE) RETURNING …``. ``match_ids`` replaces the ``id IN (…)`` join with
    the dialect's better form. For databases with ``UPDATE … RETURNING``
    (PostgreSQL, SQLite ≥ 3.35, MariaDB has none for UPDATE). ``lock=False`` drops the
    ``FOR UPDATE`` where the database serialises writers anyway (SQLite)."""

    def __init__(self, outbox: OutboxTable, *, lock: bool = True, match_ids: IdMatcher | None = None) -> None:
        self.outbox = outbox
        self.lock = lock
        self.match_ids: IdMatcher = match_ids or _in_subquery
        self._cache = _PerLimitCache()

    def statement(self, limit: int) -> sa.Update:
        return self._cache.get(limit, self._build)  # type: ignore[no-any-return]

    def _build(self, limit: int) -> sa.Update:
        o = self.outbox
        param = leader_param(o)
        oldest = sa.select(o.id).where(o.unmarked_by(param)).order_by(o.id).limit(literal_limit(limit))
        if self.lock:
            oldest = oldest.with_for_update()
        return (
            sa.update(o.table)
            .where(self.match_ids(o.id, oldest))
            .values(leader_id=param)
            .returning(*o.columns)
        )

    def mark(self, connection: sa.Connection, leader_id: str, limit: int) -> Sequence[Sequence[Any]]:
        stmt = self.statement(limit)
        with connection.begin():
            return connection.execute(stmt, {"leader_id": leader_id}).all()


class TransactionalMark:
    """The generic mark, for any dialect without ``UPDATE … RETURNING``: in one transaction,
    ``SELECT id … ORDER BY id LIMIT n FOR UPDATE``, ``UPDATE … WHERE id IN (…)``, read the
    rows back, commit. The locks taken by the select keep the read-back consistent."""

    def __init__(self, outbox: OutboxTable) -> None:
        self.outbox = outbox
        self._cache = _PerLimitCache()
        o = outbox
        ids: sa.BindParameter[Any] = sa.bindparam("ids", expanding=True)
        self._update = sa.update(o.table).where(o.id.in_(ids)).values(leader_id=leader_param(o))
        self._read_back = sa.select(*o.columns).where(o.id.in_(ids))

    def select_statement(self, limit: int) -> sa.Select[Any]:
        return self._cache.get(limit, self._build_select)  # type: ignore[no-any-return]

    def _build_select(self, limit: int) -> sa.Select[Any]:
        o = self.outbox
        return (
            sa.select(o.id)
            .where(o.unmarked_by(leader_param(o)))
            .order_by(o.id)
            .limit(literal_limit(limit))
            .with_for_update()
        )

    def mark(self, connection: sa.Connection, leader_id: str, limit: int) -> Sequence[Sequence[Any]]:
        with connection.begin():
            ids = connection.execute(self.select_statement(limit), {"leader_id": leader_id}).scalars().all()
            if not ids:
                return []
            connection.execute(self._update, {"leader_id": leader_id, "ids": ids})
            return connection.execute(self._read_back, {"ids": ids}).all()
