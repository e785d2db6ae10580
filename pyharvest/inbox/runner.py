"""The inbox consumer: Kafka messages applied to a database exactly once.

One worker thread consumes a Kafka consumer group and applies messages in database
transactions of at most ``maxBatchSize`` messages and ``maxBatchDuration``. Each
transaction holds the handler's effects, the identities it applied (dedupe) and, last, the
fenced move of each partition's checkpoint (see :mod:`pyharvest.inbox.checkpoints`). So
either all of a batch happened and the offsets say so, or none of it did.

Failures and what they cost:

* handler raises, ``stop``: roll back, stop; :meth:`Inbox.join` raises :class:`HandlerError`.
* handler raises, ``dead-letter``: roll back, apply the batch again from memory with the
  failing message stored as a dead letter instead (its key parks from then on).
* the fence moved (another consumer took a partition over): roll back, drop the partition,
  apply the rest of the batch again.
* the database fails: roll back, back off, read the checkpoints again (a commit whose
  outcome was lost may in fact have happened), and apply what lies past them again.

Kafka rebalance callbacks run on the worker thread, inside ``consume()``: a revocation
commits the open batch first (the fence is still ours), an assignment claims the new
partitions (bumping their fences) and seeks to the offsets stored in the database. Kafka's
own committed offsets are written after each commit for monitoring only; they are never read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from pyharvest.inbox.checkpoints import Checkpoints, TopicPartition
from pyharvest.inbox.config import InboxConfig
from pyharvest.inbox.deadletters import DeadLetter, DeadLetters, describe_error, key_hash
from pyharvest.inbox.dedupe import Dedupe, Source
from pyharvest.inbox.errors import HandlerError, InboxError, first_line
from pyharvest.inbox.message import InboxMessage, delivery_id_for, source_identity
from pyharvest.inbox.tables import DEAD, PARKED, InboxTables

__all__ = ["Handler", "Inbox", "InboxStats"]

log = logging.getLogger("pyharvest.inbox")

#: ``handler(tx, message)``: apply ``message`` through ``tx`` (a Connection inside the
#: inbox's transaction: do not commit or roll back). Raise to reject the message.
Handler = Callable[[sa.Connection, InboxMessage], object]

_LATEST = ("latest", "largest", "end")


@dataclass(slots=True)
class InboxStats:
    """Counters since start; a snapshot (see :attr:`Inbox.stats`)."""

    applied: int = 0
    duplicates_dropped: int = 0
    dead_lettered: int = 0
    parked: int = 0
    replayed: int = 0
    commits: int = 0
    rollbacks: int = 0
    fence_rejections: int = 0
    database_errors: int = 0
    assigned: tuple[TopicPartition, ...] = ()


@dataclass(slots=True)
class _Owned:
    """A partition this consumer claimed."""

    fence: int
    committed: int | None  # next offset committed to the database (None: none yet)
    parked: set[str]  # key hashes with stored messages


@dataclass(slots=True)
class _Batch:
    """One open transaction and what it has done; discarded on rollback."""

    conn: sa.Connection
    txn: sa.RootTransaction
    started: float
    messages: list[InboxMessage] = field(default_factory=list)
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    seen: set[Source] = field(default_factory=set)
    identities: list[dict[str, object]] = field(default_factory=list)
    parked_added: dict[TopicPartition, set[str]] = field(default_factory=dict)
    applied: int = 0
    duplicates: int = 0
    dead: int = 0
    parked: int = 0


class _HandlerRaisedError(Exception):
    def __init__(self, message: InboxMessage, error: Exception) -> None:
        super().__init__(message, error)
        self.message = message
        self.error = error


def _connection_lost(e: BaseException) -> bool:
    """A handler error that is really the database going away: retried, never dead-lettered."""
    return isinstance(e, DBAPIError) and bool(e.connection_invalidated)


def _owner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Inbox:
    """Consumes ``config.topics`` and applies each message exactly once with ``handler``.

    >>> with Inbox(config, apply_payment) as inbox:      # doctest: +SKIP
    ...     inbox.join()                                 # re-raises what stopped it

    ``engine`` replaces the engine built from ``config.data_source``; ``consumer_factory``
    (for tests) builds the Kafka consumer from its configuration.
    """

    def __init__(
        self,
        config: InboxConfig,
        handler: Handler,
        *,
        engine: sa.Engine | None = None,
        consumer_factory: Callable[[dict[str, object]], Any] | None = None,
    ) -> None:
        if not callable(handler):
            raise TypeError(f"handler must be callable as handler(tx, message), got {handler!r}")
        self.config = config.resolve()
        self._handler = handler
        self._external_engine = engine
        self._consumer_factory = consumer_factory
        self._owner = _owner_name()
        c = self.config
        self.tables = InboxTables.build(c.checkpoint_table, c.dedupe_table, c.dead_letter_table)
        self._checkpoints = Checkpoints(self.tables.checkpoint, c.group_id, self._owner)
        self._dedupe = Dedupe(self.tables.dedupe, c.group_id)
        self._dead_letters = DeadLetters(self.tables.dead_letter, c.group_id)
        limits = c.limits
        self._max_batch: int = limits.max_batch_size  # type: ignore[assignment]
        self._max_duration: float = limits.max_batch_duration  # type: ignore[assignment]
        self._poll: float = limits.poll_duration  # type: ignore[assignment]
        self._backoff: float = limits.io_error_backoff  # type: ignore[assignment]
        self._replay_interval: float = limits.replay_poll_interval  # type: ignore[assignment]
        self._prune_every: int = limits.prune_every_commits  # type: ignore[assignment]

        self._engine: sa.Engine | None = None
        self._consumer: Any = None
        self._owned: dict[TopicPartition, _Owned] = {}
        self._position: dict[TopicPartition, int | None] = {}
        self._batch: _Batch | None = None
        self._redo: list[InboxMessage] = []
        self._forced_dead: dict[tuple[TopicPartition, int], str] = {}
        self._callback_error: BaseException | None = None
        self._last_replay_check = 0.0
        self._stats = InboxStats()
        self._stats_lock = threading.Lock()
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
        with self._stats_lock:
            return replace(self._stats, assigned=tuple(sorted(self._owned)))

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
            self._setup()
            while not self._stop.is_set():
                self._step()
            self._finish_batch()
        except BaseException as e:  # noqa: BLE001 - reported through join()
            self._error = e
            if isinstance(e, HandlerError):
                log.error("inbox stopped: %s", e)
            else:
                log.error("inbox stopped by %s: %s", type(e).__name__, first_line(e))
            self._abandon_batch()
        finally:
            self._close()
            self._done.set()

    def _setup(self) -> None:
        c = self.config
        if self._external_engine is not None:
            self._engine = self._external_engine
        else:
            from pyharvest.bindings.sql.connect import create_engine, resolve

            url, plugin = resolve(c.data_source, c.binding)
            self._engine = create_engine(url, plugin)
        if c.create_tables:
            self.tables.create(self._engine)
        conf: dict[str, object] = dict(c.base_kafka_config)
        conf.setdefault("auto.offset.reset", "earliest")
        conf.update(
            {
                "group.id": c.group_id,
                # Offsets live in the database; Kafka's are written for monitoring only.
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "logger": logging.getLogger("pyharvest.librdkafka"),
            }
        )
        self._initial_latest = str(conf["auto.offset.reset"]).lower() in _LATEST
        if self._consumer_factory is not None:
            self._consumer = self._consumer_factory(conf)
        else:
            from confluent_kafka import Consumer

            self._consumer = Consumer(conf)
        self._consumer.subscribe(
            list(c.topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        log.info("inbox %s consuming %s as %s", c.group_id, ", ".join(c.topics), self._owner)

    def _step(self) -> None:
        try:
            if self._redo:
                pending, self._redo = self._redo, []
                self._apply_with_policy(pending)
            batch = self._batch
            if batch is None:
                self._maybe_replay()
                want, timeout = self._max_batch, self._poll
            else:
                want = max(1, self._max_batch - len(batch.messages))
                timeout = max(0.0, batch.started + self._max_duration - time.monotonic())
            messages = self._consumer.consume(want, timeout)
            self._raise_callback_error()
            fresh = self._accept(messages)
            if fresh:
                self._apply_with_policy(fresh)
            batch = self._batch
            if batch is not None and (
                len(batch.messages) >= self._max_batch or time.monotonic() - batch.started >= self._max_duration
            ):
                self._commit()
        except SQLAlchemyError as e:
            self._recover(e)

    def _raise_callback_error(self) -> None:
        if self._callback_error is not None:
            e, self._callback_error = self._callback_error, None
            raise e

    def _accept(self, messages: Sequence[Any]) -> list[InboxMessage]:
        """Turn consumed messages into InboxMessages, dropping errors, partitions we do not
        own (any more) and anything before a partition's position."""
        from confluent_kafka import KafkaError

        out: list[InboxMessage] = []
        group = self.config.group_id
        owned = self._owned
        position = self._position
        for m in messages:
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise InboxError(f"fatal Kafka consumer error: {err}")
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("Kafka consumer error (retried): %s", err)
                continue
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            tp = (topic, partition)
            if tp not in owned:
                continue
            pos = position.get(tp)
            if pos is not None and offset < pos:
                continue
            position[tp] = offset + 1
            raw = m.headers()
            headers = tuple(raw) if raw else ()
            source = source_identity(headers) if headers else None
            ts_type, ts = m.timestamp()
            out.append(
                InboxMessage(
                    topic,
                    partition,
                    offset,
                    m.key(),
                    m.value(),
                    headers,
                    ts if ts_type else None,
                    source,
                    delivery_id_for(group, topic, partition, offset, source),
                )
            )
        return out

    # ------------------------------------------------------------------ applying

    def _begin(self) -> _Batch:
        assert self._engine is not None
        conn = self._engine.connect()
        try:
            txn = conn.begin()
        except BaseException:
            conn.close()
            raise
        self._batch = _Batch(conn, txn, time.monotonic())
        return self._batch

    def _apply_with_policy(self, messages: list[InboxMessage]) -> None:
        pending = messages
        while pending:
            batch = self._batch or self._begin()
            try:
                self._apply(batch, pending)
                return
            except _HandlerRaisedError as h:
                everything = batch.messages
                self._rollback()
                if self.config.error_policy == "stop":
                    raise HandlerError(h.message, h.error) from h.error
                m = h.message
                log.warning(
                    "handler failed on %s[%d]@%d (delivery %s): %s: %s; dead-lettered",
                    m.topic,
                    m.partition,
                    m.offset,
                    m.delivery_id,
                    type(h.error).__name__,
                    first_line(h.error),
                )
                self._forced_dead[((m.topic, m.partition), m.offset)] = describe_error(h.error)
                # Everything this batch held, again, in a new transaction: the effects of the
                # messages before the failing one were rolled back with it.
                pending = everything

    def _apply(self, batch: _Batch, messages: list[InboxMessage]) -> None:
        conn = batch.conn
        batch.messages.extend(messages)
        wanted = {m.source for m in messages if m.source is not None and m.source not in batch.seen}
        known = self._dedupe.applied(conn, wanted) if wanted else set()
        owned = self._owned
        handler = self._handler
        for m in messages:
            tp = (m.topic, m.partition)
            batch.positions[tp] = m.offset + 1
            source = m.source
            if source is not None and (source in batch.seen or source in known):
                batch.duplicates += 1
                continue
            if m.key is not None:
                parked, added = owned[tp].parked, batch.parked_added.get(tp)
                if parked or added:
                    kh = key_hash(m.key)
                    if kh in parked or (added is not None and kh in added):
                        self._dead_letters.store(conn, m, PARKED, None, kh)
                        batch.parked += 1
                        continue
            if self._forced_dead:
                error = self._forced_dead.get((tp, m.offset))
                if error is not None:
                    kh = key_hash(m.key)
                    self._dead_letters.store(conn, m, DEAD, error, kh)
                    if kh is not None:
                        batch.parked_added.setdefault(tp, set()).add(kh)
                    batch.dead += 1
                    continue
            try:
                handler(conn, m)
            except Exception as e:
                if _connection_lost(e):
                    raise
                raise _HandlerRaisedError(m, e) from e
            batch.applied += 1
            if source is not None:
                batch.seen.add(source)
                batch.identities.append(Dedupe.row(source, m.topic, m.partition, m.offset))

    def _commit(self) -> None:
        """Commit the open batch, fenced; on a moved fence drop the partition and retry the rest."""
        while (batch := self._batch) is not None:
            conn = batch.conn
            self._dedupe.remember(conn, batch.identities)
            lost = [
                tp
                for tp in sorted(batch.positions)
                if not self._checkpoints.advance(conn, tp, batch.positions[tp], self._owned[tp].fence)
            ]
            if lost:
                everything = batch.messages
                self._rollback()
                with self._stats_lock:
                    self._stats.fence_rejections += len(lost)
                self._drop(lost, "another consumer took it over (its fence moved); rolled back")
                self._apply_with_policy([m for m in everything if (m.topic, m.partition) in self._owned])
                continue
            commits = self._stats.commits + 1
            if commits % self._prune_every == 0:
                window = self.config.dedupe_window
                for tp, pos in batch.positions.items():
                    self._dedupe.prune(conn, tp[0], tp[1], pos - window)
            batch.txn.commit()
            conn.close()
            self._batch = None
            self._forced_dead.clear()
            for tp, pos in batch.positions.items():
                owned = self._owned[tp]
                owned.committed = pos
                owned.parked.update(batch.parked_added.get(tp, ()))
            with self._stats_lock:
                s = self._stats
                s.commits = commits
                s.applied += batch.applied
                s.duplicates_dropped += batch.duplicates
                s.dead_lettered += batch.dead
                s.parked += batch.parked
            self._commit_kafka(batch.positions)

    def _commit_kafka(self, positions: dict[TopicPartition, int]) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        try:
            self._consumer.commit(
                offsets=[KafkaTopicPartition(t, p, o) for (t, p), o in positions.items()], asynchronous=True
            )
        except KafkaException as e:  # monitoring only: never worth failing a batch for
            log.debug("Kafka offset commit (monitoring only) failed: %s", e)

    def _rollback(self) -> None:
        batch, self._batch = self._batch, None
        if batch is None:
            return
        with self._stats_lock:
            self._stats.rollbacks += 1
        try:
            batch.txn.rollback()
        except SQLAlchemyError as e:
            log.debug("rollback failed (the connection is gone; the database rolls back): %s", first_line(e))
        finally:
            with contextlib.suppress(SQLAlchemyError):
                batch.conn.close()

    def _abandon_batch(self) -> None:
        self._redo = []
        with contextlib.suppress(Exception):  # shutting down after an error already reported
            self._rollback()

    def _finish_batch(self) -> None:
        """On a graceful stop: commit what is open; if the database fails now, the messages
        are simply redelivered to the next owner."""
        try:
            if self._redo:
                pending, self._redo = self._redo, []
                self._apply_with_policy(pending)
            if self._batch is not None:
                self._commit()
        except SQLAlchemyError as e:
            log.warning("final commit failed, the next owner re-applies: %s", first_line(e))
            self._rollback()

    def _recover(self, error: SQLAlchemyError) -> None:
        """After a database error: roll back, wait, re-read the checkpoints and queue what lies
        past them to be applied again."""
        everything = self._batch.messages if self._batch is not None else []
        everything = everything + self._redo
        self._redo = []
        self._rollback()
        self._forced_dead.clear()  # a handler that failed because of the outage gets another go
        with self._stats_lock:
            self._stats.database_errors += 1
        log.warning("database error, retrying in %.1fs: %s: %s", self._backoff, type(error).__name__, first_line(error))
        assert self._engine is not None
        lost: list[TopicPartition] = []
        while not self._stop.wait(self._backoff):
            lost = []
            try:
                with self._engine.connect() as conn:
                    for tp, owned in self._owned.items():
                        claim = self._checkpoints.read(conn, tp)
                        if claim is None or claim.fence != owned.fence:
                            lost.append(tp)
                        else:
                            owned.committed = claim.next_offset
                break
            except SQLAlchemyError as e:
                log.warning("database still failing: %s", first_line(e))
        else:
            return  # stopping: nothing was committed, the next owner re-applies
        if lost:
            self._drop(lost, "its fence moved while the database was failing")
        keep = []
        for m in everything:
            owned_tp = self._owned.get((m.topic, m.partition))
            if owned_tp is not None and (owned_tp.committed is None or m.offset >= owned_tp.committed):
                keep.append(m)
        self._redo = keep

    # ------------------------------------------------------------------ partitions

    def _drop(self, tps: Iterable[TopicPartition], why: str) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        tps = [tp for tp in tps if tp in self._owned]
        for tp in tps:
            self._owned.pop(tp, None)
            self._position.pop(tp, None)
            log.warning("dropping partition %s[%d]: %s", tp[0], tp[1], why)
        self._redo = [m for m in self._redo if (m.topic, m.partition) in self._owned]
        if tps and self._consumer is not None:
            with contextlib.suppress(KafkaException):  # not assigned any more: nothing to pause
                self._consumer.pause([KafkaTopicPartition(t, p) for t, p in tps])

    def _claim(self, tps: list[TopicPartition]) -> dict[TopicPartition, _Owned]:
        assert self._engine is not None
        attempt = 0
        while True:
            try:
                with self._engine.begin() as conn:
                    claims = self._checkpoints.claim(conn, tps)
                    return {
                        tp: _Owned(c.fence, c.next_offset, self._dead_letters.parked_keys(conn, *tp))
                        for tp, c in claims.items()
                    }
            except SQLAlchemyError as e:
                attempt += 1
                # IntegrityError: a first claim raced another's; anything else: the database.
                log.warning("claiming partitions failed (attempt %d): %s", attempt, first_line(e))
                if self._stop.wait(min(self._backoff * attempt, 5.0)) or attempt >= 30:
                    raise

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END

        try:
            tps = [(p.topic, p.partition) for p in partitions]
            claimed = self._claim(tps) if tps else {}
            for p in partitions:
                tp = (p.topic, p.partition)
                owned = claimed[tp]
                self._owned[tp] = owned
                self._position[tp] = owned.committed
                # Seek to the database's offset; Kafka's committed offset is never consulted.
                if owned.committed is not None:
                    p.offset = owned.committed
                else:
                    p.offset = OFFSET_END if self._initial_latest else OFFSET_BEGINNING
            consumer.assign(partitions)
            if partitions:
                consumer.resume(partitions)
                log.info(
                    "assigned %s",
                    ", ".join(f"{p.topic}[{p.partition}]@{'start' if p.offset < 0 else p.offset}" for p in partitions),
                )
        except BaseException as e:  # noqa: BLE001 - re-raised on the worker thread after consume()
            # Fatal, never "retry": partitions we could not claim must not be consumed at all.
            self._callback_error = InboxError(f"cannot take partitions over: {type(e).__name__}: {first_line(e)}")
            self._callback_error.__cause__ = e

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        try:
            if self._batch is not None or self._redo:
                try:
                    # The fence is still ours: finish the batch rather than make the next owner redo it.
                    self._finish_open_work()
                except SQLAlchemyError as e:
                    log.warning("commit on revocation failed, the next owner re-applies: %s", first_line(e))
                    self._rollback()
                    self._redo = []
            self._forget([(p.topic, p.partition) for p in partitions])
            if partitions:
                log.info("revoked %s", ", ".join(f"{p.topic}[{p.partition}]" for p in partitions))
        except BaseException as e:  # noqa: BLE001
            self._callback_error = e
            self._rollback()

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        # The group moved on without us: our fences are (or soon will be) stale; commit nothing.
        self._rollback()
        self._redo = []
        self._forget([(p.topic, p.partition) for p in partitions])
        log.warning(
            "lost %s (session expired); uncommitted work rolled back",
            ", ".join(f"{p.topic}[{p.partition}]" for p in partitions),
        )

    def _finish_open_work(self) -> None:
        if self._redo:
            pending, self._redo = self._redo, []
            self._apply_with_policy(pending)
        if self._batch is not None:
            self._commit()

    def _forget(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self._owned.pop(tp, None)
            self._position.pop(tp, None)
        self._redo = [m for m in self._redo if (m.topic, m.partition) in self._owned]

    # ------------------------------------------------------------------ replay of dead letters

    def _maybe_replay(self) -> None:
        now = time.monotonic()
        if not self._owned or now - self._last_replay_check < self._replay_interval:
            return
        self._last_replay_check = now
        assert self._engine is not None
        with self._engine.connect() as conn:
            wanted = [(tp, kh) for tp in sorted(self._owned) for kh in self._dead_letters.requested(conn, *tp)]
        for tp, kh in wanted:
            if tp in self._owned and not self._stop.is_set():
                self._replay(tp, kh)

    def _replay(self, tp: TopicPartition, khash: str | None) -> None:
        """Apply a key's stored messages in order, in one fenced transaction (again without
        the failing one's effects, if one fails)."""
        assert self._engine is not None
        failure: tuple[int, str] | None = None
        while True:
            owned = self._owned.get(tp)
            if owned is None:
                return
            with self._engine.connect() as conn, conn.begin() as txn:
                if not self._checkpoints.verify(conn, tp, owned.fence):
                    txn.rollback()
                    self._drop([tp], "another consumer took it over (its fence moved)")
                    return
                letters = self._dead_letters.load(conn, tp[0], tp[1], khash)
                outcome = self._replay_letters(conn, letters, failure)
                if isinstance(outcome, tuple):  # the handler failed: try again without its effects
                    txn.rollback()
                    failure = outcome
                    continue
                txn.commit()
            if failure is None and khash is not None:
                owned.parked.discard(khash)
            with self._stats_lock:
                self._stats.replayed += outcome
            if failure is None:
                log.info("replayed %d stored message(s) of %s[%d]", outcome, tp[0], tp[1])
            else:
                log.warning("replay of %s[%d] stopped at a message that failed again; it is dead-lettered anew", *tp)
            return

    def _replay_letters(
        self, conn: sa.Connection, letters: list[DeadLetter], failure: tuple[int, str] | None
    ) -> int | tuple[int, str]:
        sources = {L.message.source for L in letters if L.message.source is not None}
        known = self._dedupe.applied(conn, sources) if sources else set()
        done: list[int] = []
        identities: list[dict[str, object]] = []
        applied = 0
        for i, letter in enumerate(letters):
            m = letter.message
            if failure is not None and i == failure[0]:
                self._dead_letters.fail_again(conn, letter, failure[1], [x.id for x in letters[i + 1 :]])
                break
            if m.source is not None and m.source in known:
                done.append(letter.id)
                continue
            try:
                self._handler(conn, m)
            except Exception as e:
                if _connection_lost(e):
                    raise
                log.warning("replayed message %r failed again: %s: %s", m, type(e).__name__, first_line(e))
                return (i, describe_error(e))
            done.append(letter.id)
            applied += 1
            if m.source is not None:
                known.add(m.source)
                identities.append(Dedupe.row(m.source, m.topic, m.partition, m.offset))
        self._dead_letters.delete(conn, done)
        self._dedupe.remember(conn, identities)
        return applied

    # ------------------------------------------------------------------ shutdown

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()  # leaves the group; on_revoke finds nothing open
            except Exception as e:  # noqa: BLE001
                log.debug("closing the consumer: %s", e)
        self._owned.clear()
        if self._engine is not None and self._external_engine is None:
            self._engine.dispose()
        log.info("inbox %s stopped", self.config.group_id)
