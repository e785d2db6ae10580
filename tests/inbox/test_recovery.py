"""Recovery, on a SQLite file with Kafka faked: after a database error only what lies past
the re-read checkpoints is applied again; revoked, lost and stopping work."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError, OperationalError

from pyharvest.bindings.sql.inbox.database import SqlInboxDatabase
from tests.helpers.inbox.fakes import TOPIC, Stores, message, wire

OUTAGE = OperationalError("SELECT 1", {}, Exception("server closed the connection"))


@pytest.fixture
def stores(tmp_path) -> Stores:
    s = Stores.create(str(tmp_path / "inbox.db"))
    yield s
    s.engine.dispose()


def owning(parts, *partitions: int):
    parts.ports.consumer.rebalance("assign", [(TOPIC, p) for p in partitions])
    parts.ports.consumer.poll(1, 0)


def test_connection_lost_is_only_an_invalidated_connection():
    connection_lost = SqlInboxDatabase(None).connection_lost  # type: ignore[arg-type]
    assert connection_lost(DBAPIError("x", {}, Exception("gone"), connection_invalidated=True))
    assert not connection_lost(OUTAGE)
    assert not connection_lost(ValueError("handler bug"))


def test_after_a_database_error_what_lies_past_the_checkpoint_is_applied_again(stores):
    parts = wire(stores)
    owning(parts, 0)
    b = parts.batches
    b.apply([message(0), message(1), message(2)])
    # The commit of offsets 0-1 happened although its outcome was lost to us: the checkpoint says 2.
    b.rollback()
    with stores.engine.begin() as c:
        assert stores.checkpoints.advance(c, (TOPIC, 0), 2, parts.partitions.owned[(TOPIC, 0)].fence)
    b.apply([message(0), message(1), message(2)])
    parts.recovery.after_database_error(OUTAGE)
    assert b.open is None
    assert [m.offset for m in b.redo] == [2]
    assert parts.partitions.owned[(TOPIC, 0)].committed == 2
    assert parts.counters.snapshot(()).database_errors == 1
    b.finish()
    assert stores.applied_offsets() == [2] and stores.checkpoint()[0] == 3


def test_a_partition_taken_over_during_the_outage_is_dropped(stores):
    parts = wire(stores)
    owning(parts, 0, 1)
    stores.usurp(partition=0)
    parts.batches.apply([message(0, partition=0), message(0, partition=1)])
    parts.recovery.after_database_error(OUTAGE)
    assert list(parts.partitions.owned) == [(TOPIC, 1)]
    assert parts.ports.consumer.paused == [(TOPIC, 0)]
    assert [(m.partition, m.offset) for m in parts.batches.redo] == [(1, 0)]


def test_stopping_during_the_outage_queues_nothing(stores):
    parts = wire(stores)
    owning(parts, 0)
    parts.batches.apply([message(0)])
    parts.stop.set()
    parts.recovery.after_database_error(OUTAGE)
    assert parts.batches.open is None and parts.batches.redo == []
    assert stores.applied_offsets() == [], "the next owner applies it"


def test_a_handler_that_failed_because_of_the_outage_gets_another_go(stores):
    fail = {"on": True}

    def handler(tx, m):
        if fail["on"] and m.offset == 0:
            raise RuntimeError("the service behind it was down too")
        stores.record(tx, m)

    parts = wire(stores, handler, error_policy="dead-letter")
    owning(parts, 0)
    parts.batches.apply([message(0, "a"), message(1, "b")])  # 0 is to be dead-lettered at commit
    parts.recovery.after_database_error(OUTAGE)
    fail["on"] = False
    parts.batches.finish()
    assert stores.applied_offsets() == [0, 1] and stores.stored() == []


def test_revocation_commits_the_open_work_under_the_fence_still_ours(stores):
    parts = wire(stores)
    owning(parts, 0)
    parts.batches.apply([message(0)])
    parts.batches.redo = [message(1)]
    parts.ports.consumer.rebalance("revoke", [(TOPIC, 0)])
    parts.ports.consumer.poll(1, 0)
    assert stores.applied_offsets() == [0, 1] and stores.checkpoint()[0] == 2
    assert parts.partitions.owned == {}


def test_revocation_whose_commit_fails_leaves_the_work_to_the_next_owner(stores):
    parts = wire(stores)
    owning(parts, 0)
    parts.batches.apply([message(0)])

    def broken_commit():
        raise OUTAGE

    parts.batches.commit = broken_commit
    parts.loop.revoked([(TOPIC, 0)])
    assert parts.batches.open is None and parts.batches.redo == []
    assert parts.partitions.owned == {} and stores.applied_offsets() == []


def test_loss_commits_nothing(stores):
    parts = wire(stores)
    owning(parts, 0)
    parts.batches.apply([message(0)])
    parts.batches.redo = [message(1)]
    parts.loop.lost([(TOPIC, 0)])
    assert parts.batches.open is None and parts.batches.redo == [] and parts.partitions.owned == {}
    assert stores.applied_offsets() == [] and stores.checkpoint()[0] is None


def test_a_failing_final_commit_rolls_back(stores):
    parts = wire(stores)
    owning(parts, 0)
    parts.batches.apply([message(0)])

    def broken_commit():
        raise OUTAGE

    parts.batches.commit = broken_commit
    parts.loop.finish()
    assert parts.batches.open is None and stores.applied_offsets() == []
