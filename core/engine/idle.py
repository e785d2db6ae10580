"""When the main loop marks next: adaptive polling while the outbox is empty, and push wake-ups.

A mark that finds nothing still costs the database a transaction. Polling every
``markBackoff`` (10 ms) made an idle leader cost about 100 transactions a second; so once
marks have found nothing for :data:`IDLE_AFTER` the pause doubles with each empty mark, from
``markBackoff`` up to ``maxMarkBackoff`` (1 s by default), and the first mark that returns
rows brings it back. The grace period keeps a busy outbox marked at least every
``markBackoff``: writers commit in bursts, and the short gaps between them must not stretch
the pause.

Under a steady stream the pause after an empty mark is most of a record's wait: a record
committed just after a mark began is missed by it, and if that mark found nothing the record
waits the whole pause, then a mark. So the first empty marks after rows pause less: a quarter
of ``markBackoff``, then half, then ``markBackoff`` (:data:`RAMP_STEPS`). A writer committing
every 10 ms is then found within about 5 ms of its commit instead of 10, at the price of at
most two more empty marks per gap between bursts; an idle outbox reaches the same pauses as
before one ``markBackoff`` later.

Where the binding can hear that rows were added (PostgreSQL's ``LISTEN``, the stasher's wake-up
datagrams elsewhere; see :class:`~pyharvest.core.ports.database.ChangeFeed`), a notification makes
the next mark due at once, so a lone record is not kept waiting for the pause to end, and the
empty marks after it ramp up again as after rows. Polling stays as the safety net: a lost
notification costs at most one ``maxMarkBackoff``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["IDLE_AFTER", "RAMP_STEPS", "IdleBackoff", "Wakeup"]

#: Marks must have found nothing for this long before the pause grows past ``markBackoff``.
IDLE_AFTER = 0.1
#: The first empty mark after rows pauses ``markBackoff / 2**RAMP_STEPS``; each further one
#: doubles the pause, up to ``markBackoff`` while in the grace period.
RAMP_STEPS = 2


class IdleBackoff:
    """The pause before the next mark; the main loop's thread alone calls it."""

    def __init__(
        self,
        first: float,
        bound: float,
        clock: Callable[[], float] = time.monotonic,
        idle_after: float = IDLE_AFTER,
        ramp_steps: int = RAMP_STEPS,
    ) -> None:
        self.first = first
        self.bound = max(first, bound)
        self.idle_after = idle_after
        self._ramp_start = first / 2**ramp_steps
        self._clock = clock
        self._pause = 0.0
        self._empty_since: float | None = None
        self._due = clock()

    @property
    def pause(self) -> float:
        """The pause after the last mark (0 after one that found rows)."""
        return self._pause

    def found_rows(self) -> None:
        """A mark returned rows: the next may follow at once, and empty ones after it start
        the ramp to ``first`` again."""
        self._pause = 0.0
        self._empty_since = None
        self._due = self._clock()

    def found_nothing(self) -> None:
        """A mark returned nothing: wait a quarter of ``first`` after rows, twice as long after
        each further empty mark, up to ``first`` until marks have found nothing for
        ``idle_after``, then up to ``bound``."""
        now = self._clock()
        if self._empty_since is None:
            self._empty_since = now
            self._pause = self._ramp_start
        elif now - self._empty_since < self.idle_after or self._pause <= 0:
            self._pause = min(self.first, self._pause * 2)
        else:
            self._pause = min(self.bound, max(self.first, self._pause * 2))
        self._due = now + self._pause

    def wake(self) -> None:
        """Rows may have been added: mark now, and if that mark finds nothing, ramp up again
        as after rows. A wake-up may come a moment before its rows are visible (a wake-up
        datagram goes out just before the writer's ``COMMIT``): the short pauses that follow
        find them within milliseconds, at the price of a few empty marks per wake-up."""
        self._pause = 0.0
        self._empty_since = None
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
