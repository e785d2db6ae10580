"""A leader's heartbeats: published to each leader-topic partition it owns, and consumed back
by the same member (:mod:`pyharvest.core.election.neli`), whose deadline on them fences a leader cut
off from the cluster."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pyharvest.core.config.kafka_acls import Acl, is_authorization_failure, refused
from pyharvest.core.ports.kafka import DeliveryError, KafkaConfigMap, Producer

__all__ = ["Heartbeats"]

# The election's logger: these lines belong with its own.
log = logging.getLogger("pyharvest.neli")


class Heartbeats:
    """Publishes a member's heartbeats to its leader-topic partitions. A failed one is only
    counted and logged now and then: a lost heartbeat is what fencing is for. One an ACL
    refused ends the harvester at the next send: no heartbeat will ever get through. While they
    keep failing, :attr:`failing_since` and :attr:`last_error` say since when and why (readiness
    reports it: a cluster below ``min.insync.replicas`` refuses them)."""

    def __init__(self, topic: str, name: str, kafka_config: KafkaConfigMap | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.topic = topic
        self.name = name
        self._clock = clock
        self.errors = 0
        self._kafka_config = kafka_config or {}
        self._refused: DeliveryError | None = None
        #: When (monotonic) the heartbeats started failing; None while they are delivered.
        self.failing_since: float | None = None
        self.last_error: DeliveryError | None = None

    def refusal(self, after: float) -> str | None:
        """Why the cluster refuses the heartbeats, once they have failed for ``after`` seconds
        (a cluster below ``min.insync.replicas`` refuses them: the member cannot lead); None
        while they are delivered."""
        since = self.failing_since
        if since is None or self._clock() - since < after:
            return None
        return f"Kafka has refused the heartbeats to {self.topic!r} for {self._clock() - since:.0f}s: {self.last_error}"

    def send(self, producer: Producer | None, partition: int) -> None:
        assert producer is not None
        if self._refused is not None:
            acl = Acl("topic", self.topic, ("Write",), "publishing heartbeats")
            raise refused(self._kafka_config, acl, str(self._refused))
        value = f"{time.time_ns()}%{self.name}".encode()
        try:
            producer.produce(self.topic, self.name, value, (), self._delivered, partition=partition)
        except Exception as e:  # noqa: BLE001
            self._delivered(DeliveryError("PRODUCE", str(e)))

    def _delivered(self, error: DeliveryError | None) -> None:
        if error is not None:
            if is_authorization_failure(error.code):
                self._refused = error
            self.last_error = error
            if self.failing_since is None:
                self.failing_since = self._clock()
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.warning("heartbeat not delivered (%d so far): %s", self.errors, error)
        else:
            self.failing_since = None
            if self.errors:
                log.info("heartbeats delivered again after %d failures", self.errors)
                self.errors = 0
