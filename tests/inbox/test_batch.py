"""The batch, on a SQLite file with Kafka faked: effects, identities and fenced checkpoints
commit together or not at all; the error policies; a moved fence."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from pyharvest.errors import HandlerError
from tests.helpers.inbox.fakes import TOPIC, Stores, message, wire


@pytest.fixture
def stores(tmp_path) -> Stores:
    s = Stores.create(str(tmp_path / "inbox.db"))
    yield s
    s.engine.dispose()


def owning(parts, *partitions: int):
    parts.ports.consumer.rebalance("assign", [(TOPIC, p) for p in partitions])
    parts.ports.consumer.poll(1, 0)


def test_effects_identities_and_checkpoint_commit_together(stores):
    parts = wire(stores)
    owning(parts, 0)
    b = parts.batches
    b.apply([message(0, source=("o", 1)), message(1, source=("o", 2)), message(2)])
    assert stores.applied_offsets() == [], "nothing is visible before the commit"
    assert stores.checkpoint() == (None, 1)
    b.commit()
    assert b.open is None
    assert stores.applied_offsets() == [0, 1, 2]
    assert stores.identities() == [("o", 1), ("o", 2)]
    assert stores.checkpoint() == (3, 1)
    assert parts.partitions.owned[(TOPIC, 0)].committed == 3
    assert parts.ports.consumer.commits == [{(TOPIC, 0): 3}], "Kafka's offsets follow the database commit"
    s = parts.counters.snapshot(())
    assert (s.commits, s.applied, s.rollbacks) == (1, 3, 0)


def test_republished_copies_are_dropped_within_and_across_batches(stores):
    parts = wire(stores)
    owning(parts, 0)
    b = parts.batches
    b.apply([message(0, source=("o", 1)), message(1, source=("o", 1))])
    b.commit()
    b.apply([message(2, source=("o", 1)), message(3, source=("p", 1))])
    b.commit()
    assert stores.applied_offsets() == [0, 3]
    s = parts.counters.snapshot(())
    assert (s.applied, s.duplicates_dropped) == (2, 2)
    assert stores.checkpoint()[0] == 4, "dropped copies still move the checkpoint"


def test_stop_policy_rolls_everything_back_and_raises(stores):
    def failing(tx, m):
        stores.record(tx, m)
        if m.offset == 1:
            raise ValueError("cannot apply 1")

    parts = wire(stores, failing)
    owning(parts, 0)
    with pytest.raises(HandlerError, match="cannot apply 1") as raised:
        parts.batches.apply([message(0), message(1), message(2)])
    assert raised.value.message.offset == 1 and isinstance(raised.value.__cause__, ValueError)
    assert parts.batches.open is None
    assert stores.applied_offsets() == [] and stores.checkpoint() == (None, 1)
    assert parts.counters.snapshot(()).rollbacks == 1


def test_dead_letter_policy_applies_the_batch_again_without_the_failing_message(stores):
    calls: list[int] = []

    def handler(tx, m):
        calls.append(m.offset)
        if m.value == b"bad":
            raise RuntimeError("bad payload")
        stores.record(tx, m)

    parts = wire(stores, handler, error_policy="dead-letter")
    owning(parts, 0)
    b = parts.batches
    b.apply([message(0, "a"), message(1, "a", b"bad"), message(2, "b"), message(3, "a"), message(4, None, b"bad")])
    b.commit()
    assert calls == [0, 1, 0, 2, 4, 0, 2], "each failure rolls back and applies the batch again"
    assert stores.applied_offsets() == [0, 2]
    assert stores.stored() == [("dead", 1), ("parked", 3), ("dead", 4)], "a null key parks nothing"
    assert stores.checkpoint()[0] == 5
    s = parts.counters.snapshot(())
    assert (s.applied, s.dead_lettered, s.parked, s.rollbacks) == (2, 2, 1, 2)
    # The key stays parked in later batches: its order is never broken silently.
    b.apply([message(5, "a"), message(6, "b")])
    b.commit()
    assert stores.applied_offsets() == [0, 2, 6]
    assert stores.stored()[-1] == ("parked", 5)


def test_a_moved_fence_rolls_back_drops_the_partition_and_commits_the_rest(stores):
    parts = wire(stores)
    owning(parts, 0, 1)
    b = parts.batches
    # Another consumer claims partition 0 before this one commits (first: SQLite's single
    # writer would make the claim wait for this transaction otherwise).
    fence = stores.usurp(partition=0)
    b.apply([message(0, partition=0), message(0, partition=1, value=b"p1")])
    b.commit()
    assert (TOPIC, 0) not in parts.partitions.owned
    assert parts.ports.consumer.paused == [(TOPIC, 0)]
    assert stores.checkpoint(0) == (None, fence), "the zombie's offset never lands"
    assert stores.checkpoint(1)[0] == 1
    assert stores.applied_offsets() == [0], "only partition 1's message, applied again in a new transaction"
    s = parts.counters.snapshot(())
    assert (s.fence_rejections, s.rollbacks, s.commits, s.applied) == (1, 1, 1, 1)


def test_a_lost_connection_in_the_handler_is_not_the_handlers_failure(stores):
    lost = DBAPIError("SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True)

    def handler(tx, m):
        raise lost

    parts = wire(stores, handler, error_policy="dead-letter")
    owning(parts, 0)
    with pytest.raises(DBAPIError):
        parts.batches.apply([message(0)])
    assert stores.stored() == [], "never dead-lettered: recovery retries it"


def test_dedupe_identities_are_pruned_every_n_commits_behind_the_window(stores):
    parts = wire(stores, prune_every=2, dedupe_window=2)
    owning(parts, 0)
    b = parts.batches
    b.apply([message(i, source=("o", i)) for i in range(3)])
    b.commit()
    assert len(stores.identities()) == 3
    b.apply([message(i, source=("o", i)) for i in range(3, 5)])
    b.commit()
    assert stores.identities() == [("o", 3), ("o", 4)], "offsets below 5 - 2 are forgotten"


def test_discard_and_held(stores):
    parts = wire(stores)
    owning(parts, 0)
    b = parts.batches
    b.apply([message(0)])
    b.redo = [message(1)]
    assert [m.offset for m in b.held()] == [0, 1]
    b.discard()
    assert b.open is None and b.redo == [] and b.held() == []
    with stores.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(stores.applied)).scalar_one() == 0
