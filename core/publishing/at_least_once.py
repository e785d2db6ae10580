"""``delivery: at-least-once`` (goharvest's) as a delivery mode: the key window takes marked
records, the sender produces them, and the delivery thread settles each report in the database
before its key is released.

Each part upholds its share of the engine's invariants (:mod:`pyharvest.core.engine.harvest`):

* :mod:`~pyharvest.core.publishing.key_window`: per-key barriers, parked records, the window,
  and whether records may go out now (``force_remark``, leading) under one lock (1 and 3);
* :mod:`~pyharvest.core.publishing.sender`: the producer, and one delivery report per record sent;
* :mod:`~pyharvest.core.publishing.acks`: reports settled in the database (through the
  :mod:`~pyharvest.core.publishing.settlement` both modes share) before keys are released (2 and 3).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pyharvest.core.config.settings import Config
from pyharvest.core.outbox.identity import IdentityStamp
from pyharvest.core.ports.database import DatabaseBinding
from pyharvest.core.ports.kafka import KafkaClients
from pyharvest.core.publishing.acks import AckProcessor
from pyharvest.core.publishing.contract import ModeContext
from pyharvest.core.publishing.key_window import KeyGate, KeyWindow
from pyharvest.core.publishing.sender import Sender
from pyharvest.core.publishing.settlement import Settlement
from pyharvest.core.publishing.shared_producer import ShardKafkaClients

__all__ = ["AtLeastOnce"]


class UntilShutdown:
    """At least once, a settlement is retried until the shutdown deadline passes."""

    def __init__(self, deadline: Callable[[], float | None], backoff: float) -> None:
        self._deadline = deadline
        self._backoff = backoff

    def may_retry(self) -> bool:
        at = self._deadline()
        return at is None or time.monotonic() <= at

    def pause(self) -> None:
        time.sleep(self._backoff)


class AtLeastOnce:
    """The key window, sender and delivery thread of one engine. With ``shared_producer`` (a
    sharded process) the sender produces through the process's one producer until a fatal
    error makes it replace it with its own."""

    def __init__(self, context: ModeContext) -> None:
        config, kafka, shared = context.config, context.kafka, context.shared_producer
        limits = config.limits
        max_in_flight, mark_size = limits.max_in_flight_records, limits.mark_query_records
        assert max_in_flight is not None and mark_size is not None  # resolve() fills in every default
        mark_size = min(mark_size, max_in_flight)
        clients = kafka if shared is None else ShardKafkaClients(kafka, shared)
        stamp = IdentityStamp(config.leader_group_id, config.outbox_table, config.identity_headers)
        self._sender = Sender(config, clients, context.metrics, context.spans, stamp)
        #: What the main loop hands marked records to.
        self.window = KeyWindow(KeyGate(max_in_flight), self._sender, queue_timeout=limits.queue_timeout or 0.0)
        patience = UntilShutdown(context.deadline, limits.io_error_backoff or 0.0)
        self._settlement = Settlement(
            config, context.metrics, context.spans, context.emit, patience, blocked=context.blocked
        )
        self._acks = AckProcessor(
            self._sender,
            self.window,
            self._settlement,
            context.metrics,
            coalesce_target=max(1, min(2 * mark_size, max_in_flight // 2)),
            min_metrics_interval=limits.min_metrics_interval or 0.0,
            emit=context.emit,
        )

    @staticmethod
    def check(kafka: KafkaClients, config: Config) -> None:
        """Nothing to check: any Kafka-compatible broker will do."""

    def open(self, binding: DatabaseBinding) -> None:
        self._sender.open()

    def serve(self, binding: DatabaseBinding, done: threading.Event) -> None:
        self._acks.serve(binding, done)

    def on_elected(self) -> None:
        """Nothing before the new leader id: its remark takes whatever earlier ones marked."""

    def abandon(self) -> None:
        # The failed reports reset the rows; the quiesce that follows waits for them.
        self._sender.abandon()

    def before_remark(self) -> float:
        acks = self._acks
        if acks.producer_broken:
            self._sender.replace()
            acks.producer_broken = False
        return self._settlement.poison_backoff()

    def close(self) -> None:
        # The delivery thread stops at its next turn once the producer is taken away.
        producer = self._sender.detach()
        if producer is not None:
            producer.close()
