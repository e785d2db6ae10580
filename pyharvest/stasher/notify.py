"""The stasher's wake-up call: a notification, in the writer's transaction, that ends an idle
harvester's pause (PostgreSQL's ``NOTIFY``, delivered when the transaction commits).

The stasher calls :func:`wake_harvester` when it is prepared on a transaction. Where the
dialect has no notify statement (every database but PostgreSQL) it does nothing: the harvester
polls, its pause bounded by ``maxMarkBackoff``.

A notification is sent at most once per transaction, and only by the first transaction after
this process has stashed nothing into the outbox for :data:`NOTIFY_INTERVAL`. PostgreSQL
serialises the commits of notifying transactions (they queue on one lock), so a notification
in every transaction of a busy writer costs it throughput for nothing: while records keep
coming the harvester finds them by marking, its pause back at ``markBackoff``. The first
record after a quiet spell, the one that would otherwise wait longest, always notifies; a
writer that never pauses never notifies (see "When the outbox is idle" in docs/algorithm.md,
and the measurement in docs/performance.md).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from pyharvest.plugins.api import TableName, dialect_of

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["NOTIFY_INTERVAL", "awake_harvester", "wake_harvester"]

#: A process notifies when it has stashed nothing into the outbox for this many seconds.
NOTIFY_INTERVAL = 0.05

_lock = threading.Lock()
# (SQLAlchemy dialect name, table) → the notify statement, or None where there is none
_statements: dict[tuple[str, TableName], sa.Executable | None] = {}
# engine → table → when this process last stashed
_last: weakref.WeakKeyDictionary[sa.Engine, dict[TableName, float]] = weakref.WeakKeyDictionary()
# transactions that have notified already
_notified: weakref.WeakSet[Any] = weakref.WeakSet()


def _statement(conn: sa.Connection, table: TableName) -> sa.Executable | None:
    key = (conn.dialect.name, table)
    try:
        return _statements[key]
    except KeyError:
        pass
    plugin = dialect_of(conn.dialect)
    statement = plugin.notify_statement(table) if plugin is not None else None
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
    statement = _statement(conn, table)
    if statement is None or not _due(conn, table, NOTIFY_INTERVAL if interval is None else interval):
        return
    conn.execute(statement)
    _remember(conn)


async def awake_harvester(conn: AsyncConnection, table: TableName, interval: float | None = None) -> None:
    """:func:`wake_harvester` on an ``AsyncConnection``."""
    sync = conn.sync_connection
    assert sync is not None  # an AsyncConnection handed to the stasher has started
    statement = _statement(sync, table)
    if statement is None or not _due(sync, table, NOTIFY_INTERVAL if interval is None else interval):
        return
    await conn.execute(statement)
    _remember(sync)
