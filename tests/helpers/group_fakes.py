"""A fake leader group for Fast NELI: the consumer's assignments and returned heartbeats are set
by the test, the heartbeat producer records what it sent, and a clock the test moves."""

from __future__ import annotations

from pyharvest.core.ports.kafka import DeliveryError


class Consumer:
    def __init__(self) -> None:
        self.on_assign = self.on_revoke = None
        self.config: dict[str, object] = {}
        self.to_assign: list[int] = []
        self.to_revoke: list[int] = []
        self.returned: list[int] = []  # partitions whose heartbeats come back at the next poll

    def subscribe(self, topic, on_assign, on_revoke) -> None:
        self.on_assign, self.on_revoke = on_assign, on_revoke

    def poll(self, timeout: float) -> int:
        return len(self.poll_partitions(timeout))

    def poll_partitions(self, timeout: float) -> list[int]:
        if self.to_revoke:
            parts, self.to_revoke = self.to_revoke, []
            self.on_revoke(parts)
        if self.to_assign:
            parts, self.to_assign = self.to_assign, []
            self.on_assign(parts)
        out, self.returned = self.returned, []
        return out

    def close(self) -> None:
        pass


class Producer:
    def __init__(self) -> None:
        self.heartbeats: list[int] = []
        self.refusal: DeliveryError | None = None  # what the cluster answers each heartbeat

    def produce(self, topic, key, value, headers, on_delivery, partition=None) -> None:
        self.heartbeats.append(partition)
        on_delivery(self.refusal)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0

    def abandon(self) -> None:
        pass

    def close(self) -> None:
        pass


class Clients:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.consumer = Consumer()
        self.producer_ = Producer()

    def producer(self, config):
        return self.producer_

    def leader_consumer(self, config):
        self.consumer.config = dict(config)
        return self.consumer

    def ensure_topic(self, config, topic, partitions=1, timeout=10.0) -> None:
        pass

    def topic_partitions(self, config, topic, timeout=10.0) -> int:
        return self.partitions


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

