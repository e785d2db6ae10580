"""librdkafka's log lines, collapsed: one line per distinct cause, with a count.

An unreachable broker makes librdkafka log the same failed connect every few dozen
milliseconds, from every client, for as long as it lasts (over a thousand identical lines a
minute). Every confluent-kafka client pyharvest builds logs through :func:`librdkafka_logger`
instead: the first line of a cause is logged as it comes; its repeats are counted and
reported in one line once per ``interval`` while they go on, and once more when the process
ends (or :meth:`CollapsingLogger.flush` is called).

Two lines are the same cause when they differ only in the client that logged them and in
librdkafka's own timing and suppression notes (``after 0ms in state CONNECT``,
``3 identical error(s) suppressed``).
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CollapsingLogger", "cause_of", "flush_librdkafka_logs", "librdkafka_logger"]

#: How often a cause that keeps recurring is reported again, with its count.
DEFAULT_INTERVAL = 30.0
#: Causes remembered at most; beyond, quiet ones are forgotten (and would be logged afresh).
MAX_CAUSES = 256

_CLIENT = re.compile(r"\[rdkafka#[\w-]+\] ")
_TIMING = re.compile(r"\s*\((?:after \d+ms in state \w+)?(?:, )?(?:\d+ identical error\(s\) suppressed)?\)")


def cause_of(line: str) -> str:
    """``line`` without what varies between repeats of one cause."""
    return _TIMING.sub("", _CLIENT.sub("", line)).strip()


@dataclass(slots=True)
class _Cause:
    level: int
    line: str
    reported_at: float
    repeats: int = 0


class CollapsingLogger:
    """What confluent-kafka's ``logger`` property accepts (an object with Python logging's
    ``log(level, msg, *args)``), forwarding to ``target`` with repeats collapsed."""

    def __init__(
        self,
        target: logging.Logger,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._causes: dict[tuple[int, str], _Cause] = {}

    def log(self, level: int, msg: str, *args: object) -> None:
        line = msg % args if args else msg
        key = (level, cause_of(line))
        now = self._clock()
        with self._lock:
            cause = self._causes.get(key)
            if cause is None:
                if len(self._causes) >= MAX_CAUSES:
                    self._forget_quiet(now)
                self._causes[key] = _Cause(level, line, now)
                report = line
            else:
                cause.repeats += 1
                cause.line = line
                if now - cause.reported_at < self.interval:
                    return
                report = self._summary(cause, now)
        self.target.log(level, "%s", report)

    def flush(self) -> None:
        """Report the repeats not reported yet, one line per cause."""
        now = self._clock()
        with self._lock:
            reports = [(c.level, self._summary(c, now)) for c in self._causes.values() if c.repeats]
        for level, report in reports:
            self.target.log(level, "%s", report)

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


_shared: CollapsingLogger | None = None
_shared_lock = threading.Lock()


def librdkafka_logger() -> CollapsingLogger:
    """The one collapsing logger of this process, logging to ``pyharvest.librdkafka``: pass it
    as the ``logger`` property of every confluent-kafka client, so that repeats are counted
    across clients. What is still counted when the process ends is reported then."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = CollapsingLogger(logging.getLogger("pyharvest.librdkafka"))
            atexit.register(_shared.flush)
        return _shared


def flush_librdkafka_logs() -> None:
    """Report the repeats :func:`librdkafka_logger` counted and has not reported yet: before a
    command's last word, so that the count comes before it."""
    if _shared is not None:
        _shared.flush()
