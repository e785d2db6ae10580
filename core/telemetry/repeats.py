"""Log lines collapsed: one line per distinct cause, with a count of its repeats.

A failure that lasts makes the same line come again and again: librdkafka's failed connects
every few dozen milliseconds, the engine's failed mark every ``ioErrorBackoff``. A
:class:`CollapsingLogger` logs the first line of a cause as it comes; its repeats are counted
and reported in one line once per ``interval`` while they go on, and once more when
:meth:`~CollapsingLogger.flush` is called (the failure is over, or the process ends).

What makes two lines the same cause is the caller's to say: ``cause`` turns a line into its
cause (librdkafka's lines lose their client and timing notes), or a ``cause=`` keyword names
it outright (a failed mark: the error, not the fresh leader id the line also carries).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DEFAULT_INTERVAL", "MAX_CAUSES", "CollapsingLogger"]

#: How often a cause that keeps recurring is reported again, with its count.
DEFAULT_INTERVAL = 30.0
#: Causes remembered at most; beyond, quiet ones are forgotten (and would be logged afresh).
MAX_CAUSES = 256


@dataclass(slots=True)
class _Cause:
    level: int
    line: str
    reported_at: float
    repeats: int = 0


def _same(line: str) -> str:
    return line


class CollapsingLogger:
    """Forwards to ``target`` (anything with Python logging's ``log(level, msg, *args)``,
    as confluent-kafka's ``logger`` property accepts too) with repeats collapsed."""

    def __init__(
        self,
        target: logging.Logger | logging.LoggerAdapter[logging.Logger],
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        cause: Callable[[str], str] = _same,
    ) -> None:
        self.target = target
        self.interval = interval
        self._clock = clock
        self._cause_of = cause
        self._lock = threading.Lock()
        self._causes: dict[tuple[int, str], _Cause] = {}

    def log(self, level: int, msg: str, *args: object, cause: str | None = None) -> None:
        line = msg % args if args else msg
        key = (level, self._cause_of(line) if cause is None else cause)
        now = self._clock()
        with self._lock:
            known = self._causes.get(key)
            if known is None:
                if len(self._causes) >= MAX_CAUSES:
                    self._forget_quiet(now)
                self._causes[key] = _Cause(level, line, now)
                report = line
            else:
                known.repeats += 1
                known.line = line
                if now - known.reported_at < self.interval:
                    return
                report = self._summary(known, now)
        self.target.log(level, "%s", report)

    def flush(self, forget: bool = False) -> int:
        """Report the repeats not reported yet, one line per cause; with ``forget``, the next
        line of any cause is logged afresh (the failure is over). Returns the lines reported."""
        now = self._clock()
        with self._lock:
            reports = [(c.level, self._summary(c, now)) for c in self._causes.values() if c.repeats]
            if forget:
                self._causes.clear()
        for level, report in reports:
            self.target.log(level, "%s", report)
        return len(reports)

    def _forget_quiet(self, now: float) -> None:
        # Called with the lock held. A long-running process meets ever new causes (addresses,
        # broker ids): forget those with nothing to report, or, failing that, the oldest.
        quiet = [k for k, c in self._causes.items() if not c.repeats and now - c.reported_at >= self.interval]
        for k in quiet or list(self._causes)[: len(self._causes) // 2]:
            del self._causes[k]

    def _summary(self, cause: _Cause, now: float) -> str:
        # Called with the lock held. No rate: librdkafka queues its lines until a client is
        # polled or closed, so when they arrive says little about when they happened.
        report = f"{cause.line} (repeated {cause.repeats} more time{'s' if cause.repeats != 1 else ''})"
        cause.repeats = 0
        cause.reported_at = now
        return report
