"""The inbox consumer: Kafka messages applied to a database exactly once.

One worker thread consumes a Kafka consumer group and applies messages in database
transactions of at most ``maxBatchSize`` messages and ``maxBatchDuration``. Each
transaction holds the handler's effects, the identities it applied (dedupe) and, last, the
fenced move of each partition's checkpoint (see :mod:`pyharvest.bindings.sql.inbox.checkpoints`). So
either all of a batch happened and the offsets say so, or none of it did.

Failures and what they cost:

* handler raises, ``stop``: roll back, stop; :meth:`Inbox.join` raises :class:`HandlerError`.
* handler raises, ``dead-letter``: roll back, apply the batch again from memory with the
  failing message stored as a dead letter instead (its key parks from then on). A batch
  handler's failing message is found first, by bisection in savepoints.
* the fence moved (another consumer took a partition over): roll back, drop the partition,
  apply the rest of the batch again.
* the database fails: roll back, back off, read the checkpoints again (a commit whose
  outcome was lost may in fact have happened), and apply what lies past them again.

Kafka rebalance callbacks run on the worker thread, inside the poll: a revocation commits
the open batch first (the fence is still ours), an assignment claims the new partitions
(bumping their fences) and seeks to the offsets stored in the database. Kafka's own
committed offsets are written after each commit for monitoring only; they are never read.

This module keeps the lifecycle (start, stop, join, stats) and builds the bindings the
engine (:mod:`pyharvest.core.inbox.engine`) runs on: SQLAlchemy (:mod:`pyharvest.bindings.sql.inbox`)
and confluent-kafka (:mod:`pyharvest.bindings.kafka.inbox_consumer`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any

import sqlalchemy as sa

from pyharvest.bindings.sql.inbox.checkpoints import Checkpoints
from pyharvest.bindings.sql.inbox.database import SqlInboxDatabase
from pyharvest.bindings.sql.inbox.deadletters import DeadLetters
from pyharvest.bindings.sql.inbox.dedupe import Dedupe
from pyharvest.bindings.sql.inbox.tables import InboxTables
from pyharvest.core.inbox.engine import InboxEngine, InboxSettings
from pyharvest.core.inbox.errors import HandlerError, first_line
from pyharvest.core.inbox.message import InboxMessage
from pyharvest.core.inbox.ports import InboxConsumer, InboxPorts
from pyharvest.core.inbox.stats import InboxStats
from pyharvest.inbox.config import InboxConfig
from pyharvest.inbox.decoding import ValueDeserializer, decoding_batch_handler, decoding_handler

__all__ = ["BatchHandler", "Handler", "Inbox"]

#: ``handler(tx, message)``: apply ``message`` through ``tx`` (a Connection inside the
#: inbox's transaction: do not commit or roll back). Raise to reject the message.
Handler = Callable[[sa.Connection, InboxMessage], object]

#: ``batch_handler(tx, messages)``: apply ``messages`` (one transaction's, after dedupe, each
#: partition's in offset order) through ``tx``, as one would by applying them one after the
#: other. Raise to reject them: the inbox then finds the message that fails (applying parts
#: of the list in savepoints) and applies the rest without it.
BatchHandler = Callable[[sa.Connection, list[InboxMessage]], object]

log = logging.getLogger("pyharvest.inbox")


def _owner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Inbox:
    """Consumes ``config.topics`` and applies each message exactly once with ``handler``, or
    each transaction's messages at once with ``batch_handler`` (give one of the two).

    >>> with Inbox(config, apply_payment) as inbox:      # doctest: +SKIP
    ...     inbox.join()                                 # re-raises what stopped it
    >>> Inbox(config, batch_handler=apply_payments)      # doctest: +SKIP

    ``engine`` replaces the engine built from ``config.data_source``; ``consumer_factory``
    (for tests) builds the Kafka consumer from its configuration. ``value_deserializer`` (a
    confluent-kafka ``Deserializer``, e.g. ``AvroDeserializer(registry)``) decodes each value
    before the handler sees it; a value that does not decode is a poison message for the
    ``errorPolicy`` (:mod:`pyharvest.inbox.decoding`).
    """

    def __init__(
        self,
        config: InboxConfig,
        handler: Handler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        engine: sa.Engine | None = None,
        consumer_factory: Callable[[dict[str, object]], Any] | None = None,
        value_deserializer: ValueDeserializer | None = None,
    ) -> None:
        if (handler is None) == (batch_handler is None):
            raise TypeError(
                "give either handler(tx, message) or batch_handler=f with f(tx, messages), "
                f"not {'both' if handler is not None else 'neither'}"
            )
        if handler is not None and not callable(handler):
            raise TypeError(f"handler must be callable as handler(tx, message), got {handler!r}")
        if batch_handler is not None and not callable(batch_handler):
            raise TypeError(f"batch_handler must be callable as batch_handler(tx, messages), got {batch_handler!r}")
        self.config = config.resolve()
        if value_deserializer is not None:
            # The handler sees decoded values; one that does not decode fails the handler's call
            # (pyharvest.inbox.decoding), which the error policy handles as any poison message.
            if handler is not None:
                handler = decoding_handler(handler, value_deserializer)
            if batch_handler is not None:
                batch_handler = decoding_batch_handler(batch_handler, value_deserializer)
        self._handler = handler
        self._batch_handler = batch_handler
        self._external_engine = engine
        self._consumer_factory = consumer_factory
        self._owner = _owner_name()
        c = self.config
        self.tables = InboxTables.build(c.checkpoint_table, c.dedupe_table, c.dead_letter_table)
        self._checkpoints = Checkpoints(self.tables.checkpoint, c.group_id, self._owner)
        self._dedupe = Dedupe(self.tables.dedupe, c.group_id)
        self._dead_letters = DeadLetters(self.tables.dead_letter, c.group_id)

        # Built on the worker thread, so that what fails there is reported through join().
        self._engine: sa.Engine | None = None
        self._consumer: InboxConsumer | None = None
        self._inbox: InboxEngine | None = None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ public API

    def start(self) -> Inbox:
        if self._thread is not None:
            raise RuntimeError("this inbox was started already; create a new one")
        self._thread = threading.Thread(target=self._run, name="pyharvest-inbox", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the inbox to stop: the open batch commits, the consumer leaves its group."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the inbox stopped; True if it did (False on timeout). Re-raises the
        error that stopped it (:class:`HandlerError` under ``errorPolicy: stop``)."""
        if self._thread is None:
            raise RuntimeError("the inbox was not started")
        if not self._done.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def run(self) -> None:
        """Start and wait until stopped (by :meth:`stop` from another thread or a signal handler)."""
        self.start()
        while not self.join(0.5):
            pass

    @property
    def stats(self) -> InboxStats:
        """Counters since start (:class:`InboxStats`), a snapshot."""
        inbox = self._inbox
        return inbox.stats if inbox is not None else InboxStats()

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._done.is_set()

    def __enter__(self) -> Inbox:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
        if self._thread is not None:
            self._done.wait()
        if et is None and self._error is not None:
            raise self._error

    def __repr__(self) -> str:
        return f"Inbox(group={self.config.group_id!r}, topics={self.config.topics!r}, running={self.running})"

    # ------------------------------------------------------------------ worker thread

    def _run(self) -> None:
        try:
            self._setup().run()
        except BaseException as e:  # noqa: BLE001 - reported through join()
            self._error = e
            if isinstance(e, HandlerError):
                log.error("inbox stopped: %s", e)
            else:
                log.error("inbox stopped by %s: %s", type(e).__name__, first_line(e))
        finally:
            self._close()
            self._done.set()

    def _setup(self) -> InboxEngine:
        c = self.config
        if self._external_engine is not None:
            engine = self._external_engine
        else:
            from pyharvest.bindings.sql.connect import create_engine, resolve

            engine = create_engine(*resolve(c.data_source, c.binding))
        self._engine = engine
        if c.create_tables:
            self.tables.create(engine)
        from pyharvest.bindings.sql.component_grants import check_grants
        from pyharvest.plugins.api import dialect_of

        dialect = dialect_of(engine)
        if dialect is not None:  # a missing privilege fails here, named, not at the first message
            check_grants(engine, dialect, self.tables.grants(), "inbox")
        from pyharvest.bindings.kafka.inbox_consumer import ConfluentInboxConsumer

        consumer = self._consumer = ConfluentInboxConsumer(
            c.base_kafka_config, c.group_id, factory=self._consumer_factory
        )
        inbox = self._inbox = InboxEngine(
            InboxPorts(SqlInboxDatabase(engine), self._checkpoints, self._dedupe, self._dead_letters, consumer),
            self._handler,
            batch_handler=self._batch_handler,
            settings=self._settings(),
            stop=self._stop,
        )
        inbox.subscribe(c.topics)
        log.info("inbox %s consuming %s as %s", c.group_id, ", ".join(c.topics), self._owner)
        return inbox

    def _settings(self) -> InboxSettings:
        c, limits = self.config, self.config.limits
        return InboxSettings(
            error_policy=c.error_policy,
            dedupe_window=c.dedupe_window,
            prune_every=limits.prune_every_commits,  # type: ignore[arg-type]  # resolve() fills every limit in
            max_batch=limits.max_batch_size,  # type: ignore[arg-type]
            max_duration=limits.max_batch_duration,  # type: ignore[arg-type]
            poll=limits.poll_duration,  # type: ignore[arg-type]
            backoff=limits.io_error_backoff,  # type: ignore[arg-type]
            replay_interval=limits.replay_poll_interval,  # type: ignore[arg-type]
        )

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        inbox = self._inbox
        if inbox is not None:
            inbox.close()  # leaves the group; the revocation inside finds nothing open
        elif consumer is not None:
            consumer.close()
        if self._engine is not None and self._external_engine is None:
            self._engine.dispose()
        log.info("inbox %s stopped", self.config.group_id)
