"""What a readiness probe reads: the harvester's :class:`Health`, and the database's answer.

Probes come every few seconds from several exporters at once (``/readyz``, a Prometheus
scrape), and must answer at once even while the database does not: an orchestrator that gets
no answer kills the process, which brings no database back. So :class:`DatabaseProbe` never
pings on the caller's thread. It answers the last known state; at most every
:data:`PING_INTERVAL` it starts one ping in the background, and a ping still unanswered after
:data:`PING_TIMEOUT` counts as a database that does not answer, until one comes back.

A probe that starts the ping it needs reads the previous answer, so the operations server
also pings on a timer of its own (:meth:`DatabaseProbe.ping_now`, every :data:`PING_INTERVAL`),
and the engine reports the missing table it meets (:meth:`DatabaseProbe.note_failure`) at
once: a probe that comes two intervals after the database or the table went away gets 503. A
table another session keeps locked past ``limits.lockTimeout`` counts as down, with the
holders, until the binding's statements succeed again (a row lock blocks no ping).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyharvest.core.config.masking import mask_data_source
from pyharvest.core.errors import TableNotFoundError
from pyharvest.core.ports.database import DatabaseBinding
from pyharvest.core.telemetry.logs import log, one_line

__all__ = ["PING_INTERVAL", "PING_TIMEOUT", "DatabaseProbe", "Health"]

PING_INTERVAL = 2.0
PING_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class Health:
    """What a readiness probe reads of a harvester (``harvest.health()``): whether it runs and
    leads, and whether the broker and the database answer (None where it cannot tell).
    :attr:`ready` is the probe's answer."""

    running: bool
    leader: bool
    broker_connected: bool | None
    database_connected: bool | None
    #: Whether the binding's change feed (PostgreSQL's ``LISTEN`` connection) is listening; None
    #: where the binding has none. It does not decide readiness: while it reconnects, marks
    #: still find every record, within one ``maxMarkBackoff``.
    change_feed_connected: bool | None = None
    #: Why the database counts as down (the last ping's error, or how long it has not
    #: answered); None while it answers.
    database_error: str | None = None
    #: Why Kafka counts as down although it answers: it has refused the leader's heartbeats
    #: for a heartbeat timeout (say, ``NOT_ENOUGH_REPLICAS`` below ``min.insync.replicas``).
    broker_error: str | None = None

    @property
    def ready(self) -> bool:
        return (self.running and self.broker_connected is not False and self.broker_error is None
                and self.database_connected is not False)


class DatabaseProbe:
    """Whether the database answers, by the binding's optional ``ping()`` run in the
    background; ``None`` without one, or before the first ping has answered."""

    def __init__(self, interval: float = PING_INTERVAL, timeout: float = PING_TIMEOUT) -> None:
        self.interval = interval
        self.timeout = timeout
        self._lock = threading.Lock()
        self._answer: bool | None = None
        self._error: str | None = None
        self._answered_at = float("-inf")
        #: When the ping in flight started; None while none is.
        self._pinging_since: float | None = None

    def check(self, binding: DatabaseBinding | None) -> bool | None:
        """The last known answer (never waits); see :meth:`state` for the reason."""
        return self.state(binding)[0]

    def state(self, binding: DatabaseBinding | None) -> tuple[bool | None, str | None]:
        """``(answers, why not)``, from what is known now; starts a ping if one is due."""
        ping: Callable[[], object] | None = getattr(binding, "ping", None)
        if ping is None:
            return None, None
        now = time.monotonic()
        with self._lock:
            if self._pinging_since is None and now - self._answered_at >= self.interval:
                self._start(ping, now)
            since, answer, error = self._pinging_since, self._answer, self._error
        # A table another session keeps locked (the binding's optional ``lock_error``: its
        # last statement's TableLockedError, until one succeeds); a ping may still answer, as
        # no row lock blocks it, while the harvester's marks or purges cannot go on.
        locked: BaseException | None = getattr(binding, "lock_error", None)
        if locked is not None:
            return False, one_line(locked)
        if since is not None and now - since > self.timeout:
            return False, f"the database has not answered a ping for {now - since:.1f}s"
        return answer, error

    def ping_now(self, binding: DatabaseBinding | None) -> None:
        """Start a ping in the background unless one is in flight (a timer's call)."""
        ping: Callable[[], object] | None = getattr(binding, "ping", None)
        if ping is not None:
            with self._lock:
                if self._pinging_since is None:
                    self._start(ping, time.monotonic())

    def note_failure(self, error: BaseException) -> None:
        """The engine met ``error``; a missing table (:class:`TableNotFoundError`) makes the
        database count as down at once, until a ping answers again."""
        if isinstance(error, TableNotFoundError):
            with self._lock:
                self._answer, self._error = False, one_line(error)
                self._answered_at = time.monotonic()

    def _start(self, ping: Callable[[], object], now: float) -> None:
        self._pinging_since = now  # under the lock
        threading.Thread(target=self._ping, args=(ping,), name="pyharvest-db-ping", daemon=True).start()

    def _ping(self, ping: Callable[[], object]) -> None:
        try:
            ping()
            answer, error = True, None
        except Exception as e:  # noqa: BLE001 - reported as not ready, with its reason
            # /readyz shows the reason: a driver that quotes its connection URL keeps its password.
            answer, error = False, mask_data_source(one_line(e))
            log.debug("database ping failed: %s", error)
        with self._lock:
            self._answer, self._error = answer, error
            self._answered_at = time.monotonic()
            self._pinging_since = None
