"""``delivery: exactly-once`` as a delivery mode: a window the main loop hands marked records
to, and the publisher's thread that publishes them in Kafka transactions.

Why each record is then visible once: :mod:`pyharvest.core.publishing.transactional`. What the
engine asks of every mode: :class:`~pyharvest.core.publishing.contract.DeliveryMode`.
"""

from __future__ import annotations

import threading
import time

from pyharvest.core.config.settings import Config
from pyharvest.core.ports.database import DatabaseBinding
from pyharvest.core.ports.kafka import KafkaClients
from pyharvest.core.publishing.contract import ModeContext
from pyharvest.core.publishing.progress import check_transactions
from pyharvest.core.publishing.transaction_window import TransactionWindow
from pyharvest.core.publishing.transactional import TransactionalPublisher

__all__ = ["ExactlyOnce"]


class ExactlyOnce:
    """A :class:`~pyharvest.core.publishing.transaction_window.TransactionWindow` and the
    :class:`~pyharvest.core.publishing.transactional.TransactionalPublisher` that serves it.

    Each shard has a transactional producer of its own (the context's ``shared_producer`` is
    not used): a transaction belongs to one producer, and a shard's new leader must fence its
    old one alone.
    """

    def __init__(self, context: ModeContext) -> None:
        config, limits = context.config, context.config.limits
        assert limits.max_in_flight_records is not None  # resolve() fills in every default
        #: What the main loop hands marked records to.
        self.window = TransactionWindow(limits.max_in_flight_records)
        self._publisher = TransactionalPublisher(
            self.window,
            config,
            context.kafka,
            context.metrics,
            shard=context.shard or 0,
            emit=context.emit,
            deadline=context.deadline,
            spans=context.spans,
            blocked=context.blocked,
        )
        self._heartbeat_timeout = limits.heartbeat_timeout or 1.0

    @staticmethod
    def check(kafka: KafkaClients, config: Config) -> None:
        """Refuse to start where Kafka cannot run transactions (once per process)."""
        check_transactions(kafka, config)

    def open(self, binding: DatabaseBinding) -> None:
        """Nothing to connect yet: the publisher's thread opens its producer as it takes over."""

    def serve(self, binding: DatabaseBinding, done: threading.Event) -> None:
        self._publisher.serve(binding, done)

    def on_elected(self) -> None:
        # Before the new leader id: nothing is marked until the takeover is done.
        self.window.begin_term()

    def abandon(self) -> float:
        # Kafka's own fence makes waiting for the transaction unnecessary, and an abort may hang
        # on the cut-off broker: the quiesce that follows waits no longer than a heartbeat.
        self._publisher.abandon()
        return time.monotonic() + self._heartbeat_timeout

    def before_remark(self) -> float:
        # A poison record parks only its key (see TransactionalPublisher): no pause here.
        return 0.0

    def close(self) -> None:
        # Nothing: the publisher's thread closes its producer as it ends (a producer exists only
        # once that thread has taken over), and closing it from here could race a transaction
        # the thread still runs past the shutdown deadline.
        return
