"""The little the engine needs of a Kafka client, as protocols.

:mod:`pyharvest.bindings.kafka.confluent` implements them over confluent-kafka; tests may
implement them in memory. Keeping them here keeps the engine free of any client library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

# Defined with the other errors so that `except HarvestError` catches it; importable from here too,
# beside the protocol that raises it.
from pyharvest.core.errors import TopicError

__all__ = [
    "DeliveryCallback",
    "DeliveryError",
    "KafkaClients",
    "KafkaConfigMap",
    "LeaderConsumer",
    "ProduceError",
    "Producer",
    "TopicError",
]

KafkaConfigMap = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class DeliveryError:
    """Why a message was not delivered.

    ``retriable`` is false for errors that will recur however often the record is sent again
    (message too large, invalid topic): a poison record, not a passing fault.
    """

    code: str
    reason: str
    retriable: bool = True
    #: The producer itself is unusable (e.g. fenced); the engine replaces it before retrying.
    fatal: bool = False

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class ProduceError(Exception):
    """Raised by :meth:`Producer.produce` when a message is refused before it is queued."""

    def __init__(self, error: DeliveryError) -> None:
        super().__init__(str(error))
        self.error = error


DeliveryCallback = Callable[[DeliveryError | None], None]


class Producer(Protocol):
    def produce(
        self,
        topic: str,
        key: str,
        value: bytes | str | None,
        headers: Sequence[tuple[str, str | bytes]],
        on_delivery: DeliveryCallback,
        partition: int | None = None,
    ) -> None:
        """Queue one message; ``on_delivery`` is called exactly once, from :meth:`poll` or
        :meth:`flush`, with ``None`` on success. Waits while the local queue is full.
        Raises :class:`ProduceError` if the message is refused outright."""
        ...

    def poll(self, timeout: float) -> int:
        """Serve delivery callbacks for up to ``timeout`` seconds; return how many were served."""
        ...

    def flush(self, timeout: float) -> int:
        """Wait for every queued message's delivery report; return how many are still pending."""
        ...

    def abandon(self) -> None:
        """Give up on every queued and in-flight message: each gets a failed, retriable
        delivery report, and none is sent, or sent again, after this returns.

        A fenced leader calls it. Its successor may be publishing the same keys soon after;
        a request the producer still held (say, to retry it once a partition heals) would
        land after the successor's records and break their order."""
        ...

    def close(self) -> None: ...


class LeaderConsumer(Protocol):
    """A consumer of the leader topic, in the leader group."""

    def subscribe(
        self,
        topic: str,
        on_assign: Callable[[list[int]], None],
        on_revoke: Callable[[list[int]], None],
    ) -> None:
        """Join the group; the callbacks get partition numbers and run inside :meth:`poll`."""
        ...

    def poll(self, timeout: float) -> int:
        """Serve group callbacks and read messages for up to ``timeout`` seconds, returning
        as soon as at least one has arrived; return the number of messages read."""
        ...

    def close(self) -> None: ...


class KafkaClients(Protocol):
    """A factory of clients; the engine asks it for everything it talks to Kafka through."""

    def producer(self, config: KafkaConfigMap) -> Producer: ...

    def leader_consumer(self, config: KafkaConfigMap) -> LeaderConsumer: ...

    def ensure_topic(self, config: KafkaConfigMap, topic: str, partitions: int = 1, timeout: float = 10.0) -> None:
        """Create ``topic`` if it does not exist; raise :class:`TopicError` if it cannot be."""
        ...
