"""Running a harvester until SIGINT or SIGTERM, as ``reaper`` does (:meth:`pyharvest.Harvest.run`).

Python's defaults suit neither signal: SIGINT raises ``KeyboardInterrupt`` wherever the main
thread is (a traceback, and a stop in the middle of whatever it was doing), and SIGTERM ends
the process at once, without leaving the leader group, so the next process waits a whole
session timeout before it may lead. Here the first of either asks the harvester to stop
gracefully (in-flight records settled, the group left); a second is logged and waited out.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Protocol

from pyharvest.core.engine.lifecycle import State

__all__ = ["run_until_signalled"]

log = logging.getLogger("pyharvest.reaper")


class _Runnable(Protocol):
    @property
    def state(self) -> State: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def join(self, timeout: float | None = None) -> bool: ...


def run_until_signalled(harvest: _Runnable) -> None:
    """Start ``harvest`` unless it runs, and wait until it stops: on the first SIGINT or
    SIGTERM, gracefully; re-raise whatever stopped it otherwise. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "run() answers SIGINT and SIGTERM, which Python delivers to the main thread only: call it there, "
            "or use start(), stop() and join() from other threads"
        )
    stop_requested = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop_requested.is_set():
            log.warning("second %s: still stopping, waiting for in-flight records", name)
            return
        stop_requested.set()
        log.info("%s received: stopping", name)
        harvest.stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if harvest.state is State.CREATED:
            harvest.start()
        while not harvest.join(0.5):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
