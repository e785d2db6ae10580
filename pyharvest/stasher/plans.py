"""What a :class:`~pyharvest.stasher.Stasher` knows of its table on one engine, made on the
first stash there and kept: the insert statement, the limits a record must fit, the dialect's
notify statement and bulk writer, and how a record becomes the insert's parameters.

A record is checked, sized and encoded once on its way through a plan: one
:func:`~pyharvest.core.outbox.records.check_record` (which returns the size and a non-ASCII
value's UTF-8), the trace's headers added to the size, the limits checked on that size, the
layout's encoder given the value as checked. A plan is made again when a refused insert made
the stasher forget the table's shape (:data:`pyharvest.stasher.tables.forgotten`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any

import sqlalchemy as sa

from pyharvest import tracing
from pyharvest.bindings.sql.bulk_insert import BulkWriters
from pyharvest.core.outbox.records import Header, HeaderValue, OutboxRecord, check_record
from pyharvest.plugins.api import OutboxTable, TableName
from pyharvest.stasher import tables
from pyharvest.stasher.limits import StashLimits, headers_bytes
from pyharvest.stasher.notify import notify, notify_statement, wake_on_commit
from pyharvest.stasher.tables import TableShape, bulk_writers_of, forced, refused_insert, statement
from pyharvest.stasher.typed import Typing

__all__ = ["StashPlan", "Trace", "trace_headers"]

class Trace:
    """The current trace's headers for the records of one call: computed at most once (an
    inject costs microseconds), when the first record without a ``traceparent`` needs them."""

    __slots__ = ("_asked", "_headers")

    def __init__(self) -> None:
        self._asked = False
        self._headers: tuple[list[tuple[str, str]], int] | None = None

    def headers(self) -> tuple[list[tuple[str, str]], int] | None:
        """The headers and their size; None without OpenTelemetry or outside a span."""
        if not self._asked:
            self._asked = True
            extra = tracing.trace_headers()
            self._headers = (extra, headers_bytes(extra)) if extra else None
        return self._headers


def trace_headers(propagate: bool) -> Trace | None:
    """What one call adds to its records' headers: a :class:`Trace` with propagation, else None."""
    return Trace() if propagate else None


def _has_traceparent(headers: Sequence[Header]) -> bool:
    return any(name.lower() == "traceparent" for name, _ in headers)


@dataclass(frozen=True, slots=True, eq=False)
class StashPlan:
    """One stasher's table on one engine; see the module."""

    outbox: OutboxTable
    insert: sa.Insert
    limits: StashLimits
    #: The dialect's statement that wakes idle harvesters (PostgreSQL's ``NOTIFY``), or None.
    notify: sa.Executable | None
    #: The dialect's bulk writer (``COPY``), per engine; None with ``Stasher(bulk=False)``.
    writers: BulkWriters | None
    #: Encoded parameters → a bulk writer's row.
    row: itemgetter[Any]
    #: :data:`pyharvest.stasher.tables.forgotten` when made.
    made_after: int
    #: How a record's value becomes what is stored (its stasher's ``value_serializer=``,
    #: ``cloud_events=``); None: stored as given.
    typing: Typing | None = None

    @classmethod
    def make(
        cls, dialect: sa.Dialect, shape: TableShape, table: TableName, layout: str | None,
        bulk: bool, max_record_bytes: int | None, made_after: int, typing: Typing | None = None,
    ) -> StashPlan:
        """The plan for ``shape``, looked up when :data:`~pyharvest.stasher.tables.forgotten`
        was ``made_after`` (read before the look-up: a shape forgotten meanwhile makes the plan
        stale at once, rather than kept until the table refuses a row again)."""
        outbox, insert = statement(dialect.name, table, forced(shape, layout))
        return cls(
            outbox, insert, StashLimits(table, shape.key_length, max_record_bytes),
            notify_statement(dialect, table), bulk_writers_of(outbox) if bulk else None,
            itemgetter(*outbox.stashed_columns), made_after, typing,
        )

    @property
    def stale(self) -> bool:
        """The table's shape was forgotten since: make the plan again."""
        return self.made_after != tables.forgotten

    # ----------------------------------------------------------------- records → parameters

    def encode(self, record: object, now: datetime, trace: Trace | None) -> dict[str, Any]:
        """``record`` typed, checked, traced and encoded into the insert's parameters."""
        if self.typing is not None:
            record = self.typing.apply(record)  # type: ignore[arg-type]  # apply() passes a non-record on
        size, value = check_record(record)
        return self.encode_checked(record, size, value, now, trace)  # type: ignore[arg-type]  # checked

    def encode_checked(
        self, record: OutboxRecord, size: int, value: HeaderValue | None, now: datetime, trace: Trace | None
    ) -> dict[str, Any]:
        """:meth:`encode` of a record :func:`check_record` has checked, of ``size`` bytes and
        ``value`` as it returned them."""
        if trace is not None and not _has_traceparent(record.headers):  # the caller's own choice wins
            found = trace.headers()
            if found is not None:
                extra, extra_size = found
                record = dataclasses.replace(record, headers=[*record.headers, *extra])  # copied, never changed
                size += extra_size
        self.limits.check(record, size)
        return self.outbox.encode(record, now, value)

    def encode_many(self, records: Iterable[object], trace: Trace | None) -> list[dict[str, Any]]:
        """Every record typed, checked and encoded, before any is written."""
        now = OutboxTable.now()
        encode = self.encode_checked
        if self.typing is not None:
            records = list(map(self.typing.apply, records))  # type: ignore[arg-type]  # apply() passes a non-record on
        if trace is None:  # the hot path: one pass
            return [encode(r, *check_record(r), now, None) for r in records]  # type: ignore[arg-type]  # checked
        # Every record checked before any trace work: a refused batch costs no inject.
        checked = [(r, *check_record(r)) for r in records]
        return [encode(r, size, value, now, trace) for r, size, value in checked]  # type: ignore[arg-type]

    # ----------------------------------------------------------------- the writes (sync)

    def wake(self, conn: sa.Connection) -> None:
        """Have idle harvesters woken when ``conn``'s transaction commits, now and then
        (:func:`pyharvest.stasher.notify.notify`; without a notify statement, a datagram if
        ``PYHARVEST_WAKE_ADDRESS`` is set: :func:`~pyharvest.stasher.notify.wake_on_commit`)."""
        if self.notify is not None:
            notify(conn, self.outbox.name, self.notify)
        else:
            wake_on_commit(conn, self.outbox.name)

    def execute(self, conn: sa.Connection, params: dict[str, Any] | list[dict[str, Any]]) -> None:
        """One ``INSERT`` (or one ``executemany``) on ``conn``."""
        try:
            conn.execute(self.insert, params)
        except sa.exc.DBAPIError as e:
            self.raise_refused(e, conn.engine)

    def write(self, conn: sa.Connection, params: list[dict[str, Any]]) -> None:
        """Insert encoded records: through the dialect's bulk writer when the batch is large
        enough, else one executemany."""
        if not params:
            return
        writers = self.writers if len(params) > 1 else None
        try:
            writer = writers.get(conn) if writers is not None else None
            if writer is not None and len(params) >= writer.min_rows and writer(conn, list(map(self.row, params))):
                return
            conn.execute(self.insert, params)
        except sa.exc.DBAPIError as e:
            if writers is not None:
                writers.insert_failed(conn.engine)
            self.raise_refused(e, conn.engine)

    def raise_refused(self, error: sa.exc.DBAPIError, engine: sa.Engine) -> None:
        """Raise what an insert's failure means (a missing grant, a table readied for shards
        since it was read), else ``error`` itself."""
        changed = refused_insert(error, engine, self.outbox)
        if changed is None:
            raise error
        raise changed from error
