"""The SQL binding's change feed: one listening connection per outbox, on a thread of its own.

Where the dialect can listen (PostgreSQL with psycopg 3.2+: ``pyharvest_listener``), the first
engine that watches the outbox starts a thread that holds a dedicated connection, waits for
the stasher's notifications and wakes every watcher (the engines of the outbox's shards share
it). When the connection fails it is reopened, with a growing pause, and the watchers are woken
once it is back, since a notification may have been missed meanwhile. Until then the engines
poll: nothing is lost, a lone record just waits up to one ``maxMarkBackoff``.

Where the dialect cannot listen, the feed listens for the stasher's wake-up datagrams instead,
if ``PYHARVEST_WAKE_ADDRESS`` is set (:mod:`pyharvest.bindings.sql.wake_datagrams`): the same
thread, the same wake-ups, a UDP socket in place of the connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import sqlalchemy as sa

from pyharvest.bindings.sql.wake_datagrams import datagram_listener
from pyharvest.core.telemetry.logs import one_line
from pyharvest.plugins.api import Dialect, Listener, ListenerFactory, TableName

__all__ = ["OutboxChangeFeed"]

log = logging.getLogger("pyharvest.bindings.sql")

#: How long one wait on the connection lasts: how soon the thread sees it is to stop.
WAIT_SLICE = 0.25
#: The pause before reconnecting doubles from the first to the last.
RECONNECT_BACKOFF = (0.1, 5.0)


class OutboxChangeFeed:
    """Wakes watchers when rows may have been added to one outbox table."""

    def __init__(self, engine: sa.Engine, dialect: Dialect, table: TableName) -> None:
        self.table = table
        # The database's own notifications where it has them, else datagrams if configured.
        self._factory: ListenerFactory | None = dialect.listener(engine, table) or datagram_listener(table)
        self._watchers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: Whether the listening connection is open now.
        self.connected = False
        #: How many times the connection was (re)opened: 1 once it first connects.
        self.connects = 0

    @property
    def supported(self) -> bool:
        return self._factory is not None

    @property
    def watching(self) -> bool:
        with self._lock:
            return bool(self._watchers)

    def watch(self, wake: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``wake`` on every notification (and after each reconnection) until the returned
        function is called; None where the dialect cannot listen."""
        if self._factory is None:
            return None
        with self._lock:
            self._watchers.append(wake)
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, args=(self._factory, self._stop), name="pyharvest-listen", daemon=True
                )
                self._thread.start()
        return lambda: self._unwatch(wake)

    def _unwatch(self, wake: Callable[[], None]) -> None:
        with self._lock:
            if wake in self._watchers:
                self._watchers.remove(wake)
            if self._watchers:
                return
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None:
            thread.join(WAIT_SLICE * 4)

    def close(self) -> None:
        """Stop listening, whoever still watches."""
        with self._lock:
            self._watchers.clear()
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None:
            thread.join(WAIT_SLICE * 4)

    def _wake_all(self) -> None:
        with self._lock:
            watchers = list(self._watchers)
        for wake in watchers:
            wake()

    def _run(self, factory: ListenerFactory, stop: threading.Event) -> None:
        pause = RECONNECT_BACKOFF[0]
        failures = 0
        while not stop.is_set():
            try:
                listener: Listener = factory()
            except Exception as e:  # noqa: BLE001 - reported, and retried
                failures += 1
                if failures == 1:
                    log.warning("cannot listen for %s's notifications, polling meanwhile: %s", self.table, one_line(e))
                stop.wait(pause)
                pause = min(RECONNECT_BACKOFF[1], pause * 2)
                continue
            self.connected = True
            self.connects += 1
            if failures or self.connects > 1:
                log.info("listening for %s's notifications again", self.table)
            failures, pause = 0, RECONNECT_BACKOFF[0]
            self._wake_all()  # a notification may have come while no one listened
            try:
                while not stop.is_set():
                    if listener.wait(WAIT_SLICE):
                        self._wake_all()
            except Exception as e:  # noqa: BLE001 - reconnect
                failures = 1
                log.warning(
                    "lost the connection listening for %s's notifications, reconnecting (polling meanwhile): %s",
                    self.table, one_line(e),
                )
            finally:
                self.connected = False
                listener.close()
