"""The stasher's wake-up call: a notification, in the writer's transaction, that ends an idle
harvester's pause (PostgreSQL's ``NOTIFY``, delivered when the transaction commits).

The stasher calls :func:`wake_harvester` when it is prepared on a transaction. Where the
dialect has no notify statement (every database but PostgreSQL) it does nothing: the harvester
polls, its pause bounded by ``maxMarkBackoff``.

A notification is sent at most once per transaction, and at most once per
:data:`NOTIFY_INTERVAL` per process and outbox. PostgreSQL serialises the commits of
notifying transactions (they queue on one lock), so a notification in every transaction of a
busy writer would cost it throughput for nothing: while records keep coming the harvester
finds them by marking, its pause back at ``markBackoff``. Notifying only when this process
has not done so for a while wakes the harvester for the first record after a quiet spell, the
one that would otherwise wait longest (see "Push wake-ups" in docs/algorithm.md and the
measurement in docs/performance.md).
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

#: Seconds between two notifications of one process for one outbox, at least.
NOTIFY_INTERVAL = 0.05

_lock = threading.Lock()
# (SQLAlchemy dialect name, table) → the notify statement, or None where there is none
_statements: dict[tuple[str, TableName], sa.Executable | None] = {}
# engine → table → when this process last notified
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
    """Whether this transaction should notify; if so, counts it as done (a failing statement
    then costs one interval of polling, never a loop of retries)."""
    transaction = conn.get_transaction()
    now = time.monotonic()
    with _lock:
        if transaction is not None and transaction in _notified:
            return False
        per_table = _last.setdefault(conn.engine, {})
        if now - per_table.get(table, float("-inf")) < interval:
            return False
        per_table[table] = now
        if transaction is not None:
            _notified.add(transaction)
    return True


def _remember(conn: sa.Connection) -> None:
    """Note the transaction the statement began, if it was the first of its transaction."""
    transaction = conn.get_transaction()
    if transaction is not None:
        with _lock:
            _notified.add(transaction)


def wake_harvester(conn: sa.Connection, table: TableName, interval: float = NOTIFY_INTERVAL) -> None:
    """Have ``table``'s idle harvesters woken when ``conn``'s transaction commits, unless this
    transaction or another of this process did so less than ``interval`` seconds ago."""
    statement = _statement(conn, table)
    if statement is None or not _due(conn, table, interval):
        return
    conn.execute(statement)
    _remember(conn)


async def awake_harvester(conn: AsyncConnection, table: TableName, interval: float = NOTIFY_INTERVAL) -> None:
    """:func:`wake_harvester` on an ``AsyncConnection``."""
    sync = conn.sync_connection
    assert sync is not None  # an AsyncConnection handed to the stasher has started
    statement = _statement(sync, table)
    if statement is None or not _due(sync, table, interval):
        return
    await conn.execute(statement)
    _remember(sync)
