"""The SQL binding: mark, purge and reset over a SQLAlchemy engine."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from itertools import islice
from operator import attrgetter
from typing import Any

import sqlalchemy as sa

from pyharvest.bindings.sql.marking import MarkStrategy
from pyharvest.bindings.sql.outbox import MalformedRowError, OutboxTable
from pyharvest.core.records import OutboxRecord
from pyharvest.plugins.manager import Dialect

__all__ = ["ID_BATCH", "MalformedRowHandler", "SqlBinding"]

log = logging.getLogger("pyharvest.bindings.sql")

# Ids per purge/reset statement: Oracle's IN-list limit, and well under SQL Server's 2,100
# parameters per statement.
ID_BATCH = 1000

MalformedRowHandler = Callable[[MalformedRowError], None]
_by_id = attrgetter("id")


class SqlBinding:
    """A :class:`~pyharvest.core.binding.DatabaseBinding` for one outbox table.

    Thread-safe: each call checks a connection out of the engine's small pool, so the mark
    thread and the purge/reset thread never share one.

    A row that cannot be decoded (see :class:`MalformedRowError`) is marked like any other
    but left out of the result: it is logged at ERROR with its id and passed to
    ``on_malformed``. It stays marked by this leader, so it neither stalls the mark nor
    blocks other keys; each new leader id logs it again until someone fixes or deletes it.
    """

    def __init__(
        self,
        engine: sa.Engine,
        outbox: OutboxTable,
        dialect: Dialect,
        *,
        marker: MarkStrategy | None = None,
        on_malformed: MalformedRowHandler | None = None,
        display_url: str = "",
    ) -> None:
        self.engine = engine
        self.outbox = outbox
        self.dialect = dialect
        self.marker = marker or dialect.mark_strategy(outbox)
        self.on_malformed = on_malformed
        self.malformed_rows = 0
        self._display_url = display_url
        where = dialect.id_filter(outbox.id)
        self._purge = sa.delete(outbox.table).where(where)
        self._reset = sa.update(outbox.table).where(where).values(leader_id=sa.null())

    def __repr__(self) -> str:
        return (
            f"SqlBinding(dialect={self.dialect.name!r}, table={str(self.outbox.name)!r}, "
            f"layout={self.outbox.layout!r}, url={self._display_url!r})"
        )

    def mark(self, leader_id: str, limit: int) -> list[OutboxRecord]:
        if limit <= 0:
            return []
        with self.engine.connect() as conn:
            rows = self.marker.mark(conn, leader_id, limit)
        decode = self.outbox.decode
        records: list[OutboxRecord] = []
        append = records.append
        for row in rows:
            try:
                append(decode(row))
            except MalformedRowError as e:
                self._malformed(e)
        records.sort(key=_by_id)
        return records

    def _malformed(self, error: MalformedRowError) -> None:
        self.malformed_rows += 1
        log.error("refusing malformed outbox row in %s (left marked, not published): %s", self.outbox.name, error)
        if self.on_malformed is not None:
            try:
                self.on_malformed(error)
            except Exception:  # noqa: BLE001 - a faulty handler must not break the mark
                log.exception("on_malformed handler failed")

    def purge(self, ids: Sequence[int]) -> int:
        return self._by_ids(self._purge, ids)

    def reset(self, ids: Sequence[int]) -> int:
        return self._by_ids(self._reset, ids)

    def _by_ids(self, statement: sa.Executable, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        total = 0
        it = iter(ids)
        with self.engine.begin() as conn:
            while chunk := list(islice(it, ID_BATCH)):
                result: Any = conn.execute(statement, {"ids": chunk})
                total += result.rowcount
        return total

    def dispose(self) -> None:
        self.engine.dispose()
