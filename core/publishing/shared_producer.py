"""One data producer for every shard a process leads.

A producer per shard split each produce batch between the shards: at 4 shards in one process,
the reapers used 60% more CPU per record and the broker 160% more than with 1 shard, enough to
make two processes drain slower than one on two cores. Shards share a producer safely: their
keys are disjoint, each message's delivery report still goes to the :class:`~pyharvest.core.publishing.sender.Flight`
of the shard that sent it, and idempotence keeps each partition's order whoever produced to it.

One thread polls the shared producer and serves every report; each shard's delivery thread
waits on its :class:`ProducerHandle`, woken when a poll served something. A shard whose handle
hits a fatal producer error is given a producer of its own by its next
:meth:`ShardKafkaClients.producer` (the engine's replacement), so that one broken producer
never needs the other shards to stop.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pyharvest.core.ports.kafka import DeliveryCallback, KafkaClients, KafkaConfigMap, LeaderConsumer, Producer
from pyharvest.core.telemetry.logs import log, one_line

__all__ = ["ProducerHandle", "ShardKafkaClients", "SharedProducer"]

# The poller's wait when nothing is due; stopping takes at most this long.
POLL_SECONDS = 0.05


class SharedProducer:
    """A producer opened on first use and polled by its own thread until :meth:`close`."""

    def __init__(self, kafka: KafkaClients, config: KafkaConfigMap) -> None:
        self._kafka = kafka
        self._config = config
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._handles: list[ProducerHandle] = []
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def handle(self) -> ProducerHandle:
        """A view of the shared producer for one shard's engine."""
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("the shared producer is closed")
            if self._producer is None:
                self._producer = self._kafka.producer(self._config)
                self._thread = threading.Thread(target=self._poll_loop, name="pyharvest-producer", daemon=True)
                self._thread.start()
            handle = ProducerHandle(self._producer, self)
            self._handles.append(handle)
            return handle

    def _release(self, handle: ProducerHandle) -> None:
        with self._lock:
            if handle in self._handles:
                self._handles.remove(handle)

    def _poll_loop(self) -> None:
        producer = self._producer
        assert producer is not None
        while not self._closed.is_set():
            try:
                served = producer.poll(POLL_SECONDS)
            except Exception as e:  # noqa: BLE001 - a poll error must not end every shard's reports
                log.warning("polling the shared producer failed: %s", one_line(e))
                self._closed.wait(POLL_SECONDS)
                continue
            if served:
                for handle in tuple(self._handles):
                    handle.arrived.set()

    def close(self) -> None:
        """Stop polling and close the producer; call once every engine has stopped. Like a
        producer of its own, nothing is flushed: the engines decided how long to wait."""
        with self._lock:
            self._closed.set()
            producer, self._producer = self._producer, None
            handles, self._handles = self._handles, []
        if self._thread is not None:
            self._thread.join()
        for handle in handles:
            handle.arrived.set()
        if producer is not None:
            producer.close()


class ProducerHandle:
    """One shard's :class:`~pyharvest.core.ports.kafka.Producer`: produces through the shared
    producer; :meth:`poll` waits until the shared poller has served reports."""

    __slots__ = ("_owner", "_producer", "arrived")

    def __init__(self, producer: Producer, owner: SharedProducer) -> None:
        self._producer = producer
        self._owner = owner
        #: Set by the poller after a poll that served reports (perhaps another shard's).
        self.arrived = threading.Event()

    def produce(
        self,
        topic: str,
        key: str,
        value: bytes | str | None,
        headers: Sequence[tuple[str, str | bytes]],
        on_delivery: DeliveryCallback,
        partition: int | None = None,
    ) -> None:
        self._producer.produce(topic, key, value, headers, on_delivery, partition)

    def poll(self, timeout: float) -> int:
        # Cleared after the wait and before the caller looks at its reports: a report appended
        # later sets it again, so none waits for the next timeout.
        woken = self.arrived.wait(timeout)
        self.arrived.clear()
        return int(woken)

    def flush(self, timeout: float) -> int:
        return self._producer.flush(timeout)

    def abandon(self) -> None:
        # The producer is shared: the other shards' messages are abandoned too. Their
        # engines see retriable failures, reset and remark them, as after a network error;
        # a fence usually means the whole process is cut off, its other shards fencing too.
        self._producer.abandon()

    def close(self) -> None:
        self._owner._release(self)


class ShardKafkaClients:
    """The clients one shard's engine sees: the process's shared producer first, a producer of
    its own once it asks again (it replaces a producer only after a fatal error), everything
    else from ``kafka``."""

    def __init__(self, kafka: KafkaClients, shared: SharedProducer) -> None:
        self._kafka = kafka
        self._shared: SharedProducer | None = shared

    def producer(self, config: KafkaConfigMap) -> Producer:
        shared, self._shared = self._shared, None
        if shared is not None:
            return shared.handle()
        log.warning("this shard's engine replaces its producer: it gets one of its own")
        return self._kafka.producer(config)

    def leader_consumer(self, config: KafkaConfigMap) -> LeaderConsumer:
        return self._kafka.leader_consumer(config)

    def ensure_topic(self, config: KafkaConfigMap, topic: str, partitions: int = 1, timeout: float = 10.0) -> None:
        self._kafka.ensure_topic(config, topic, partitions, timeout)
