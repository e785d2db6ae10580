"""The little the engine needs of a Kafka client, as protocols.

:mod:`pyharvest.bindings.kafka.confluent` implements them over confluent-kafka; tests may
implement them in memory. Keeping them here keeps the engine free of any client library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

# Defined with the other errors so that `except HarvestError` catches it; importable from here too,
# beside the protocol that raises it.
from pyharvest.core.errors import TopicError

__all__ = [
    "DeliveryCallback",
    "DeliveryError",
    "HeartbeatConsumer",
    "KafkaClients",
    "KafkaConfigMap",
    "LeaderConsumer",
    "LeaderTopicReader",
    "ProduceError",
    "Producer",
    "TopicError",
    "TransactionError",
    "TransactionErrorKind",
    "TransactionalKafkaClients",
    "TransactionalProducer",
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
    #: A newer producer with the same ``transactional.id``, or a newer epoch, took over: the
    #: producer is fenced (always ``fatal`` too).
    fenced: bool = False

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


@runtime_checkable
class HeartbeatConsumer(Protocol):
    """A leader consumer that gives the heartbeats it reads (a static member tells its own
    from a live namesake's by them)."""

    def poll_heartbeats(self, timeout: float) -> list[tuple[int, bytes | None]]:
        """:meth:`LeaderConsumer.poll`, returning the partition and value of every message read."""
        ...


@runtime_checkable
class LeaderTopicReader(Protocol):
    """Clients that read the leader topic's last heartbeats without joining its group."""

    def last_heartbeats(
        self, config: KafkaConfigMap, topic: str, partitions: int, timeout: float
    ) -> dict[int, bytes | None]:
        """The value of the last message of each of ``topic``'s first ``partitions``
        partitions (an empty partition is left out); read by a consumer of no group."""
        ...


class KafkaClients(Protocol):
    """A factory of clients; the engine asks it for everything it talks to Kafka through."""

    def producer(self, config: KafkaConfigMap) -> Producer: ...

    def leader_consumer(self, config: KafkaConfigMap) -> LeaderConsumer: ...

    def ensure_topic(self, config: KafkaConfigMap, topic: str, partitions: int = 1, timeout: float = 10.0) -> None:
        """Create ``topic`` if it does not exist; raise :class:`TopicError` if it cannot be."""
        ...


#: What a failed transactional call leaves the caller to do (see :class:`TransactionError`).
TransactionErrorKind = Literal["abortable", "retriable", "fenced", "fatal", "unsupported"]


class TransactionError(Exception):
    """A transactional call failed. ``kind`` says what the caller may do next:

    * ``"abortable"``: abort the transaction; the producer stays usable;
    * ``"retriable"``: the same call may be made again (a commit whose outcome is unknown);
    * ``"fenced"``: a newer producer with the same ``transactional.id`` took over;
    * ``"fatal"``: the producer is unusable; whether the transaction committed is unknown;
    * ``"unsupported"``: the cluster has no transactions.
    """

    def __init__(self, kind: TransactionErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: TransactionErrorKind = kind


class TransactionalProducer(Producer, Protocol):
    """A producer with a ``transactional.id`` (exactly-once publishing).

    :meth:`init_transactions` fences every earlier producer with the same id: Kafka aborts
    (or completes) the transaction it left open, and refuses its later produces and commits."""

    def init_transactions(self, timeout: float) -> None: ...

    def begin_transaction(self) -> None: ...

    def commit_transaction(self, timeout: float) -> None:
        """Flush and commit; every message of the transaction becomes visible to
        ``read_committed`` consumers at once, or none does. Raises :class:`TransactionError`."""
        ...

    def abort_transaction(self, timeout: float) -> None: ...


@runtime_checkable
class TransactionalKafkaClients(KafkaClients, Protocol):
    """Clients that can publish exactly once: transactional producers, and a read of the last
    committed record of a partition (the progress log of :mod:`pyharvest.core.publishing.transactional`)."""

    def transactional_producer(self, config: KafkaConfigMap) -> TransactionalProducer: ...

    def ensure_progress_topic(self, config: KafkaConfigMap, topic: str, partitions: int, timeout: float = 10.0) -> None:
        """Create the compacted ``topic`` with ``partitions`` partitions if missing, or add
        partitions up to that number; raise :class:`TopicError` if it cannot."""
        ...

    def probe_transactions(self, config: KafkaConfigMap, topic: str, partition: int, timeout: float) -> None:
        """Check, with a producer of this ``config`` (its own ``transactional.id``) writing to
        ``partition`` of ``topic``, that the cluster runs transactions and hides aborted
        records from ``read_committed`` consumers; raise :class:`TransactionError` (kind
        ``"unsupported"``) if not."""
        ...

    def last_committed(self, config: KafkaConfigMap, topic: str, partition: int, timeout: float) -> bytes | None:
        """The value of the last record of ``partition`` that a committed transaction wrote
        (``read_committed``), or None if it holds none. Raises :class:`TopicError`."""
        ...
