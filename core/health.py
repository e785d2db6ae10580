"""What a readiness probe reads: the harvester's :class:`Health`, and the database's answer.

Probes come every few seconds from several exporters at once (``/readyz``, a Prometheus
scrape); :class:`DatabaseProbe` caches the ping's answer so that they cost the database one
query per :data:`PING_INTERVAL` between them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyharvest.core.binding import DatabaseBinding
from pyharvest.core.logs import log, one_line

__all__ = ["PING_INTERVAL", "DatabaseProbe", "Health"]

PING_INTERVAL = 2.0


@dataclass(frozen=True, slots=True)
class Health:
    running: bool
    leader: bool
    broker_connected: bool | None
    database_connected: bool | None
    #: Whether the binding's change feed (PostgreSQL's ``LISTEN`` connection) is listening; None
    #: where the binding has none. It does not decide readiness: while it reconnects, marks
    #: still find every record, within one ``maxMarkBackoff``.
    change_feed_connected: bool | None = None

    @property
    def ready(self) -> bool:
        return self.running and self.broker_connected is not False and self.database_connected is not False


class DatabaseProbe:
    """Whether the database answers, by the binding's optional ``ping()``; ``None`` without one."""

    def __init__(self) -> None:
        self._last: tuple[float, bool | None] = (float("-inf"), None)

    def check(self, binding: DatabaseBinding | None) -> bool | None:
        ping = getattr(binding, "ping", None)
        if ping is None:
            return None
        now = time.monotonic()
        checked_at, answer = self._last
        if now - checked_at < PING_INTERVAL:
            return answer
        try:
            ping()
            answer = True
        except Exception as e:  # noqa: BLE001 - reported as not ready
            log.debug("database ping failed: %s", one_line(e))
            answer = False
        self._last = (now, answer)
        return answer
