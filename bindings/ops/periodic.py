"""A reading taken every ``interval`` seconds on a daemon thread of its own.

The operations server's background readings (the outbox's backlog, each shard's backlog, the
oldest row's age and the quarantine) run this way, so that a scrape or a probe answers at once
from the last reading instead of waiting on the database.
"""

from __future__ import annotations

import threading
from typing import Self

__all__ = ["Periodic"]


class Periodic:
    """Calls :meth:`read_once` at start and then every :attr:`interval` seconds until
    :meth:`stop`; a subclass says what one reading does."""

    thread_name = "pyharvest-periodic"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read_once(self) -> object:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self.interval)
