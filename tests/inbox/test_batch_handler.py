"""The batch handler, on a SQLite file with Kafka faked: one call per transaction with the
messages that passed dedupe and parking; a failing message found by bisection, dead-lettered
alone (its key parked), the rest applied once; ``stop`` names the message."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from pyharvest.errors import HandlerError
from pyharvest.inbox import InboxMessage
from tests.helpers.inbox.fakes import TOPIC, Stores, message, wire


@pytest.fixture
def stores(tmp_path) -> Stores:
    s = Stores.create(str(tmp_path / "inbox.db"))
    yield s
    s.engine.dispose()


def owning(parts, *partitions: int):
    parts.ports.consumer.rebalance("assign", [(TOPIC, p) for p in partitions])
    parts.ports.consumer.poll(1, 0)


class Recorder:
    """A batch handler that writes its rows first and then raises if one of them is bad, so
    a failure leaves effects that must be rolled back."""

    def __init__(self, stores: Stores, bad: tuple[bytes, ...] = (b"bad",)) -> None:
        self.stores = stores
        self.bad = bad
        self.calls: list[list[int]] = []

    def __call__(self, tx: sa.Connection, messages: list[InboxMessage]) -> None:
        self.calls.append([m.offset for m in messages])
        self.stores.record_all(tx, messages)
        for m in messages:
            if m.value in self.bad:
                raise RuntimeError(f"bad payload at {m.offset}")


def test_one_call_per_transaction_after_dedupe_and_in_order(stores):
    handler = Recorder(stores)
    parts = wire(stores, batch_handler=handler)
    owning(parts, 0, 1)
    b = parts.batches
    b.apply([message(0, source=("o", 1)), message(0, partition=1, source=("o", 2)), message(1, source=("o", 1))])
    b.apply([message(2, source=("o", 3)), message(1, partition=1)])
    assert handler.calls == [], "applied at commit, with the rest of the transaction's"
    b.commit()
    assert handler.calls == [[0, 0, 2, 1]], "the copy of ('o', 1) is dropped; each partition in offset order"
    assert stores.applied_offsets() == [0, 0, 2, 1]
    assert stores.identities() == [("o", 1), ("o", 2), ("o", 3)]
    assert stores.checkpoint(0) == (3, 1) and stores.checkpoint(1) == (2, 1)
    s = parts.counters.snapshot(())
    assert (s.commits, s.applied, s.duplicates_dropped, s.rollbacks) == (1, 4, 1, 0)
    b.apply([message(3, source=("o", 3)), message(4, source=("o", 4))])
    b.commit()
    assert handler.calls[-1] == [4], "identities committed before are dropped too"


def test_a_failing_message_is_dead_lettered_alone_and_its_key_parked(stores):
    handler = Recorder(stores)
    parts = wire(stores, batch_handler=handler, error_policy="dead-letter")
    owning(parts, 0)
    b = parts.batches
    batch = [message(i, "b" if i % 2 else "a", source=("o", i)) for i in range(16)]
    batch[5] = message(5, "b", b"bad", ("o", 5))  # key b: 7, 9, ... park behind it
    b.apply(batch)
    b.commit()
    assert stores.stored() == [("dead", 5)] + [("parked", i) for i in (7, 9, 11, 13, 15)]
    assert stores.applied_offsets() == [0, 1, 2, 3, 4, 6, 8, 10, 12, 14], "the rest applied, once each"
    assert ("o", 5) not in stores.identities() and ("o", 7) not in stores.identities()
    assert stores.checkpoint()[0] == 16
    s = parts.counters.snapshot(())
    assert (s.applied, s.dead_lettered, s.parked, s.commits) == (10, 1, 5, 1)
    assert handler.calls[0] == list(range(16)), "first the whole transaction at once"
    assert len(handler.calls) <= 2 + 2 * 4 + 1, "then halves to find it, then once more without it"
    # The key stays parked in later transactions; other keys flow.
    b.apply([message(16, "b"), message(17, "a")])
    b.commit()
    assert stores.stored()[-1] == ("parked", 16)
    assert stores.applied_offsets()[-1] == 17


def test_several_failing_messages_each_park_only_their_key(stores):
    handler = Recorder(stores)
    parts = wire(stores, batch_handler=handler, error_policy="dead-letter")
    owning(parts, 0)
    keys = ["a", "b", "c", "d"]
    batch = [message(i, keys[i % 4]) for i in range(12)]
    batch[2] = message(2, "c", b"bad")
    batch[9] = message(9, "b", b"bad")
    batch[11] = message(11, None, b"bad")  # no key: nothing to park behind it
    parts.batches.apply(batch)
    parts.batches.commit()
    assert stores.stored() == [("dead", 2), ("parked", 6), ("dead", 9), ("parked", 10), ("dead", 11)]
    assert stores.applied_offsets() == [0, 1, 3, 4, 5, 7, 8]


def test_stop_names_the_failing_message_and_commits_nothing(stores):
    handler = Recorder(stores)
    parts = wire(stores, batch_handler=handler)
    owning(parts, 0)
    parts.batches.apply([message(i, value=b"bad" if i == 6 else b"v") for i in range(10)])
    with pytest.raises(HandlerError, match="bad payload at 6") as raised:
        parts.batches.commit()
    assert raised.value.message.offset == 6 and isinstance(raised.value.__cause__, RuntimeError)
    assert parts.batches.open is None
    assert stores.applied_offsets() == [] and stores.checkpoint() == (None, 1)


def test_a_failure_that_does_not_come_back_commits_everything_once(stores):
    recorder = Recorder(stores)
    failed: list[int] = []

    def flaky(tx: sa.Connection, messages: list[InboxMessage]) -> None:
        recorder(tx, messages)
        if not failed:
            failed.append(1)
            raise RuntimeError("a passing failure")

    parts = wire(stores, batch_handler=flaky, error_policy="dead-letter")
    owning(parts, 0)
    parts.batches.apply([message(i) for i in range(5)])
    parts.batches.commit()
    assert stores.applied_offsets() == [0, 1, 2, 3, 4]
    assert stores.stored() == []
    assert stores.checkpoint()[0] == 5


def test_after_a_found_failure_the_next_batch_is_applied_at_once_again(stores):
    handler = Recorder(stores)
    parts = wire(stores, batch_handler=handler, error_policy="dead-letter")
    owning(parts, 0)
    parts.batches.apply([message(0, "a", b"bad"), message(1, "b")])
    parts.batches.commit()
    handler.calls.clear()
    parts.batches.apply([message(2, "c"), message(3, "d")])
    parts.batches.commit()
    assert handler.calls == [[2, 3]]


def test_a_lost_connection_in_the_batch_handler_is_not_its_failure(stores):
    lost = DBAPIError("SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True)

    def handler(tx, messages):
        raise lost

    parts = wire(stores, batch_handler=handler, error_policy="dead-letter")
    owning(parts, 0)
    parts.batches.apply([message(0)])
    with pytest.raises(DBAPIError):
        parts.batches.commit()
    assert stores.stored() == [], "never dead-lettered: recovery retries it"


def test_a_moved_fence_drops_the_partition_and_the_rest_is_applied_once(stores):
    handler = Recorder(stores)
    parts = wire(stores, batch_handler=handler)
    owning(parts, 0, 1)
    fence = stores.usurp(partition=0)
    parts.batches.apply([message(0, partition=0), message(0, partition=1, value=b"p1")])
    parts.batches.commit()
    assert stores.checkpoint(0) == (None, fence)
    assert stores.applied_offsets() == [0] and handler.calls[-1] == [0]
    assert stores.checkpoint(1)[0] == 1


def test_the_loop_drives_the_batch_handler(stores):
    handler = Recorder(stores)
    parts = wire(stores, batch_handler=handler, max_batch=3)
    parts.ports.consumer.rebalance("assign", [(TOPIC, 0)])
    parts.ports.consumer.deliver(*[message(i) for i in range(7)])
    for _ in range(4):
        parts.loop.step()
    parts.loop.finish()
    assert handler.calls == [[0, 1, 2], [3, 4, 5], [6]]
    assert stores.applied_offsets() == list(range(7))
