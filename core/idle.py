"""When the main loop marks next: adaptive polling while the outbox is empty, and push wake-ups.

A mark that finds nothing still costs the database a transaction. Polling every
``markBackoff`` (10 ms) made an idle leader cost about 100 transactions a second; so while
marks find nothing the pause doubles, from ``markBackoff`` up to ``maxMarkBackoff`` (1 s by
default), and the first mark that returns rows brings it back to ``markBackoff``. Latency
under load is unchanged: a busy outbox keeps returning rows.

Where the binding can hear that rows were added (PostgreSQL's ``LISTEN``, see
:class:`~pyharvest.core.binding.ChangeFeed`), a notification makes the next mark due at once,
so a lone record is not kept waiting for the pause to end. Polling stays as the safety net: a
lost notification costs at most one ``maxMarkBackoff``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["IdleBackoff", "Wakeup"]


class IdleBackoff:
    """The pause before the next mark; the main loop's thread alone calls it."""

    def __init__(self, first: float, bound: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.first = first
        self.bound = max(first, bound)
        self._clock = clock
        self._pause = 0.0
        self._due = clock()

    @property
    def pause(self) -> float:
        """The pause after the last mark (0 after one that found rows)."""
        return self._pause

    def found_rows(self) -> None:
        """A mark returned rows: the next may follow at once, and an empty one after it waits
        ``first`` again."""
        self._pause = 0.0
        self._due = self._clock()

    def found_nothing(self) -> None:
        """A mark returned nothing: wait ``first``, then twice as long after each further empty
        mark, up to ``bound``."""
        self._pause = self.first if self._pause <= 0 else min(self.bound, self._pause * 2)
        self._due = self._clock() + self._pause

    def wake(self) -> None:
        """Rows may have been added: mark now. The pause keeps growing if the mark finds
        nothing (a notification for rows another mark already took)."""
        self._due = self._clock()

    def due_in(self) -> float:
        """Seconds until the next mark is due; 0 or less when it is."""
        return self._due - self._clock()


class Wakeup:
    """Wakes the main loop from other threads: a notification that rows were added, or a stop.

    A wake-up that comes while the loop marks is kept, and ends its next wait at once: the
    mark may have run before those rows were committed."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout``; True if woken (and clear it)."""
        woken = self._event.wait(timeout) if timeout > 0 else self._event.is_set()
        if woken:
            self._event.clear()
        return woken

    def clear(self) -> None:
        self._event.clear()
