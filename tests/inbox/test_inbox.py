"""The inbox on real databases and a real broker: fences, restarts, duplicates,
dead letters and the ``stop`` policy, one behaviour per test."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition

from pyharvest.bindings.sql.inbox.checkpoints import Checkpoints
from pyharvest.errors import HandlerError
from pyharvest.inbox import Inbox, InboxMessage, InboxTables, delivery_id_for, request_replay
from tests.helpers.inbox.tools import applied_table, identity, inbox_config, produce, recording_handler, rows
from tests.helpers.topics import create_topic
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


@pytest.fixture
def engine(database_url: str):
    e = sa.create_engine(database_url)
    yield e
    e.dispose()


@pytest.fixture
def applied(engine: sa.Engine, table_name: str) -> sa.Table:
    t = applied_table(f"{table_name}_applied")
    t.metadata.create_all(engine)
    InboxTables.build(f"{table_name}_cp", f"{table_name}_dd", f"{table_name}_dl").create(engine)
    return t


@pytest.fixture
def topic(kafka_bootstrap: str, topic_name: str) -> str:
    create_topic(kafka_bootstrap, topic_name, partitions=1)
    return topic_name


def checkpoint(engine: sa.Engine, table_name: str, group: str) -> tuple[int | None, int] | None:
    cp = InboxTables.build(f"{table_name}_cp", f"{table_name}_dd", f"{table_name}_dl").checkpoint
    with engine.connect() as c:
        r = c.execute(sa.select(cp.c.next_offset, cp.c.fence).where(cp.c.group_id == group)).one_or_none()
    return None if r is None else (r[0], r[1])


def test_applies_each_message_once_and_drops_republished_copies(
    kafka_config, kafka_bootstrap, database_url, table_name, engine, applied, topic
):
    produce(
        kafka_bootstrap,
        topic,
        [
            ("a", b"1", identity("g/outbox", 1)),
            ("b", b"2", identity("g/outbox", 2)),
            ("a", b"3", identity("g/outbox", 3)),
            ("b", b"2", identity("g/outbox", 2)),  # the harvester published record 2 twice
            ("c", b"4", []),  # not from a harvester: offset identity
            ("a", b"1", identity("g/other", 1)),  # same record id, another outbox: not a copy
        ],
    )
    config = inbox_config(kafka_config, database_url, topic, table_name)
    with Inbox(config, recording_handler(applied)) as inbox:
        wait_until(lambda: (checkpoint(engine, table_name, config.group_id) or (None,))[0] == 6, 30, "offset 6 committed")
        # The counters move just after the database commit the checkpoint shows.
        wait_until(lambda: inbox.stats.applied + inbox.stats.duplicates_dropped >= 6, 5, "the commit's counters")
        stats = inbox.stats
    got = rows(engine, applied)
    assert [(o, k, v) for o, k, v, _ in got] == [
        (0, "a", "1"),
        (1, "b", "2"),
        (2, "a", "3"),
        (4, "c", "4"),
        (5, "a", "1"),
    ]
    assert stats.applied == 5 and stats.duplicates_dropped == 1
    g = config.group_id
    assert [d for *_, d in got] == [
        delivery_id_for(g, topic, 0, 0, ("g/outbox", 1)),
        delivery_id_for(g, topic, 0, 1, ("g/outbox", 2)),
        delivery_id_for(g, topic, 0, 2, ("g/outbox", 3)),
        delivery_id_for(g, topic, 0, 4, None),
        delivery_id_for(g, topic, 0, 5, ("g/other", 1)),
    ]
    # The delivery id of a republished copy is its original's.
    assert delivery_id_for(g, topic, 0, 3, ("g/outbox", 2)) == got[1][3]


def test_restart_resumes_from_database_offsets_not_kafkas(
    kafka_config, kafka_bootstrap, database_url, table_name, engine, applied, topic
):
    produce(kafka_bootstrap, topic, [("k", str(i).encode(), []) for i in range(5)])
    config = inbox_config(kafka_config, database_url, topic, table_name)
    handler = recording_handler(applied)
    with Inbox(config, handler):
        wait_until(lambda: len(rows(engine, applied)) == 5, 30, "5 applied")
    assert checkpoint(engine, table_name, config.group_id)[0] == 5
    produce(kafka_bootstrap, topic, [("k", str(i).encode(), []) for i in range(5, 8)])
    with Inbox(config, handler):
        wait_until(lambda: len(rows(engine, applied)) == 8, 30, "8 applied")
    assert [r[0] for r in rows(engine, applied)] == list(range(8)), "each offset exactly once across the restart"
    # Kafka's committed offset (monitoring) says 8; the database is made to say 6: the next
    # consumer must follow the database.
    kafka_committed = (
        Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": config.group_id})
        .committed([TopicPartition(topic, 0)], timeout=10)[0]
        .offset
    )
    assert kafka_committed == 8
    cp = InboxTables.build(f"{table_name}_cp", f"{table_name}_dd", f"{table_name}_dl").checkpoint
    with engine.begin() as c:
        c.execute(sa.update(cp).where(cp.c.group_id == config.group_id).values(next_offset=6))
    with Inbox(config, handler):
        wait_until(lambda: len(rows(engine, applied)) == 10, 30, "offsets 6 and 7 again")
    assert [r[0] for r in rows(engine, applied)] == [*range(8), 6, 7]


def test_fence_rejects_a_zombie_commit(kafka_config, kafka_bootstrap, database_url, table_name, engine, applied, topic):
    produce(kafka_bootstrap, topic, [("k", b"0", []), ("k", b"1", [])])
    config = inbox_config(kafka_config, database_url, topic, table_name)
    entered, release = threading.Event(), threading.Event()
    record = recording_handler(applied)

    def handler(tx: sa.Connection, m: InboxMessage) -> None:
        # Wait before writing: SQLite's single writer lock would otherwise make the usurper
        # wait for this transaction (a correct order too, but not the one under test).
        if m.offset == 0 and not release.is_set():
            entered.set()
            release.wait(30)
        record(tx, m)

    inbox = Inbox(config, handler).start()
    try:
        assert entered.wait(30), "the handler never ran"
        # Another consumer takes the partition over while this one is mid-transaction (as after
        # a rebalance this one has not noticed): it bumps the fence.
        fence_before = checkpoint(engine, table_name, config.group_id)[1]
        with engine.begin() as c:
            claims = Checkpoints(inbox.tables.checkpoint, config.group_id, "usurper").claim(c, [(topic, 0)])
        assert claims[(topic, 0)].fence == fence_before + 1
        release.set()
        wait_until(lambda: inbox.stats.fence_rejections >= 1, 30, "the zombie's commit to be refused")
        assert (topic, 0) not in inbox.stats.assigned
    finally:
        release.set()
        inbox.stop()
        inbox.join(30)
    assert rows(engine, applied) == [], "the zombie's effects must not commit"
    assert checkpoint(engine, table_name, config.group_id) == (None, fence_before + 1)


def test_checkpoint_fence_on_the_database(database_url, table_name, engine):
    tables = InboxTables.build(f"{table_name}_cp", f"{table_name}_dd", f"{table_name}_dl")
    tables.create(engine)
    a, b = (Checkpoints(tables.checkpoint, "g", n) for n in ("a", "b"))
    with engine.begin() as c:
        fa = a.claim(c, [("t", 0)])[("t", 0)].fence
    with engine.begin() as c:
        assert a.advance(c, ("t", 0), 10, fa)
    with engine.begin() as c:
        claim_b = b.claim(c, [("t", 0)])[("t", 0)]
    assert claim_b.next_offset == 10 and claim_b.fence == fa + 1
    with engine.connect() as c, c.begin():
        assert not a.advance(c, ("t", 0), 20, fa), "the old owner's fence no longer holds"
    with engine.begin() as c:
        assert b.advance(c, ("t", 0), 12, claim_b.fence)
        assert b.read(c, ("t", 0)).next_offset == 12


def test_handler_error_with_stop_rolls_back_and_surfaces(
    kafka_config, kafka_bootstrap, database_url, table_name, engine, applied, topic
):
    produce(kafka_bootstrap, topic, [("k", str(i).encode(), []) for i in range(3)])
    config = inbox_config(kafka_config, database_url, topic, table_name, limits=None)
    record = recording_handler(applied)
    applied_before_failure = []

    def failing(tx: sa.Connection, m: InboxMessage) -> None:
        record(tx, m)
        applied_before_failure.append(m.offset)
        if m.offset == 2:
            raise ValueError("cannot apply 2")

    inbox = Inbox(config, failing).start()
    with pytest.raises(HandlerError, match="cannot apply 2") as raised:
        inbox.join(60)
    assert raised.value.message.offset == 2 and isinstance(raised.value.__cause__, ValueError)
    assert applied_before_failure[-1] == 2
    assert rows(engine, applied) == [], "nothing of the failing transaction commits"
    assert (checkpoint(engine, table_name, config.group_id) or (None,))[0] in (None, 0)
    with Inbox(config, record):
        wait_until(lambda: len(rows(engine, applied)) == 3, 30, "all three after the fix")
    assert [r[0] for r in rows(engine, applied)] == [0, 1, 2]


BROKEN = {"fixed": False}


def test_dead_letter_parks_the_key_and_replays_in_order(
    kafka_config, kafka_bootstrap, database_url, table_name, engine, applied, topic
):
    produce(
        kafka_bootstrap,
        topic,
        [
            ("k1", b"ok1", identity("g/o", 1)),
            ("k1", b"bad", identity("g/o", 2)),
            ("k2", b"ok3", identity("g/o", 3)),
            ("k1", b"ok2", identity("g/o", 4)),  # parked behind 'bad'
            ("k1", b"bad", identity("g/o", 2)),  # a republished copy of the dead letter: parked too
            ("k2", b"ok4", identity("g/o", 5)),
        ],
    )
    config = inbox_config(kafka_config, database_url, topic, table_name, error_policy="dead-letter")
    record = recording_handler(applied)

    def handler(tx: sa.Connection, m: InboxMessage) -> None:
        if m.value == b"bad" and not BROKEN["fixed"]:
            raise RuntimeError("bad payload")
        record(tx, m)

    dl = InboxTables.build(f"{table_name}_cp", f"{table_name}_dd", f"{table_name}_dl").dead_letter

    def stored() -> list[tuple[str, str, int]]:
        with engine.connect() as c:
            return [
                tuple(r) for r in c.execute(sa.select(dl.c.status, dl.c.msg_value, dl.c.kafka_offset).order_by(dl.c.id))
            ]

    with Inbox(config, handler) as inbox:
        wait_until(lambda: (checkpoint(engine, table_name, config.group_id) or (None,))[0] == 6, 30, "all consumed")
        assert [(k, v) for _, k, v, _ in rows(engine, applied)] == [("k1", "ok1"), ("k2", "ok3"), ("k2", "ok4")]
        assert [(s, bytes(v), o) for s, v, o in stored()] == [
            ("dead", b"bad", 1),
            ("parked", b"ok2", 3),
            ("parked", b"bad", 4),
        ]
        with engine.connect() as c:
            assert "bad payload" in c.execute(sa.select(dl.c.error).where(dl.c.status == "dead")).scalar_one()
        wait_until(lambda: inbox.stats.dead_lettered + inbox.stats.parked >= 3, 5, "the commit's counters")
        stats = inbox.stats
        assert (stats.dead_lettered, stats.parked) == (1, 2)
        # The operator fixes the handler and asks for a replay; the owner applies k1's stored
        # messages in order, drops the stored copy of 'bad', and un-parks the key.
        BROKEN["fixed"] = True
        with engine.begin() as c:
            assert request_replay(c, dl, config.group_id, key=b"k1") == 3
        wait_until(lambda: stored() == [], 30, "the replay")
        produce(kafka_bootstrap, topic, [("k1", b"ok5", identity("g/o", 6))])
        wait_until(lambda: len(rows(engine, applied)) == 6, 30, "k1 flowing again")
    BROKEN["fixed"] = False
    assert [(k, v) for _, k, v, _ in rows(engine, applied)] == [
        ("k1", "ok1"),
        ("k2", "ok3"),
        ("k2", "ok4"),
        ("k1", "bad"),
        ("k1", "ok2"),
        ("k1", "ok5"),
    ]
