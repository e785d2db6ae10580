"""Finding the message a batch handler failed on, by bisection in savepoints.

A batch handler that raises says only that one of its messages could not be applied. To
dead-letter that message alone (or name it under ``errorPolicy: stop``), the inbox rolls the
transaction back and applies the messages again with :func:`first_failure`: the whole list in
a savepoint; if that fails, each half in a savepoint of its own, the first half first, and so
on down to the single message that fails. A part that fails is rolled back to its savepoint;
a part that succeeds stays applied. So when the failing message is found, every message
before it is applied, in order, and none after it; a list applies completely if the failure
does not come back.

One failing message among ``n`` costs about ``2n`` message applications in ``2·log2(n)``
handler calls, all in one transaction, instead of ``n`` calls one by one.

The handler must behave as if it applied the messages one after the other
(``handler(tx, a + b)`` has the effects of ``handler(tx, a)`` then ``handler(tx, b)``):
what an ``executemany`` of one row per message does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyharvest.core.inbox.message import InboxMessage
from pyharvest.core.inbox.ports import BatchHandler, InboxDatabase

__all__ = ["first_failure"]


def first_failure(
    database: InboxDatabase,
    conn: Any,
    handler: BatchHandler,
    messages: Sequence[InboxMessage],
    *,
    known_to_fail: bool = False,
) -> tuple[int, Exception] | None:
    """Apply ``messages`` through ``handler`` in savepoints of ``conn``'s transaction; return
    the index and error of the first one that fails (those before it applied, none after), or
    None when all of them applied. ``known_to_fail``: the whole list just failed, so start
    with its halves. The transaction (``conn``'s, of ``database``) must have begun with a
    write (pysqlite begins one only at a write; releasing a savepoint that began it would
    commit it). A connection that went away is raised, never taken for the handler's failure."""
    if not messages:
        return None
    if not known_to_fail:
        error = _attempt(database, conn, handler, list(messages))
        if error is None:
            return None
        if len(messages) == 1:
            return 0, error
    return _search(database, conn, handler, messages, 0, len(messages))


def _search(
    database: InboxDatabase, conn: Any, handler: BatchHandler, messages: Sequence[InboxMessage], lo: int, hi: int
) -> tuple[int, Exception] | None:
    """``messages[lo:hi]`` failed together (or is believed to): try its halves in order."""
    mid = (lo + hi) // 2
    for start, end in ((lo, mid), (mid, hi)):
        if start == end:
            continue
        error = _attempt(database, conn, handler, list(messages[start:end]))
        if error is None:
            continue
        if end - start == 1:
            return start, error
        found = _search(database, conn, handler, messages, start, end)
        if found is not None:
            return found
    return None  # every part applied: the failure did not come back


def _attempt(database: InboxDatabase, conn: Any, handler: BatchHandler, part: list[InboxMessage]) -> Exception | None:
    savepoint = database.savepoint(conn)
    try:
        handler(conn, part)
    except Exception as e:
        if database.connection_lost(e):
            raise
        savepoint.rollback()
        return e
    savepoint.commit()
    return None
