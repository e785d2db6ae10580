"""What the inbox needs of a Kafka consumer.

The consumer is a protocol so that the inbox's transactional logic never sees
confluent-kafka (:mod:`pyharvest.bindings.kafka.inbox_consumer` implements it) and can be
exercised with a fake. The contract that keeps exactly-once intact is on the consumer's
side of the line: it delivers a partition's messages only between the listener's
``assigned`` (which claims the partition's fence) and ``revoked``/``lost``/:meth:`pause`,
starting at the offset the listener read from the database, and calls the listener on the
thread that calls :meth:`InboxConsumer.poll`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from pyharvest.core.inbox.message import InboxMessage

__all__ = ["InboxConsumer", "RebalanceListener", "TopicPartition"]

#: A topic and one of its partitions.
TopicPartition = tuple[str, int]


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
