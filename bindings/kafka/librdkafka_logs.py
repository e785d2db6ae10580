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
import sys
import threading
import traceback

# The mechanism is the engine's too (a failed mark); librdkafka's lines only need their cause.
from pyharvest.core.telemetry.repeats import DEFAULT_INTERVAL, MAX_CAUSES, CollapsingLogger

__all__ = [
    "DEFAULT_INTERVAL",
    "MAX_CAUSES",
    "CollapsingLogger",
    "cause_of",
    "flush_librdkafka_logs",
    "librdkafka_logger",
]

_CLIENT = re.compile(r"\[rdkafka#[\w-]+\] ")
_TIMING = re.compile(r"\s*\((?:after \d+ms in state \w+)?(?:, )?(?:\d+ identical error\(s\) suppressed)?\)")


def cause_of(line: str) -> str:
    """``line`` without what varies between repeats of one cause."""
    return _TIMING.sub("", _CLIENT.sub("", line)).strip()


# Lines librdkafka logs as warnings that are the expected course of things here, logged at
# INFO: a new leader's init_transactions while its fenced predecessor's transaction is still
# being aborted is answered "concurrent operation ... retrying" until the abort is done
# (the fence doing its work, not a fault).
_EXPECTED = (re.compile(r"\bGETPID\b.*concurrent operation.*retrying", re.IGNORECASE),)


class _LibrdkafkaLogger(CollapsingLogger):
    """The collapsing logger, with the lines of :data:`_EXPECTED` at INFO; a line it cannot
    log is counted in :attr:`lost` (the first one's traceback goes to stderr)."""

    lost = 0

    def log(self, level: int, msg: str, *args: object, cause: str | None = None) -> None:
        # Called from inside a client's poll or flush: an exception raised here would stay
        # set through the rest of confluent-kafka's dispatch and surface elsewhere, naming
        # nothing true (bindings.kafka.confluent._callback_failed). The line is given up instead.
        try:
            if level > logging.INFO:
                line = msg % args if args else msg
                if any(p.search(line) for p in _EXPECTED):
                    level = logging.INFO
            super().log(level, msg, *args, cause=cause)
        except Exception:  # noqa: BLE001 - see above
            self.lost += 1
            if self.lost == 1:
                traceback.print_exc(file=sys.stderr)


_shared: CollapsingLogger | None = None
_shared_lock = threading.Lock()


def librdkafka_logger() -> CollapsingLogger:
    """The one collapsing logger of this process, logging to ``pyharvest.librdkafka``: pass it
    as the ``logger`` property of every confluent-kafka client, so that repeats are counted
    across clients. What is still counted when the process ends is reported then."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = _LibrdkafkaLogger(logging.getLogger("pyharvest.librdkafka"), cause=cause_of)
            atexit.register(_shared.flush)
        return _shared


def flush_librdkafka_logs() -> None:
    """Report the repeats :func:`librdkafka_logger` counted and has not reported yet: before a
    command's last word, so that the count comes before it."""
    if _shared is not None:
        _shared.flush()
