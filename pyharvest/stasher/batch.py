"""A buffering writer on one transaction; see :meth:`pyharvest.stasher.Stasher.batch`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import sqlalchemy as sa

from pyharvest.core.outbox.records import OutboxRecord

__all__ = ["BatchStasher", "RowWriter"]


class RowWriter(Protocol):
    """What a batch writes through: a prepared stasher (:meth:`Stasher.prepare`)."""

    @property
    def connection(self) -> sa.Connection: ...

    def encode(self, record: OutboxRecord) -> dict[str, Any]:
        """The row's parameters; raises on a record the stasher refuses."""
        ...

    def write(self, params: list[dict[str, Any]]) -> None:
        """Insert the rows (one ``executemany``, or the dialect's bulk writer)."""
        ...


class BatchStasher:
    """Buffers records and writes them with one executemany (or ``COPY``) per ``flush_every``
    records, and whenever the transaction needs them; see :meth:`Stasher.batch`. One round
    trip per record bounds single-row stashing (a few thousand per second on PostgreSQL);
    batching does not.

    What is buffered is written before anything else reaches the database on the connection
    (so the transaction's own queries see every record stashed), before a commit, a savepoint
    or a rollback to one, and on leaving the ``with`` block. A rollback discards it with the
    rest of the transaction. So no record can be lost to a commit that forgot the batch.

    Each record is validated, given its trace headers and encoded when stashed, so a bad
    record is refused at once and carries the trace current at its own stash. A database error
    in a flush (a constraint of yours) surfaces from the statement or commit that flushed.
    """

    __slots__ = ("__weakref__", "_buffer", "_conn", "_flush_every", "_flushing", "_hooks", "_prepared")

    def __init__(self, prepared: RowWriter, flush_every: int) -> None:
        self._prepared = prepared
        self._conn = prepared.connection
        self._buffer: list[dict[str, Any]] = []
        self._flush_every = flush_every
        self._flushing = False
        flush_first = self._flush_first
        hooks = (
            ("before_cursor_execute", flush_first),  # any statement: it may read the outbox
            ("commit", flush_first),
            ("prepare_twophase", flush_first),
            ("savepoint", flush_first),  # else a rollback to it would take earlier records
            ("rollback_savepoint", flush_first),  # written inside it, rolled back with it
            ("rollback", self._discard),
        )
        for name, hook in hooks:
            sa.event.listen(self._conn, name, hook)
        self._hooks: tuple[tuple[str, Callable[..., None]], ...] | None = hooks

    def stash(self, record: OutboxRecord) -> None:
        if self._hooks is None:
            raise RuntimeError("this batch is closed: stash through a new Stasher.batch(tx)")
        params = self._prepared.encode(record)
        if not self._buffer and not self._conn.in_transaction():
            # As a write would (autobegin): else the commit that should flush has nothing to commit.
            self._conn.begin()
        self._buffer.append(params)
        if len(self._buffer) >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered now."""
        if not self._buffer or self._flushing:
            return
        buffered, self._buffer = self._buffer, []
        self._flushing = True  # our own statements pass the hooks
        try:
            self._prepared.write(buffered)
        finally:
            self._flushing = False

    def _flush_first(self, *_: object) -> None:
        self.flush()

    def _discard(self, *_: object) -> None:
        self._buffer.clear()

    def close(self) -> None:
        """Write what is buffered and stop watching the connection."""
        try:
            self.flush()
        finally:
            self._unhook()

    def _unhook(self) -> None:
        hooks, self._hooks = self._hooks, None
        for name, hook in hooks or ():
            sa.event.remove(self._conn, name, hook)

    def __enter__(self) -> BatchStasher:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._buffer.clear()  # the caller's transaction is failing anyway
            self._unhook()
