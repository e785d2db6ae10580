"""A leader's heartbeats: published to each leader-topic partition it owns, and consumed back
by the same member (:mod:`pyharvest.core.election.neli`), whose deadline on them fences a leader cut
off from the cluster.

A heartbeat's value says who sent it: ``<unix ns>%<name>%<host>%<pid>%<token>%<instanceID>``
(the first two fields are what it always held). The token is the sending process's own, so a
static member tells its heartbeats from a live namesake's (same name and instanceID), and a
standby reading the partition's last heartbeat names its leader (:class:`SenderOf`)."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from pyharvest.core.config.kafka_acls import Acl, is_authorization_failure, refused
from pyharvest.core.ports.kafka import DeliveryError, KafkaConfigMap, Producer

__all__ = ["HeartbeatSender", "Heartbeats", "parse_heartbeat"]

# The election's logger: these lines belong with its own.
log = logging.getLogger("pyharvest.neli")


@dataclass(frozen=True, slots=True)
class HeartbeatSender:
    """Who sent a heartbeat, and when (``sent_at``: its sender's Unix time, seconds)."""

    sent_at: float
    name: str
    host: str = ""
    pid: int | None = None
    token: str = ""
    instance_id: str = ""

    def describe(self) -> str:
        """``name (host pid N, instanceID x)``, as the status page says who leads."""
        where = " ".join(w for w in (self.host, f"pid {self.pid}" if self.pid is not None else "") if w)
        extra = ", ".join(w for w in (where, f"instanceID {self.instance_id}" if self.instance_id else "") if w)
        return f"{self.name} ({extra})" if extra else self.name


def parse_heartbeat(value: bytes | None) -> HeartbeatSender | None:
    """The sender of a heartbeat's value; None for a value that is no heartbeat. Values of
    older pyharvests (``<unix ns>%<name>``) give the name and time only."""
    if not value:
        return None
    fields = value.decode("utf-8", "replace").split("%", 5)
    try:
        sent_at = int(fields[0]) / 1e9
    except ValueError:
        return None
    if len(fields) < 2:
        return None
    host, pid, token, instance = [*fields[2:], "", "", "", ""][:4]
    return HeartbeatSender(sent_at, fields[1], host, int(pid) if pid.isdigit() else None, token, instance)


class Heartbeats:
    """Publishes a member's heartbeats to its leader-topic partitions. A failed one is only
    counted and logged now and then: a lost heartbeat is what fencing is for. One an ACL
    refused ends the harvester at the next send: no heartbeat will ever get through. While they
    keep failing, :attr:`failing_since` and :attr:`last_error` say since when and why (readiness
    reports it: a cluster below ``min.insync.replicas`` refuses them)."""

    def __init__(self, topic: str, name: str, kafka_config: KafkaConfigMap | None = None,
                 clock: Callable[[], float] = time.monotonic, instance_id: str = "") -> None:
        self.topic = topic
        self.name = name
        #: This process's own mark in every heartbeat it sends (see the module's docstring).
        self.token = uuid.uuid4().hex[:12]
        self._signature = f"{name}%{socket.gethostname()}%{os.getpid()}%{self.token}%{instance_id}"
        self._clock = clock
        self.errors = 0
        self._kafka_config = kafka_config or {}
        self._refused: DeliveryError | None = None
        #: When (monotonic) the heartbeats started failing; None while they are delivered.
        self.failing_since: float | None = None
        self.last_error: DeliveryError | None = None
        #: When (monotonic) the last heartbeat was sent; None before the first.
        self.last_sent: float | None = None

    def refusal(self, after: float) -> str | None:
        """Why the cluster refuses the heartbeats, once they have failed for ``after`` seconds
        (a cluster below ``min.insync.replicas`` refuses them: the member cannot lead); None
        while they are delivered."""
        since = self.failing_since
        if since is None or self._clock() - since < after:
            return None
        if self.last_sent is None or self._clock() - self.last_sent > after:
            # A member that owns no shard sends none: a standby whose last heartbeats failed,
            # when the cluster fell below min.insync.replicas and its shards moved away, has
            # nothing refused now (no delivery will ever clear the old failure).
            return None
        error, lasted = self.last_error, self._clock() - since
        # librdkafka's own codes start with "_" (_MSG_TIMED_OUT, _TRANSPORT, _ALL_BROKERS_DOWN):
        # no broker answered; a broker's code means it answered and said no.
        if error is not None and error.code.startswith("_"):
            return (
                f"Kafka has not acknowledged the heartbeats to {self.topic!r} for {lasted:.0f}s (no broker answered: "
                f"is the cluster reachable?): {error}"
            )
        return f"Kafka has refused the heartbeats to {self.topic!r} for {lasted:.0f}s: {error}"

    def send(self, producer: Producer | None, partition: int) -> None:
        assert producer is not None
        if self._refused is not None:
            acl = Acl("topic", self.topic, ("Write",), "publishing heartbeats")
            raise refused(self._kafka_config, acl, str(self._refused))
        self.last_sent = self._clock()
        value = f"{time.time_ns()}%{self._signature}".encode()
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
