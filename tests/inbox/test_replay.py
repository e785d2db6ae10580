"""Replay of dead letters, on a SQLite file with Kafka faked: in order, fenced, once."""

from __future__ import annotations

import pytest

from pyharvest.inbox import request_replay
from tests.inbox.fakes import GROUP, TOPIC, Stores, message, wire


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
    parts.consumer.rebalance("assign", [(TOPIC, 0)])
    parts.consumer.poll(1, 0)
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
    assert parts.partitions.owned == {} and parts.consumer.paused == [(TOPIC, 0)]
    assert stores.stored() == [("dead", 1), ("parked", 3)], "the new owner replays them"
