"""In-memory stand-ins for a database and Kafka, to test the engine's logic in isolation.

Everything the engine does against real systems is also tested against them; these fakes
exist to force the rare interleavings (failed deliveries, failed marks, lost heartbeats) on
demand and to observe invariants (in-flight counts per key) that a real broker cannot show.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from pyharvest.core.ports.kafka import DeliveryCallback, DeliveryError, KafkaConfigMap


class FakeBinding:
    """An outbox table in a dict, with the mark/purge/reset semantics of the real thing."""

    def __init__(self) -> None:
        self.rows: dict[int, OutboxRow] = {}
        self._next_id = 1
        self._lock = threading.Lock()
        self.fail_next_marks = 0
        self.marks = 0
        self.purge_calls = 0
        self.reset_calls = 0
        self.disposed = False
        self.quarantined: dict[str, tuple[int, str, int]] = {}

    def insert(self, topic: str, key: str, value: bytes | None = b"v", headers: Sequence[tuple[str, str | bytes]] = ()) -> int:
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            self.rows[rid] = OutboxRow(rid, topic, key, value, tuple(headers))
            return rid

    def mark(self, leader_id: str, limit: int):  # -> list[OutboxRecord]
        from pyharvest.core.outbox.records import OutboxRecord

        with self._lock:
            self.marks += 1
            if self.fail_next_marks:
                self.fail_next_marks -= 1
                # Like a real database, the mark may have committed before the error surfaced.
                for rid in sorted(self.rows)[:limit]:
                    self.rows[rid].leader_id = leader_id
                raise ConnectionError("database connection lost during mark")
            out = []
            for rid in sorted(self.rows):
                row = self.rows[rid]
                if row.key in self.quarantined:
                    continue
                if row.leader_id != leader_id:
                    row.leader_id = leader_id
                    out.append(
                        OutboxRecord(row.topic, row.key, row.value, row.headers, rid, row.create_time, leader_id)
                    )
                    if len(out) == limit:
                        break
            return out

    def purge(self, ids: Sequence[int]) -> int:
        with self._lock:
            self.purge_calls += 1
            return sum(1 for i in ids if self.rows.pop(i, None) is not None)

    def reset(self, ids: Sequence[int], leader_id: str | None = None) -> int:
        with self._lock:
            self.reset_calls += 1
            n = 0
            for i in ids:
                row = self.rows.get(i)
                if row is not None and (leader_id is None or row.leader_id == leader_id):
                    row.leader_id = None
                    n += 1
            return n

    def quarantine(self, entries) -> int:
        with self._lock:
            for e in entries:
                self.quarantined.setdefault(e.record.key, (e.record.id, e.error, e.attempts))
            return len(entries)

    def replay(self, key: str) -> None:
        with self._lock:
            del self.quarantined[key]

    def dispose(self) -> None:
        self.disposed = True

    def __len__(self) -> int:
        with self._lock:
            return len(self.rows)


@dataclass
class OutboxRow:
    id: int
    topic: str
    key: str
    value: bytes | None
    headers: tuple[tuple[str, str | bytes], ...]
    leader_id: str | None = None
    create_time: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


@dataclass
class Sent:
    topic: str
    key: str
    value: bytes | str | None
    headers: Sequence[tuple[str, str | bytes]]
    callback: DeliveryCallback
    partition: int | None


class FakeCluster:
    """Shared state of the fake producers and consumers: the topics' logs and the leader."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.logs: dict[str, list[tuple[str, bytes | str | None]]] = defaultdict(list)
        self.heartbeats = 0
        self.heartbeats_sent = 0  # counted as well when black-holed: the leader's loop went round
        self.polls = 0  # producer polls: a later event a test waits for before asserting absence
        self.heartbeats_pass = True  # False black-holes heartbeats (the leader should fence)
        self.fail: Callable[[Sent], DeliveryError | None] = lambda s: None
        self.in_flight_by_key: dict[str, int] = defaultdict(int)
        self.max_in_flight = 0
        self.max_in_flight_per_key = 0
        self.pending: list[Sent] = []
        self.abandoned: list[Sent] = []  # given up by the producer: failed at the next poll
        self.hold = False  # True keeps deliveries pending until released
        self.consumers: list[FakeLeaderConsumer] = []
        self.topics: set[str] = set()


class FakeProducer:
    def __init__(self, cluster: FakeCluster) -> None:
        self.c = cluster

    def produce(self, topic, key, value, headers, on_delivery, partition=None) -> None:
        c = self.c
        with c.lock:
            sent = Sent(topic, key, value, headers, on_delivery, partition)
            if partition == 0 and topic.endswith(".neli"):
                c.heartbeats_sent += 1
                if c.heartbeats_pass:
                    c.heartbeats += 1
                on_delivery(None)
                return
            c.pending.append(sent)
            c.in_flight_by_key[key] += 1
            c.max_in_flight_per_key = max(c.max_in_flight_per_key, c.in_flight_by_key[key])
            c.max_in_flight = max(c.max_in_flight, len(c.pending))

    def poll(self, timeout: float) -> int:
        c = self.c
        with c.lock:
            c.polls += 1
            purged, c.abandoned = c.abandoned, []
        for s in purged:
            with c.lock:
                c.in_flight_by_key[s.key] -= 1
            s.callback(DeliveryError("_PURGE_INFLIGHT", "Local: Purged in flight"))
        with c.lock:
            if c.hold or not c.pending:
                batch = []
            else:
                batch, c.pending = c.pending, []
        if not batch:
            if not purged:
                threading.Event().wait(min(timeout, 0.002))
            return len(purged)
        for s in batch:
            err = c.fail(s)
            with c.lock:
                c.in_flight_by_key[s.key] -= 1
                if err is None:
                    c.logs[s.topic].append((s.key, s.value))
            s.callback(err)
        return len(purged) + len(batch)

    def flush(self, timeout: float) -> int:
        self.poll(0)
        return len(self.c.pending)

    def abandon(self) -> None:
        # As librdkafka's purge: every pending message fails, reported by the next poll.
        c = self.c
        with c.lock:
            c.abandoned.extend(c.pending)
            c.pending = []

    def close(self) -> None:
        pass


class FakeLeaderConsumer:
    def __init__(self, cluster: FakeCluster) -> None:
        self.c = cluster
        self.on_assign: Callable[[list[int]], None] | None = None
        self.on_revoke: Callable[[list[int]], None] | None = None
        self.assigned = False
        self.seen = 0
        self.revoke_requested = False
        self.closed = False
        self.polls = 0  # the engine's loop went round (a later event to wait for)

    def subscribe(self, topic, on_assign, on_revoke) -> None:
        self.on_assign, self.on_revoke = on_assign, on_revoke
        self.c.consumers.append(self)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        if self.revoke_requested and self.assigned:
            self.revoke_requested = False
            self.assigned = False
            assert self.on_revoke is not None
            self.on_revoke([0])
            return 0
        if not self.assigned and self is self.c.consumers[0]:
            self.assigned = True
            assert self.on_assign is not None
            self.on_assign([0])
        with self.c.lock:
            new, self.seen = self.c.heartbeats - self.seen, self.c.heartbeats
        return new

    def close(self) -> None:
        self.closed = True
        if self.assigned and self.on_revoke is not None:
            self.assigned = False
            self.on_revoke([0])
        if self in self.c.consumers:
            self.c.consumers.remove(self)


class FakeKafka:
    def __init__(self) -> None:
        self.cluster = FakeCluster()

    def producer(self, config: KafkaConfigMap) -> FakeProducer:
        return FakeProducer(self.cluster)

    def leader_consumer(self, config: KafkaConfigMap) -> FakeLeaderConsumer:
        return FakeLeaderConsumer(self.cluster)

    def ensure_topic(self, config, topic, partitions=1, timeout=10.0) -> None:
        self.cluster.topics.add(topic)


def with_id(record, **changes):
    return replace(record, **changes)


class FakeTransactions:
    """A transaction coordinator: producer epochs per ``transactional.id``, and the records of
    committed transactions per (topic, partition). ``fail`` as in :class:`FakeCluster`;
    ``commit_error`` fails the next commit after (``"after"``) or before it took effect."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.epochs: dict[str, int] = defaultdict(int)
        self.committed: dict[tuple[str, int | None], list[tuple[str, bytes | str | None]]] = defaultdict(list)
        self.commits = 0
        self.aborts = 0
        self.commit_error: tuple[str, str] | None = None  # (kind, "before" | "after")
        self.hold_commit: threading.Event | None = None  # a commit waits for it to be set

    def records(self, topic: str) -> list[tuple[str, bytes | str | None]]:
        with self.lock:
            return [r for (t, _p), rs in sorted(self.committed.items(), key=lambda x: str(x[0])) if t == topic for r in rs]


class FakeTransactionalProducer(FakeProducer):
    def __init__(self, cluster: FakeCluster, txns: FakeTransactions, txn_id: str) -> None:
        super().__init__(cluster)
        self.txns = txns
        self.txn_id = txn_id
        self.epoch = -1
        self.open: list[Sent] | None = None
        self.commits = 0

    def _check(self) -> None:
        from pyharvest.core.ports.kafka import TransactionError

        if self.epoch != self.txns.epochs[self.txn_id]:
            raise TransactionError("fenced", "PRODUCER_FENCED: a newer producer has the transactional.id")

    def init_transactions(self, timeout: float) -> None:
        with self.txns.lock:
            self.txns.epochs[self.txn_id] += 1
            self.epoch = self.txns.epochs[self.txn_id]

    def begin_transaction(self) -> None:
        with self.txns.lock:
            self._check()
            self.open = []

    def produce(self, topic, key, value, headers, on_delivery, partition=None) -> None:
        sent = Sent(topic, key, value, headers, on_delivery, partition)
        err = self.c.fail(sent) if not topic.endswith(".progress") else None
        assert self.open is not None, "produce outside a transaction"
        self.open.append(sent)
        on_delivery(err)

    def flush(self, timeout: float) -> int:
        return 0

    def commit_transaction(self, timeout: float) -> None:
        from pyharvest.core.ports.kafka import TransactionError

        txns = self.txns
        if txns.hold_commit is not None:
            txns.hold_commit.wait(30)
        with txns.lock:
            error, txns.commit_error = txns.commit_error, None
            if error is not None and error[1] == "before":
                raise TransactionError(error[0], "injected before the commit")
            self._check()
            for s in self.open or []:
                txns.committed[(s.topic, s.partition)].append((s.key, s.value))
            txns.commits += 1
            self.commits += 1
            self.open = None
            if error is not None:
                raise TransactionError(error[0], "injected after the commit took effect")

    def abort_transaction(self, timeout: float) -> None:
        with self.txns.lock:
            self.open = None
            self.txns.aborts += 1

    def abandon(self) -> None:
        pass


class FakeTransactionalKafka(FakeKafka):
    def __init__(self) -> None:
        super().__init__()
        self.txns = FakeTransactions()
        self.producers: list[FakeTransactionalProducer] = []

    def transactional_producer(self, config: KafkaConfigMap) -> FakeTransactionalProducer:
        producer = FakeTransactionalProducer(self.cluster, self.txns, str(config["transactional.id"]))
        self.producers.append(producer)
        return producer

    def ensure_progress_topic(self, config, topic, partitions, timeout=10.0) -> None:
        self.cluster.topics.add(topic)

    def probe_transactions(self, config, topic, partition, timeout) -> None:
        pass

    def last_committed(self, config, topic, partition, timeout):
        with self.txns.lock:
            records = self.txns.committed.get((topic, partition), [])
            return records[-1][1] if records else None
