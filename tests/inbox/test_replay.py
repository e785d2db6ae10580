"""Replay of dead letters, on a SQLite file with Kafka faked: in order, fenced, once."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from pyharvest.inbox import request_replay
from tests.helpers.inbox.fakes import GROUP, TOPIC, Stores, message, wire


@pytest.fixture
def stores(tmp_path) -> Stores:
    s = Stores.create(str(tmp_path / "inbox.db"))
    yield s
    s.engine.dispose()


@pytest.fixture
def broken() -> dict[bytes, bool]:
    return {b"bad": True}


def dead_lettered(stores: Stores, broken: dict[bytes, bool]):
    """An inbox that dead-lettered offset 1 (key a) and parked offset 3 behind it."""

    def handler(tx, m):
        if broken.get(m.value):
            raise RuntimeError("bad payload")
        stores.record(tx, m)

    parts = wire(stores, handler, error_policy="dead-letter")
    parts.ports.consumer.rebalance("assign", [(TOPIC, 0)])
    parts.ports.consumer.poll(1, 0)
    parts.batches.apply(
        [message(0, "a", source=("o", 1)), message(1, "a", b"bad", ("o", 2)), message(2, "b"), message(3, "a", b"ok")]
    )
    parts.batches.commit()
    assert stores.stored() == [("dead", 1), ("parked", 3)]
    return parts


def ask(stores: Stores, key: bytes | None = None) -> int:
    with stores.engine.begin() as c:
        return request_replay(c, stores.tables.dead_letter, GROUP, key=key)


def test_nothing_happens_until_an_operator_asks(stores, broken):
    parts = dead_lettered(stores, broken)
    broken[b"bad"] = False
    parts.replayer.maybe_replay()
    assert stores.stored() == [("dead", 1), ("parked", 3)]


def test_a_key_is_replayed_in_order_and_unparked(stores, broken):
    parts = dead_lettered(stores, broken)
    broken[b"bad"] = False
    assert ask(stores, b"a") == 2
    parts.replayer.maybe_replay()
    assert stores.stored() == []
    assert stores.applied_offsets() == [0, 2, 1, 3]
    assert ("o", 2) in stores.identities(), "a later republished copy is recognised"
    assert parts.partitions.owned[(TOPIC, 0)].parked == set()
    assert parts.counters.snapshot(()).replayed == 2
    parts.batches.apply([message(4, "a"), message(5, "a", source=("o", 2))])
    parts.batches.commit()
    assert stores.applied_offsets() == [0, 2, 1, 3, 4], "the key flows again; the copy is dropped"


def test_a_message_failing_again_becomes_the_new_dead_letter(stores, broken):
    parts = dead_lettered(stores, broken)
    assert ask(stores, b"a") == 2
    parts.replayer.maybe_replay()
    assert stores.stored() == [("dead", 1), ("parked", 3)]
    assert stores.applied_offsets() == [0, 2]
    assert parts.partitions.owned[(TOPIC, 0)].parked, "the key stays parked"
    parts.replayer.maybe_replay()
    assert parts.counters.snapshot(()).replayed == 0, "the request was cleared: no retry loop"


def test_a_replay_under_a_moved_fence_drops_the_partition(stores, broken):
    parts = dead_lettered(stores, broken)
    broken[b"bad"] = False
    ask(stores, b"a")
    stores.usurp()
    parts.replayer.maybe_replay()
    assert parts.partitions.owned == {} and parts.ports.consumer.paused == [(TOPIC, 0)]
    assert stores.stored() == [("dead", 1), ("parked", 3)], "the new owner replays them"


def batch_dead_lettered(stores: Stores, broken: dict[bytes, bool], calls: list[list[int]]):
    """As :func:`dead_lettered`, with a batch handler, and a third message of key a (offset 4)
    parked behind the dead letter."""

    def handler(tx, messages):
        calls.append([m.offset for m in messages])
        stores.record_all(tx, messages)  # effects first: a failure must roll them back
        if any(broken.get(m.value) for m in messages):
            raise RuntimeError("bad payload")

    parts = wire(stores, batch_handler=handler, error_policy="dead-letter")
    parts.ports.consumer.rebalance("assign", [(TOPIC, 0)])
    parts.ports.consumer.poll(1, 0)
    parts.batches.apply(
        [
            message(0, "a", source=("o", 1)),
            message(1, "a", b"bad", ("o", 2)),
            message(2, "b"),
            message(3, "a", b"ok"),
            message(4, "a", b"worse", ("o", 4)),
        ]
    )
    parts.batches.commit()
    assert stores.stored() == [("dead", 1), ("parked", 3), ("parked", 4)]
    calls.clear()
    return parts


def test_a_batch_handler_replays_a_key_in_one_call(stores, broken):
    calls: list[list[int]] = []
    parts = batch_dead_lettered(stores, broken, calls)
    broken[b"bad"] = False
    assert ask(stores, b"a") == 3
    parts.replayer.maybe_replay()
    assert calls == [[1, 3, 4]]
    assert stores.stored() == []
    assert stores.applied_offsets() == [0, 2, 1, 3, 4]
    assert {("o", 2), ("o", 4)} <= set(stores.identities())
    assert parts.partitions.owned[(TOPIC, 0)].parked == set()


def test_a_batch_replay_failing_again_keeps_those_before_and_dead_letters_the_failing_one(stores, broken):
    calls: list[list[int]] = []
    parts = batch_dead_lettered(stores, broken, calls)
    broken.update({b"bad": False, b"worse": True})
    ask(stores, b"a")
    parts.replayer.maybe_replay()
    assert stores.applied_offsets() == [0, 2, 1, 3], "those before the failing one applied, once"
    assert stores.stored() == [("dead", 4)]
    with stores.engine.connect() as c:
        dl = stores.tables.dead_letter
        assert not c.execute(sa.select(dl.c.replay_requested)).scalar_one(), "the request is cleared"
    assert parts.partitions.owned[(TOPIC, 0)].parked, "the key stays parked"
    assert calls[0] == [1, 3, 4] and calls[-1] == [1, 3], "found by halves, then applied without it"
    parts.replayer.maybe_replay()
    assert parts.counters.snapshot(()).replayed == 2, "the request was cleared: no retry loop"
