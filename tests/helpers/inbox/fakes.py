"""Stand-ins for Kafka in the inbox's unit tests: a confluent-kafka ``Consumer`` (for the
adapter, and for a whole :class:`Inbox` without a broker) and the inbox's own consumer
protocol (for the parts behind it). A SQLite file stands in for nothing: the parts are
tested on a real database, only Kafka is faked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from confluent_kafka import KafkaError, TopicPartition

from pyharvest.bindings.sql.inbox.checkpoints import Checkpoints
from pyharvest.bindings.sql.inbox.database import SqlInboxDatabase
from pyharvest.bindings.sql.inbox.deadletters import DeadLetters
from pyharvest.bindings.sql.inbox.dedupe import Dedupe
from pyharvest.core.inbox.engine import InboxEngine, InboxSettings
from pyharvest.core.inbox.ports import InboxPorts, RebalanceListener
from pyharvest.inbox import OUTBOX_HEADER, RECORD_ID_HEADER, InboxMessage, InboxTables, delivery_id_for, source_identity

GROUP = "unit-group"
TOPIC = "unit-topic"


# ---------------------------------------------------------------------- confluent-kafka's Consumer


@dataclass
class FakeKafkaMessage:
    """The parts of ``confluent_kafka.Message`` the adapter reads."""

    _topic: str = TOPIC
    _partition: int = 0
    _offset: int = 0
    _key: bytes | None = None
    _value: bytes | None = None
    _headers: list[tuple[str, bytes]] | None = None
    _timestamp: tuple[int, int] = (1, 1_700_000_000_000)
    _error: KafkaError | None = None

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp


def kafka_message(partition: int = 0, offset: int = 0, key: str | None = "k", value: bytes = b"v", source=None):
    headers = None
    if source is not None:
        headers = [(OUTBOX_HEADER, source[0].encode()), (RECORD_ID_HEADER, str(source[1]).encode())]
    return FakeKafkaMessage(TOPIC, partition, offset, None if key is None else key.encode(), value, headers)


def kafka_error(code: int, fatal: bool = False) -> FakeKafkaMessage:
    return FakeKafkaMessage(_error=KafkaError(code, "fake", fatal=fatal))


class FakeConfluentConsumer:
    """Rebalances and messages are queued by the test and happen inside the next ``consume()``,
    on the calling thread, as librdkafka's do."""

    def __init__(self, conf: dict[str, object]) -> None:
        self.conf = conf
        self.topics: list[str] = []
        self.callbacks: dict[str, object] = {}
        self.pending: list[tuple[str, list[tuple[str, int]]] | list[FakeKafkaMessage]] = []
        self.assignment: list[tuple[str, int, int]] = []
        self.resumed: list[tuple[str, int]] = []
        self.paused: list[tuple[str, int]] = []
        self.commits: list[list[tuple[str, int, int]]] = []
        self.closed = False
        self.fail_pause: Exception | None = None
        self.fail_commit: Exception | None = None

    # what the test does
    def rebalance(self, event: str, partitions: Sequence[tuple[str, int]]) -> None:
        self.pending.append((event, list(partitions)))

    def deliver(self, *messages: FakeKafkaMessage) -> None:
        self.pending.append(list(messages))

    # confluent-kafka's API
    def subscribe(self, topics, on_assign=None, on_revoke=None, on_lost=None) -> None:
        self.topics = list(topics)
        self.callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeKafkaMessage]:
        while self.pending:
            item = self.pending.pop(0)
            if isinstance(item, tuple):
                event, tps = item
                self.callbacks[event](self, [TopicPartition(t, p) for t, p in tps])  # type: ignore[operator]
                continue
            batch, rest = item[:num_messages], item[num_messages:]
            if rest:
                self.pending.insert(0, rest)
            return batch
        return []

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assignment = [(p.topic, p.partition, p.offset) for p in partitions]

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.resumed.extend((p.topic, p.partition) for p in partitions)

    def pause(self, partitions: list[TopicPartition]) -> None:
        if self.fail_pause is not None:
            raise self.fail_pause
        self.paused.extend((p.topic, p.partition) for p in partitions)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        assert asynchronous
        if self.fail_commit is not None:
            raise self.fail_commit
        self.commits.append([(p.topic, p.partition, p.offset) for p in offsets])

    def close(self) -> None:
        if self.assignment and self.callbacks:
            self.callbacks["revoke"](self, [TopicPartition(t, p) for t, p, _ in self.assignment])  # type: ignore[operator]
        self.closed = True


# ---------------------------------------------------------------------- the inbox's consumer protocol


class FakeInboxConsumer:
    """:class:`~pyharvest.core.inbox.ports.InboxConsumer` over a script of rebalances and messages."""

    def __init__(self) -> None:
        self.listener: RebalanceListener | None = None
        self.pending: list[tuple[str, list[tuple[str, int]]] | list[InboxMessage]] = []
        self.starts: dict[tuple[str, int], int | None] = {}
        self.polls: list[tuple[int, float]] = []
        self.paused: list[tuple[str, int]] = []
        self.commits: list[dict[tuple[str, int], int]] = []
        self.closed = False

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        self.listener = listener

    def rebalance(self, event: str, partitions: Sequence[tuple[str, int]]) -> None:
        self.pending.append((event, list(partitions)))

    def deliver(self, *messages: InboxMessage) -> None:
        self.pending.append(list(messages))

    def poll(self, max_messages: int, timeout: float) -> list[InboxMessage]:
        self.polls.append((max_messages, timeout))
        while self.pending:
            item = self.pending.pop(0)
            if isinstance(item, tuple):
                event, tps = item
                assert self.listener is not None
                if event == "assign":
                    self.starts.update(self.listener.assigned(tps))
                elif event == "revoke":
                    self.listener.revoked(tps)
                else:
                    self.listener.lost(tps)
                continue
            batch, rest = item[:max_messages], item[max_messages:]
            if rest:
                self.pending.insert(0, rest)
            return batch
        return []

    def pause(self, partitions: list[tuple[str, int]]) -> None:
        self.paused.extend(partitions)

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        self.commits.append(dict(positions))

    def close(self) -> None:
        self.closed = True


# ---------------------------------------------------------------------- messages and tables


def message(offset: int, key: str | None = "k", value: bytes = b"v", source=None, partition: int = 0) -> InboxMessage:
    """An InboxMessage as the adapter builds it; ``source`` as ``("outbox", record_id)``."""
    headers: tuple[tuple[str, bytes | None], ...] = ()
    if source is not None:
        headers = ((OUTBOX_HEADER, source[0].encode()), (RECORD_ID_HEADER, str(source[1]).encode()))
    src = source_identity(headers)
    return InboxMessage(
        TOPIC,
        partition,
        offset,
        None if key is None else key.encode(),
        value,
        headers,
        None,
        src,
        delivery_id_for(GROUP, TOPIC, partition, offset, src),
    )


@dataclass
class Stores:
    """The inbox's tables on a SQLite file, and the accessors the parts use."""

    engine: sa.Engine
    tables: InboxTables
    checkpoints: Checkpoints
    dedupe: Dedupe
    dead_letters: DeadLetters
    applied: sa.Table

    @classmethod
    def create(cls, path: str, owner: str = "me") -> Stores:
        engine = sa.create_engine(f"sqlite:///{path}")
        tables = InboxTables.build("unit_cp", "unit_dd", "unit_dl")
        tables.create(engine)
        applied = sa.Table(
            "unit_applied",
            sa.MetaData(),
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("kafka_offset", sa.BigInteger, nullable=False),
            sa.Column("msg_value", sa.String(100), nullable=True),
        )
        applied.metadata.create_all(engine)
        return cls(
            engine,
            tables,
            Checkpoints(tables.checkpoint, GROUP, owner),
            Dedupe(tables.dedupe, GROUP),
            DeadLetters(tables.dead_letter, GROUP),
            applied,
        )

    def record(self, tx: sa.Connection, m: InboxMessage) -> None:
        """A handler: one row per applied message."""
        tx.execute(
            sa.insert(self.applied), {"kafka_offset": m.offset, "msg_value": m.value.decode() if m.value else None}
        )

    def record_all(self, tx: sa.Connection, messages: list[InboxMessage]) -> None:
        """A batch handler: one row per message, in one executemany."""
        tx.execute(
            sa.insert(self.applied),
            [{"kafka_offset": m.offset, "msg_value": m.value.decode() if m.value else None} for m in messages],
        )

    def applied_offsets(self) -> list[int]:
        with self.engine.connect() as c:
            return [r[0] for r in c.execute(sa.select(self.applied.c.kafka_offset).order_by(self.applied.c.id))]

    def checkpoint(self, partition: int = 0) -> tuple[int | None, int] | None:
        with self.engine.connect() as c:
            claim = self.checkpoints.read(c, (TOPIC, partition))
        return None if claim is None else (claim.next_offset, claim.fence)

    def usurp(self, partition: int = 0) -> int:
        """Another consumer claims the partition (bumping its fence); returns the new fence."""
        with self.engine.begin() as c:
            claims = Checkpoints(self.tables.checkpoint, GROUP, "usurper").claim(c, [(TOPIC, partition)])
        return claims[(TOPIC, partition)].fence

    def stored(self) -> list[tuple[str, int]]:
        dl = self.tables.dead_letter
        with self.engine.connect() as c:
            return [tuple(r) for r in c.execute(sa.select(dl.c.status, dl.c.kafka_offset).order_by(dl.c.id))]

    def identities(self) -> list[tuple[str, int]]:
        dd = self.tables.dedupe
        with self.engine.connect() as c:
            return sorted(tuple(r) for r in c.execute(sa.select(dd.c.outbox, dd.c.record_id)))


# ---------------------------------------------------------------------- the inbox's engine on these


def wire(
    stores: Stores,
    handler=None,
    *,
    batch_handler=None,
    error_policy: str = "stop",
    max_batch: int = 100,
    max_duration: float = 60.0,
    prune_every: int = 100,
    dedupe_window: int = 100_000,
    backoff: float = 0.01,
) -> InboxEngine:
    """The engine as :class:`~pyharvest.inbox.Inbox` wires it, on the SQLite file and a fake consumer."""
    if batch_handler is None:
        handler = handler or stores.record
    ports = InboxPorts(
        SqlInboxDatabase(stores.engine), stores.checkpoints, stores.dedupe, stores.dead_letters, FakeInboxConsumer()
    )
    settings = InboxSettings(
        error_policy=error_policy,
        dedupe_window=dedupe_window,
        prune_every=prune_every,
        max_batch=max_batch,
        max_duration=max_duration,
        poll=0.0,
        backoff=backoff,
        replay_interval=0.0,
    )
    engine = InboxEngine(ports, handler, batch_handler=batch_handler, settings=settings)
    engine.subscribe([TOPIC])
    return engine
