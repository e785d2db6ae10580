"""Many rows into a table: the dialect's bulk writer where it has one, else ``executemany``.

One helper for every caller that inserts batches of tuples into a table it describes with
SQLAlchemy (the inbox's dedupe identities, Spark's staging tables and its sink's identities):

>>> insert = BulkInsert(table, ["group_id", "record_id"], exact_types=True)  # doctest: +SKIP
>>> insert(connection, rows)  # doctest: +SKIP

The dialect is asked for its writer (``pyharvest_bulk_writer``: PostgreSQL's ``COPY``) once
per engine and kept; a batch smaller than the writer's ``min_rows``, a batch the writer
declines, and every batch on a database without a writer go through ``executemany`` in
chunks. Either way the rows land in the caller's transaction, and values go through the
columns' :class:`~sqlalchemy.types.TypeDecorator` conversions first (before ``COPY`` as
before an ``INSERT``).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

import sqlalchemy as sa

from pyharvest.plugins.api import BulkWriter, Dialect, dialect_of

__all__ = ["EXECUTEMANY_CHUNK", "BulkInsert"]

# Rows per executemany (and per writer call when the rows come from an iterator): PyMySQL
# folds each call into multi-row INSERTs of at most max_allowed_packet; SQLite gains nothing
# beyond a few thousand; memory stays bounded when the rows are streamed.
EXECUTEMANY_CHUNK = 5000

_Converter = Callable[[Any], Any]


class BulkInsert:
    """Inserts rows (tuples in ``columns`` order) into ``table``; see the module.

    ``exact_types``: the database's columns have exactly ``table``'s types (pyharvest created
    the table from it), so the writer may use a binary protocol. Say False for a table known
    only by its column names (its types are then :class:`~sqlalchemy.types.NullType`).
    ``dialect``: the pyharvest dialect to ask (one named in the configuration); by default the
    one serving the connection's database (:func:`~pyharvest.plugins.api.dialect_of`)."""

    def __init__(
        self,
        table: sa.Table,
        columns: Sequence[str] | None = None,
        *,
        exact_types: bool = False,
        chunk_rows: int = EXECUTEMANY_CHUNK,
        dialect: Dialect | None = None,
    ) -> None:
        self.table = table
        self.columns = list(columns) if columns is not None else [c.name for c in table.columns]
        unknown = [c for c in self.columns if c not in table.c]
        if unknown:
            raise ValueError(f"{table.fullname} has no column(s) {', '.join(unknown)}")
        self.exact_types = exact_types
        self.chunk_rows = chunk_rows
        self.dialect = dialect
        self._insert = sa.insert(table)
        self._lock = threading.Lock()
        # engine → the dialect's writer for this table, or None where it has none
        self._writers: weakref.WeakKeyDictionary[sa.Engine, BulkWriter | None] = weakref.WeakKeyDictionary()
        # SQLAlchemy dialect → the columns' TypeDecorator conversions, None where no column has one
        self._converters: dict[sa.Dialect, list[_Converter | None] | None] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with its owner (a Spark sink may travel to another process): not the caches.
        state = dict(self.__dict__)
        for name in ("_lock", "_writers", "_converters"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._writers = weakref.WeakKeyDictionary()
        self._converters = {}

    def __repr__(self) -> str:
        return f"BulkInsert({self.table.fullname!r}, {self.columns!r}, exact_types={self.exact_types!r})"

    def __call__(self, connection: sa.Connection, rows: Iterable[Sequence[Any]]) -> int:
        """Insert ``rows`` in ``connection``'s transaction; return how many."""
        writer = self.writer(connection)
        converters = self._converters_for(connection.dialect) if writer is not None else None
        n = 0
        for chunk in self._chunks(rows, writer):
            if not chunk:
                continue
            if writer is not None and len(chunk) >= writer.min_rows:
                converted = chunk if converters is None else [_converted(row, converters) for row in chunk]
                if writer(connection, converted):
                    n += len(chunk)
                    continue
            self._executemany(connection, chunk, writer)
            n += len(chunk)
        return n

    def writer(self, connection: sa.Connection) -> BulkWriter | None:
        """The dialect's bulk writer for this table on ``connection``'s engine (asked once)."""
        engine = connection.engine
        with self._lock:
            if engine in self._writers:
                return self._writers[engine]
        dialect = self.dialect or dialect_of(connection)
        writer = (
            None
            if dialect is None
            else dialect.bulk_writer(connection, self.table, self.columns, exact_types=self.exact_types)
        )
        with self._lock:
            self._writers[engine] = writer
        return writer

    def _chunks(self, rows: Iterable[Sequence[Any]], writer: BulkWriter | None) -> Iterator[Sequence[Sequence[Any]]]:
        if writer is not None and isinstance(rows, Sequence):
            yield rows  # all at once: one COPY
            return
        if isinstance(rows, Sequence) and len(rows) <= self.chunk_rows:
            yield rows
            return
        it = iter(rows)
        while chunk := list(islice(it, self.chunk_rows)):
            yield chunk

    def _executemany(self, connection: sa.Connection, rows: Sequence[Sequence[Any]], writer: BulkWriter | None) -> None:
        columns = self.columns
        step = self.chunk_rows
        try:
            for i in range(0, len(rows), step):
                connection.execute(self._insert, [dict(zip(columns, row, strict=True)) for row in rows[i : i + step]])
        except sa.exc.DBAPIError:
            if writer is None:
                # The dialect may have declined for want of the table, which is why this failed
                # too: ask it again next time rather than keep executemany for good.
                with self._lock:
                    self._writers.pop(connection.engine, None)
            raise

    def _converters_for(self, dialect: sa.Dialect) -> list[_Converter | None] | None:
        """What ``executemany`` would apply before the driver sees a value and a writer does
        not: the columns' :class:`~sqlalchemy.types.TypeDecorator` conversions (the driver's
        own adaptation is the writer's business). None where no column has one."""
        try:
            return self._converters[dialect]
        except KeyError:
            pass
        found: list[_Converter | None] = []
        for c in self.columns:
            column_type = self.table.c[c].type
            found.append(
                functools.partial(_convert, column_type, dialect)
                if isinstance(column_type, sa.types.TypeDecorator)
                else None
            )
        converters = found if any(found) else None
        self._converters[dialect] = converters
        return converters


def _convert(column_type: sa.types.TypeDecorator[Any], dialect: sa.Dialect, value: Any) -> Any:
    return column_type.process_bind_param(value, dialect)


def _converted(row: Sequence[Any], converters: list[_Converter | None]) -> tuple[Any, ...]:
    return tuple(value if f is None else f(value) for f, value in zip(converters, row, strict=True))
