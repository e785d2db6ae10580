"""The process's count of stuck Kafka clients replaced, by kind of client: what
``pyharvest_kafka_client_restarts_total`` exports. A binding counts a replacement through
:meth:`pyharvest.core.healing.stuck_clients.ProgressWatch.replaced`."""

from __future__ import annotations

import threading

__all__ = ["HEALED_CLIENTS", "ClientRestarts", "restarts"]

#: The clients a heal may replace, each exported from 0.
HEALED_CLIENTS = ("leader_consumer", "producer", "transactional_producer")


class ClientRestarts:
    """How many times this process replaced a stuck client, by kind of client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def count(self, client: str) -> None:
        with self._lock:
            self._counts[client] = self._counts.get(client, 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


#: The process's count (clients are per process, and so is the metric).
restarts = ClientRestarts()
