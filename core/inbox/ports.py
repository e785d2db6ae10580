"""What the inbox's engine needs of the world: a Kafka consumer, a database, and the stores of
its checkpoints, applied identities and dead letters; and what it calls, the application's
handlers.

Everything here is a protocol, so that the engine's transactional logic never sees
confluent-kafka or SQLAlchemy (the bindings implement them:
:mod:`pyharvest.bindings.kafka.inbox_consumer`, :mod:`pyharvest.bindings.sql.inbox`) and can
be exercised with fakes. A store's methods take the transaction's connection first (``tx``):
the engine opens each transaction through :class:`InboxDatabase` and hands its connection, as
it is, to the stores and to the handler.

The contract that keeps exactly-once intact on the consumer's side of the line: it delivers a
partition's messages only between the listener's ``assigned`` (which claims the partition's
fence) and ``revoked``/``lost``/:meth:`InboxConsumer.pause`, starting at the offset the
listener read from the database, and calls the listener on the thread that calls
:meth:`InboxConsumer.poll`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from pyharvest.core.inbox.letters import DeadLetter
from pyharvest.core.inbox.message import InboxMessage, Source

__all__ = [
    "BatchHandler",
    "CheckpointStore",
    "Claim",
    "DeadLetterStore",
    "DedupeStore",
    "Handler",
    "InboxConsumer",
    "InboxDatabase",
    "InboxPorts",
    "RebalanceListener",
    "Savepoint",
    "TopicPartition",
    "Transaction",
]

#: A topic and one of its partitions.
TopicPartition = tuple[str, int]

#: ``handler(tx, message)``: apply ``message`` through ``tx`` (the database connection inside the
#: inbox's transaction: do not commit or roll back). Raise to reject the message.
Handler = Callable[[Any, InboxMessage], object]

#: ``batch_handler(tx, messages)``: apply ``messages`` (one transaction's, after dedupe, each
#: partition's in offset order) through ``tx``, as one would by applying them one after the
#: other. Raise to reject them: the inbox then finds the message that fails (applying parts
#: of the list in savepoints) and applies the rest without it.
BatchHandler = Callable[[Any, list[InboxMessage]], object]


# ---------------------------------------------------------------------- Kafka


class RebalanceListener(Protocol):
    """The inbox's side of a consumer-group rebalance."""

    def assigned(self, partitions: list[TopicPartition]) -> Mapping[TopicPartition, int | None]:
        """Take ``partitions`` over; return where to start each: the next offset committed
        to the database, or None for none yet (the consumer's ``auto.offset.reset`` applies).
        Raising refuses them: the consumer must then not deliver their messages."""
        ...

    def revoked(self, partitions: list[TopicPartition]) -> None:
        """``partitions`` are being handed to another member; their fences are still ours."""
        ...

    def lost(self, partitions: list[TopicPartition]) -> None:
        """The group moved on without us: the fences are (or soon will be) someone else's."""
        ...


class InboxConsumer(Protocol):
    """A Kafka consumer group member as the inbox uses it."""

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None: ...

    def poll(self, max_messages: int, timeout: float) -> list[InboxMessage]:
        """Up to ``max_messages`` new messages of the partitions being consumed, each offset
        once. Rebalances run inside, and an exception the listener raised is raised here."""
        ...

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Stop delivering ``partitions`` (their fence moved) until they are assigned again."""
        ...

    def commit(self, positions: Mapping[TopicPartition, int]) -> None:
        """Record the next offsets in Kafka, for lag monitoring only: never read back, so a
        failure is not the inbox's concern."""
        ...

    def close(self) -> None:
        """Leave the group (a last ``revoked`` may run inside)."""
        ...


# ---------------------------------------------------------------------- the database


class Transaction(Protocol):
    """One database transaction of the inbox, on a connection of its own."""

    @property
    def connection(self) -> Any:
        """What the stores and the handlers work through (a SQLAlchemy ``Connection``)."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None:
        """Give the connection back; what was not committed is rolled back."""
        ...


class Savepoint(Protocol):
    def commit(self) -> None: ...

    def rollback(self) -> None: ...


class InboxDatabase(Protocol):
    """The inbox's database: its transactions, and how its failures are told apart."""

    #: What a failing database raises (retried after a pause, never taken for the handler's failure).
    failures: tuple[type[BaseException], ...]

    def begin(self) -> Transaction:
        """A new connection in a new transaction."""
        ...

    def connect(self) -> AbstractContextManager[Any]:
        """A connection for reads outside the inbox's transactions, closed at the block's end."""
        ...

    def savepoint(self, tx: Any) -> Savepoint:
        """A savepoint inside ``tx``'s transaction (which must have begun with a write)."""
        ...

    def connection_lost(self, error: BaseException) -> bool:
        """Whether ``error`` (raised by a handler) is really the connection going away: retried,
        never dead-lettered."""
        ...


# ---------------------------------------------------------------------- the stores


@dataclass(slots=True)
class Claim:
    """A partition this consumer owns: the fence it wrote and the next offset to apply
    (None: nothing committed yet, start from the consumer's ``auto.offset.reset``)."""

    fence: int
    next_offset: int | None


class CheckpointStore(Protocol):
    """Each partition's next offset and its fence (see :mod:`pyharvest.bindings.sql.inbox.checkpoints`)."""

    def claim(self, tx: Any, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, Claim]:
        """Bump the fence of each partition (creating its row if missing) in ``tx``'s transaction."""
        ...

    def advance(self, tx: Any, tp: TopicPartition, next_offset: int, fence: int) -> bool:
        """Move the partition's offset in ``tx``'s transaction if ``fence`` still holds."""
        ...

    def verify(self, tx: Any, tp: TopicPartition, fence: int) -> bool:
        """Check (and lock, until ``tx`` commits) the fence without moving the offset."""
        ...

    def read(self, tx: Any, tp: TopicPartition) -> Claim | None: ...


class DedupeStore(Protocol):
    """The source identities applied, so that a copy the harvester published twice is dropped."""

    def applied(self, tx: Any, sources: Iterable[Source]) -> set[Source]:
        """Which of ``sources`` were applied already (by any transaction that committed)."""
        ...

    def remember(self, tx: Any, messages: Sequence[InboxMessage]) -> None:
        """Remember the identities of the applied ``messages`` that have one."""
        ...

    def prune(self, tx: Any, topic: str, partition: int, below_offset: int) -> int:
        """Forget identities of the partition more than the dedupe window behind."""
        ...


class DeadLetterStore(Protocol):
    """Dead letters and parked messages (see :mod:`pyharvest.core.inbox.letters`)."""

    def parked_keys(self, tx: Any, topic: str, partition: int) -> set[str]:
        """Key hashes of the partition that have stored messages (and so park new ones)."""
        ...

    def store(self, tx: Any, message: InboxMessage, status: str, error: str | None, khash: str | None) -> None: ...

    def requested(self, tx: Any, topic: str, partition: int) -> list[str | None]:
        """Key hashes of the partition with a replay request, oldest first (None: a null-key
        dead letter, once per request)."""
        ...

    def load(self, tx: Any, topic: str, partition: int, khash: str | None) -> list[DeadLetter]:
        """The stored messages of one key in arrival order (for a null key: the oldest
        requested null-key message alone)."""
        ...

    def delete(self, tx: Any, ids: Collection[int]) -> None: ...

    def fail_again(self, tx: Any, letter: DeadLetter, error: str, others: list[int]) -> None:
        """Make ``letter`` the key's dead letter with ``error``; clear the request on it and ``others``."""
        ...


@dataclass(frozen=True, slots=True)
class InboxPorts:
    """Everything the engine reaches the world through, together."""

    database: InboxDatabase
    checkpoints: CheckpointStore
    dedupe: DedupeStore
    dead_letters: DeadLetterStore
    consumer: InboxConsumer
