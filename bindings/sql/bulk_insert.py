"""Many rows into a table: the dialect's bulk writer where it has one, else ``executemany``.

One helper for every caller that inserts batches of tuples into a table it describes with
SQLAlchemy (the inbox's dedupe identities, Spark's staging tables and its sink's identities):

>>> insert = BulkInsert(table, ["group_id", "record_id"], exact_types=True)  # doctest: +SKIP
>>> insert(connection, rows)  # doctest: +SKIP

The dialect is asked for its writer (``pyharvest_bulk_writer``: PostgreSQL's ``COPY``) once
per engine and kept; a batch smaller than the writer's ``min_rows``, a batch the writer
declines, and every batch on a database without a writer go through ``executemany`` in
chunks. An iterator of rows is streamed to the writer, read once as it is written (one
``COPY``, no list of the rows in memory): a writer reads its rows once, as PostgreSQL's does;
one that reads them twice gets an error, never a silent loss. Either way the rows land in
the caller's transaction, and values go through the columns'
:class:`~sqlalchemy.types.TypeDecorator` conversions first (before ``COPY`` as before an
``INSERT``).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import Any, cast, overload

import sqlalchemy as sa

from pyharvest.plugins.api import BulkWriter, Dialect, dialect_of

__all__ = ["EXECUTEMANY_CHUNK", "BulkInsert", "BulkWriters", "Rows"]

# Rows per executemany (and per writer call when the rows come from an iterator): PyMySQL
# folds each call into multi-row INSERTs of at most max_allowed_packet; SQLite gains nothing
# beyond a few thousand; memory stays bounded when the rows are streamed.
EXECUTEMANY_CHUNK = 5000

_Converter = Callable[[Any], Any]


class BulkWriters:
    """A dialect's bulk writer for one table, asked once per engine and kept: the one rule for
    everything that bulk-inserts (:class:`BulkInsert`, the stasher). An answer of None is
    forgotten when an ``INSERT`` into the table then fails: the dialect may have declined for
    want of the table, which is why the insert failed too, so it is asked again once the table
    exists rather than executemany kept for good."""

    def __init__(self, ask: Callable[[sa.Connection], BulkWriter | None]) -> None:
        self._ask = ask
        self._lock = threading.Lock()
        # engine → the dialect's writer, or None where it has none
        self._writers: weakref.WeakKeyDictionary[sa.Engine, BulkWriter | None] = weakref.WeakKeyDictionary()

    def get(self, connection: sa.Connection) -> BulkWriter | None:
        """The writer on ``connection``'s engine, asked on ``connection`` the first time."""
        engine = connection.engine
        with self._lock:
            if engine in self._writers:
                return self._writers[engine]
        writer = self._ask(connection)
        with self._lock:
            self._writers[engine] = writer
        return writer

    def insert_failed(self, engine: sa.Engine) -> None:
        """An ``INSERT`` failed on ``engine``: forget a None answer, so that the dialect is asked again."""
        with self._lock:
            if engine in self._writers and self._writers[engine] is None:
                del self._writers[engine]

    def forget(self, engine: sa.Engine) -> None:
        """Ask again next time, whatever the answer was (the table changed)."""
        with self._lock:
            self._writers.pop(engine, None)


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
        self._writers = BulkWriters(self._ask)
        # SQLAlchemy dialect → the columns' TypeDecorator conversions, None where no column has one
        self._converters: dict[sa.Dialect, list[_Converter | None] | None] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with its owner (a Spark sink may travel to another process): not the caches.
        state = dict(self.__dict__)
        for name in ("_writers", "_converters"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._writers = BulkWriters(self._ask)
        self._converters = {}

    def __repr__(self) -> str:
        return f"BulkInsert({self.table.fullname!r}, {self.columns!r}, exact_types={self.exact_types!r})"

    def __call__(self, connection: sa.Connection, rows: Iterable[Sequence[Any]]) -> int:
        """Insert ``rows`` in ``connection``'s transaction; return how many. A sequence (a
        list, :class:`Rows`) goes to the writer in one call; so does an iterator, read as it
        is written (one ``COPY``, nothing held in memory), once it has ``min_rows`` rows."""
        writer = self.writer(connection)
        if writer is None:
            return self._executemany(connection, rows, None)
        converters = self._converters_for(connection.dialect)
        if isinstance(rows, Sequence):
            if len(rows) >= writer.min_rows:
                converted = rows if converters is None else Rows(len(rows), lambda: _convert_all(rows, converters))
                if writer(connection, converted):
                    return len(rows)
            return self._executemany(connection, rows, writer)
        it = iter(rows)
        head = list(islice(it, writer.min_rows))
        if len(head) < writer.min_rows:
            return self._executemany(connection, head, writer)
        stream = _Stream(chain(head, it), converters)
        if writer(connection, cast("Sequence[Sequence[Any]]", stream)):
            return stream.count
        if stream.started:
            raise RuntimeError(f"bulk writer {writer!r} declined rows it had read; a writer declines before reading")
        return self._executemany(connection, chain(head, it), writer)

    def writer(self, connection: sa.Connection) -> BulkWriter | None:
        """The dialect's bulk writer for this table on ``connection``'s engine (asked once)."""
        return self._writers.get(connection)

    def _ask(self, connection: sa.Connection) -> BulkWriter | None:
        dialect = self.dialect or dialect_of(connection)
        if dialect is None:
            return None
        return dialect.bulk_writer(connection, self.table, self.columns, exact_types=self.exact_types)

    def _executemany(self, connection: sa.Connection, rows: Iterable[Sequence[Any]], writer: BulkWriter | None) -> int:
        columns = self.columns
        it = iter(rows)
        n = 0
        try:
            while chunk := [dict(zip(columns, row, strict=True)) for row in islice(it, self.chunk_rows)]:
                connection.execute(self._insert, chunk)
                n += len(chunk)
        except sa.exc.DBAPIError:
            self._writers.insert_failed(connection.engine)
            raise
        return n

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


class Rows(Sequence[tuple[Any, ...]]):
    """Rows known by their number and made on demand, each time they are iterated: a batch
    for :class:`BulkInsert` (and a writer) without a list of tuples held in memory. Built up
    front, the tuples of a batch cost more than the ``COPY`` that writes them (measured: the
    inbox remembered 5,000 identities in 5.1 ms of CPU instead of 2.3 ms).

    >>> Rows(len(ids), lambda: ((group, i) for i in ids))  # doctest: +SKIP
    """

    __slots__ = ("_make", "_n")

    def __init__(self, n: int, make: Callable[[], Iterable[tuple[Any, ...]]]) -> None:
        self._n = n
        self._make = make

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._make())

    @overload
    def __getitem__(self, index: int) -> tuple[Any, ...]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[Any, ...]]: ...
    def __getitem__(self, index: int | slice) -> tuple[Any, ...] | Sequence[tuple[Any, ...]]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._n)
            return list(islice(self._make(), start, stop, step))
        i = index + self._n if index < 0 else index
        if not 0 <= i < self._n:
            raise IndexError(index)
        return next(islice(self._make(), i, None))


class _Stream:
    """An iterator's rows for a writer, read once as they are written. Passed where the writer
    protocol says Sequence: a writer only iterates its rows (their number is known after)."""

    __slots__ = ("_converters", "_rows", "count", "started")

    def __init__(self, rows: Iterator[Sequence[Any]], converters: list[_Converter | None] | None) -> None:
        self._rows = rows
        self._converters = converters
        self.count = 0
        self.started = False

    def __iter__(self) -> Iterator[Sequence[Any]]:
        if self.started:
            raise RuntimeError("streamed rows can be read once")
        self.started = True
        converters = self._converters
        for row in self._rows:
            self.count += 1
            yield row if converters is None else _converted(row, converters)

    def __len__(self) -> int:
        raise TypeError("streamed rows: their number is known once they are written")


def _convert_all(rows: Iterable[Sequence[Any]], converters: list[_Converter | None]) -> Iterator[tuple[Any, ...]]:
    return (_converted(row, converters) for row in rows)


def _convert(column_type: sa.types.TypeDecorator[Any], dialect: sa.Dialect, value: Any) -> Any:
    return column_type.process_bind_param(value, dialect)


def _converted(row: Sequence[Any], converters: list[_Converter | None]) -> tuple[Any, ...]:
    return tuple(value if f is None else f(value) for f, value in zip(converters, row, strict=True))
