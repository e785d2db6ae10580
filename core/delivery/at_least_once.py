"""``delivery: at-least-once`` (goharvest's) as a delivery mode: the per-key gate and the
dispatcher take marked records, the sender produces them, and the delivery processor settles
each report in the database before its key is released.

Each part upholds its share of the engine's invariants (:mod:`pyharvest.core.engine.harvest`):

* :mod:`~pyharvest.core.delivery.gate`: per-key barriers, parked records, the window (1);
* :mod:`~pyharvest.core.delivery.dispatch`: whether records may go out now (``force_remark``,
  leading), decided under one lock with the gate (3);
* :mod:`~pyharvest.core.delivery.sender`: the producer, and one delivery report per record sent;
* :mod:`~pyharvest.core.delivery.processor`: reports settled in the database before keys are
  released (2 and 3).
"""

from __future__ import annotations

import threading
from collections import deque

from pyharvest.core.config.settings import Config
from pyharvest.core.delivery.dispatch import Dispatcher
from pyharvest.core.delivery.gate import KeyGate
from pyharvest.core.delivery.mode import ModeContext
from pyharvest.core.delivery.processor import DeliveryProcessor, Flight
from pyharvest.core.delivery.sender import Sender
from pyharvest.core.delivery.shared_producer import ShardKafkaClients
from pyharvest.core.ports.database import DatabaseBinding
from pyharvest.core.ports.kafka import KafkaClients

__all__ = ["MAX_POISON_BACKOFF", "AtLeastOnce"]

# The longest pause before a remark retries a record Kafka refused for good.
MAX_POISON_BACKOFF = 10.0


class AtLeastOnce:
    """The gate, dispatcher, sender and delivery processor of one engine. With
    ``shared_producer`` (a sharded process) the sender produces through the process's one
    producer until a fatal error makes it replace it with its own."""

    def __init__(self, context: ModeContext) -> None:
        config, kafka, shared = context.config, context.kafka, context.shared_producer
        limits = config.limits
        max_in_flight, mark_size = limits.max_in_flight_records, limits.mark_query_records
        assert max_in_flight is not None and mark_size is not None  # resolve() fills in every default
        mark_size = min(mark_size, max_in_flight)
        reports: deque[Flight] = deque()
        clients = kafka if shared is None else ShardKafkaClients(kafka, shared)
        self._sender = Sender(config, clients, context.metrics, reports.append, context.spans)
        #: What the main loop hands marked records to: the gate under the dispatcher's lock.
        self.window = Dispatcher(KeyGate(max_in_flight), self._sender.send, queue_timeout=limits.queue_timeout or 0.0)
        self._delivery = DeliveryProcessor(
            reports,
            config,
            context.metrics,
            coalesce_target=max(1, min(2 * mark_size, max_in_flight // 2)),
            emit=context.emit,
            raise_remark=self.window.raise_remark,
            release=self.window.release,
            deadline=context.deadline,
            spans=context.spans,
        )
        self._backoff = limits.io_error_backoff or 0.01

    @staticmethod
    def check(kafka: KafkaClients, config: Config) -> None:
        """Nothing to check: any Kafka-compatible broker will do."""

    def open(self, binding: DatabaseBinding) -> None:
        self._sender.open()

    def serve(self, binding: DatabaseBinding, done: threading.Event) -> None:
        window = self.window

        def may_hold_acks() -> bool:
            return window.may_hold_acks() and not done.is_set()

        self._delivery.serve(binding, lambda: self._sender.producer, done, may_hold_acks)

    def on_elected(self) -> None:
        """Nothing before the new leader id: its remark takes whatever earlier ones marked."""

    def abandon(self) -> None:
        # The failed reports reset the rows; the quiesce that follows waits for them.
        self._sender.abandon()

    def before_remark(self) -> float:
        delivery = self._delivery
        if delivery.producer_broken:
            self._sender.replace()
            delivery.producer_broken = False
        streak = delivery.poison_streak
        return min(MAX_POISON_BACKOFF, self._backoff * 2 ** min(streak - 1, 10)) if streak else 0.0

    def close(self) -> None:
        # The delivery thread stops at its next turn once the producer is taken away.
        producer = self._sender.detach()
        if producer is not None:
            producer.close()
