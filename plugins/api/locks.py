"""Locks other sessions hold on the outbox: how long the harvester's own statements wait for
them, how a driver reports that the wait ran out, and who held the lock.

An outbox lives in a database that other work shares. A ``LOCK TABLE``, a migration, or a
console's ``SELECT ... FOR UPDATE`` on outbox rows left open would make the harvester's
statements wait for as long as it lasts, silently (marks choose rows with a waiting lock,
never ``SKIP LOCKED``: a skipped row would let a later record of its key overtake it). So the
harvester's sessions bound the wait (``limits.lockTimeout``: the dialect's
``pyharvest_lock_timeout_statements``), a statement that ran out is recognised by the
dialect's ``Capabilities.lock_timeout_errors``, and the error names the sessions that hold
locks on the table (``pyharvest_lock_holders``), so that an operator knows whom to ask.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyharvest.plugins.api.capabilities import Capabilities
from pyharvest.plugins.api.error_codes import error_codes

__all__ = ["LockHolder", "is_lock_timeout"]

_QUERY_SHOWN = 120


@dataclass(frozen=True, slots=True)
class LockHolder:
    """A session that holds a lock on the outbox table, as the database describes it."""

    #: How the database names the session: ``pid 4242`` (PostgreSQL), ``thread 17`` (MariaDB).
    session: str
    #: The lock it holds (``AccessExclusiveLock``); empty where the database does not say.
    lock: str
    #: Seconds its transaction has been open; None where the database does not say.
    open_for: float | None = None
    #: What the session is doing (``idle in transaction``), where the database says.
    state: str = ""
    #: Its current or last statement, where the database says.
    query: str = ""

    def describe(self) -> str:
        """One line: ``pid 4242 (AccessExclusiveLock, transaction open 12s, idle in transaction:
        LOCK TABLE outbox ...)``."""
        parts = [self.lock] if self.lock else []
        if self.open_for is not None:
            parts.append(f"transaction open {self.open_for:.0f}s")
        if self.state:
            parts.append(self.state)
        query = " ".join(self.query.split())
        if len(query) > _QUERY_SHOWN:
            query = query[: _QUERY_SHOWN - 3] + "..."
        said = ", ".join(parts) + (f": {query}" if query else "")
        return f"{self.session} ({said})" if said else self.session


def is_lock_timeout(capabilities: Capabilities, error: BaseException) -> bool:
    """Whether ``error`` (a SQLAlchemy ``DBAPIError`` or the driver's own) is a statement that
    waited for a lock longer than its session allows, by a dialect's ``lock_timeout_errors``
    (``dialect.capabilities``)."""
    codes = capabilities.lock_timeout_errors
    return bool(codes) and not error_codes(error).isdisjoint(codes)
