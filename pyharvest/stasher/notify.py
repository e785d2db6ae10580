"""The stasher's wake-up call: a notification, in the writer's transaction, that ends an idle
harvester's pause (PostgreSQL's ``NOTIFY``, delivered when the transaction commits).

The stasher calls :func:`notify` on every stash, and when it is prepared on a transaction,
with the dialect's statement it looked up once per engine (:func:`notify_statement`). Where the
dialect has no notify statement (every database but PostgreSQL) there is nothing to call: the
harvester polls, its pause bounded by ``maxMarkBackoff``.

A notification is sent at most once per transaction, and only by the first transaction after
this process has stashed nothing into the outbox for :data:`NOTIFY_INTERVAL`. PostgreSQL
serialises the commits of notifying transactions (they queue on one lock), so a notification
in every transaction of a busy writer costs it throughput for nothing: while records keep
coming the harvester finds them by marking, its pause back at ``markBackoff``. The first
record after a quiet spell, the one that would otherwise wait longest, always notifies; a
writer that never pauses never notifies (see "When the outbox is idle" in docs/algorithm.md,
and the measurement in docs/performance.md).

Where the dialect has no notify statement, the same rule sends a wake-up datagram instead, if
``PYHARVEST_WAKE_ADDRESS`` is set (:func:`wake_on_commit`,
:mod:`pyharvest.bindings.sql.wake_datagrams`). SQLAlchemy's only commit hook on a connection
runs just before the ``COMMIT`` goes out, and a rolled-back transaction sends nothing; the
datagram can reach the harvester before the row is visible, so the empty marks after a wake-up
ramp up again as after rows (:meth:`pyharvest.core.engine.idle.IdleBackoff.wake`).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from pyharvest.bindings.sql.wake_datagrams import WAKE_ADDRESS_ENV, send_wake
from pyharvest.plugins.api import TableName, dialect_of

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "NOTIFY_INTERVAL", "anotify", "awake_harvester", "notify", "notify_statement", "wake_harvester", "wake_on_commit",
]

#: A process notifies when it has stashed nothing into the outbox for this many seconds.
NOTIFY_INTERVAL = 0.05

_lock = threading.Lock()
# (SQLAlchemy dialect name, table) → the notify statement, or None where there is none
_statements: dict[tuple[str, TableName], sa.Executable | None] = {}
# engine → table → when this process last stashed
_last: weakref.WeakKeyDictionary[sa.Engine, dict[TableName, float]] = weakref.WeakKeyDictionary()
# transactions that have notified already
_notified: weakref.WeakSet[Any] = weakref.WeakSet()
# transaction → the outboxes whose wake-up datagram its commit sends
_on_commit: weakref.WeakKeyDictionary[Any, set[TableName]] = weakref.WeakKeyDictionary()
# engines whose commits are watched for them
_hooked: weakref.WeakSet[sa.Engine] = weakref.WeakSet()


def notify_statement(dialect: sa.Dialect, table: TableName) -> sa.Executable | None:
    """The dialect's statement that wakes ``table``'s harvesters, None where it has none;
    asked once per (dialect, table). A stasher keeps it per engine, and calls :func:`notify`."""
    key = (dialect.name, table)
    try:
        return _statements[key]
    except KeyError:
        pass
    loaded = dialect_of(dialect)
    statement = loaded.notify_statement(table) if loaded is not None else None
    with _lock:
        _statements[key] = statement
    return statement


def _due(conn: sa.Connection, table: TableName, interval: float) -> bool:
    """Whether this transaction should notify (notes this stash's time either way); if so,
    counts it as done (a failing statement then costs polling, never a loop of retries)."""
    transaction = conn.get_transaction()
    now = time.monotonic()
    with _lock:
        per_table = _last.setdefault(conn.engine, {})
        quiet = now - per_table.get(table, float("-inf")) >= interval
        per_table[table] = now
        if not quiet or (transaction is not None and transaction in _notified):
            return False
        if transaction is not None:
            _notified.add(transaction)
    return True


def _remember(conn: sa.Connection) -> None:
    """Note the transaction the statement began, if it was the first of its transaction."""
    transaction = conn.get_transaction()
    if transaction is not None:
        with _lock:
            _notified.add(transaction)


def wake_harvester(conn: sa.Connection, table: TableName, interval: float | None = None) -> None:
    """Have ``table``'s idle harvesters woken when ``conn``'s transaction commits, if this
    transaction has not asked already and this process has stashed nothing into ``table`` for
    ``interval`` seconds (default :data:`NOTIFY_INTERVAL`, read at each call). Call it on
    every stash: it also notes the time."""
    statement = notify_statement(conn.dialect, table)
    if statement is not None:
        notify(conn, table, statement, interval)


def notify(conn: sa.Connection, table: TableName, statement: sa.Executable, interval: float | None = None) -> None:
    """:func:`wake_harvester` with the dialect's :func:`notify_statement`, known already."""
    if _due(conn, table, NOTIFY_INTERVAL if interval is None else interval):
        conn.execute(statement)
        _remember(conn)


async def awake_harvester(conn: AsyncConnection, table: TableName, interval: float | None = None) -> None:
    """:func:`wake_harvester` on an ``AsyncConnection``."""
    statement = notify_statement(conn.dialect, table)
    if statement is not None:
        await anotify(conn, table, statement, interval)


async def anotify(
    conn: AsyncConnection, table: TableName, statement: sa.Executable, interval: float | None = None
) -> None:
    """:func:`notify` on an ``AsyncConnection``."""
    sync = conn.sync_connection
    assert sync is not None  # an AsyncConnection handed to the stasher has started
    if _due(sync, table, NOTIFY_INTERVAL if interval is None else interval):
        await conn.execute(statement)
        _remember(sync)


def wake_on_commit(conn: sa.Connection, table: TableName, interval: float | None = None) -> None:
    """Where the dialect has no notify statement: have ``table``'s wake-up datagram sent when
    ``conn``'s transaction commits, on the same terms as :func:`wake_harvester`; nothing when
    ``PYHARVEST_WAKE_ADDRESS`` is unset or empty. Call it on every stash."""
    if not os.environ.get(WAKE_ADDRESS_ENV):
        return
    if not _due(conn, table, NOTIFY_INTERVAL if interval is None else interval):
        return
    # Called before the insert: begin the transaction the insert would have begun anyway.
    transaction = conn.get_transaction() or conn.begin()
    engine = conn.engine
    if engine not in _hooked:
        with _lock:
            if engine not in _hooked:
                sa.event.listen(engine, "commit", _send_on_commit)
                _hooked.add(engine)
    with _lock:
        _notified.add(transaction)
        _on_commit.setdefault(transaction, set()).add(table)


def _send_on_commit(conn: sa.Connection) -> None:
    """SQLAlchemy's ``commit`` event, just before the ``COMMIT``: the datagrams its transaction
    asked for (a network error is logged, never raised into the writer's commit)."""
    transaction = conn.get_transaction()
    if transaction is None:
        return
    with _lock:
        tables = _on_commit.pop(transaction, None)
    for table in tables or ():
        send_wake(table)
