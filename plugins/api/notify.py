"""Push wake-ups: how a writer's commit can wake an idle harvester (PostgreSQL's ``LISTEN``/``NOTIFY``).

A dialect that supports them implements two hooks (:mod:`pyharvest.plugins.hookspecs`):
``pyharvest_notify_statement``, the statement the stasher runs in the writer's transaction
(the database delivers the notification when that transaction commits, and drops it on a
rollback), and ``pyharvest_listener``, which opens a dedicated connection that waits for those
notifications. The SQL binding keeps one such connection per outbox on a thread of its own
(:mod:`pyharvest.bindings.sql.change_feed`), reconnecting after a failure. Notifications only
shorten the harvester's pause between marks; polling still finds every row. A dialect without
these hooks gets the binding's own :class:`Listener` if ``PYHARVEST_WAKE_ADDRESS`` is set: the
stasher's wake-up datagrams (:mod:`pyharvest.bindings.sql.wake_datagrams`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["Listener", "ListenerFactory"]


@runtime_checkable
class Listener(Protocol):
    """One open connection listening for an outbox's notifications; used by one thread."""

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True if at least one notification came (those that
        came together are consumed together). Raises when the connection is lost."""
        ...

    def close(self) -> None:
        """Close the connection; never raises."""
        ...


#: Opens a :class:`Listener` (raises if the database cannot be reached); called again to reconnect.
ListenerFactory = Callable[[], Listener]
