"""A leader's heartbeats: published to each leader-topic partition it owns, and consumed back
by the same member (:mod:`pyharvest.core.election.neli`), whose deadline on them fences a leader cut
off from the cluster."""

from __future__ import annotations

import logging
import time

from pyharvest.core.ports.kafka import DeliveryError, Producer

__all__ = ["Heartbeats"]

# The election's logger: these lines belong with its own.
log = logging.getLogger("pyharvest.neli")


class Heartbeats:
    """Publishes a member's heartbeats to its leader-topic partitions. A failed one is only
    counted and logged now and then: a lost heartbeat is what fencing is for."""

    def __init__(self, topic: str, name: str) -> None:
        self.topic = topic
        self.name = name
        self.errors = 0

    def send(self, producer: Producer | None, partition: int) -> None:
        assert producer is not None
        value = f"{time.time_ns()}%{self.name}".encode()
        try:
            producer.produce(self.topic, self.name, value, (), self._delivered, partition=partition)
        except Exception as e:  # noqa: BLE001
            self._delivered(DeliveryError("PRODUCE", str(e)))

    def _delivered(self, error: DeliveryError | None) -> None:
        if error is not None:
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.warning("heartbeat not delivered (%d so far): %s", self.errors, error)
        elif self.errors:
            log.info("heartbeats delivered again after %d failures", self.errors)
            self.errors = 0
