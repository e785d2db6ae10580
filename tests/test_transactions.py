"""The exactly-once publisher's logic, against in-memory fakes that can force what a real
cluster only does by chance: a commit whose outcome is unknown, a fence between produce and
commit, a poison record inside a transaction. The same behaviours run against Apache Kafka
and live databases in tests/test_exactly_once.py and tests/test_exactly_once_chaos.py."""

from __future__ import annotations

import threading

import pytest

from pyharvest import Config
from pyharvest.core.errors import ConfigError
from pyharvest.core.ports.kafka import DeliveryError
from pyharvest.core.publishing.progress import decode_progress, encode_progress, transactional_id
from tests.helpers.engine import fill, per_key
from tests.helpers.engine import make_exactly_once as make
from tests.helpers.fakes import FakeBinding, FakeKafka, FakeTransactionalKafka
from tests.helpers.waiting import wait_until


def test_progress_records_name_runs_of_ids_and_read_back_exactly():
    ids = [*range(1, 1001), 1005, 1007, 1008]
    value = encode_progress("leader-1", list(reversed(ids)))
    assert value == b'{"v":1,"leader":"leader-1","ids":[[1,1000],[1005,1005],[1007,1008]]}'
    assert decode_progress(value) == ids
    with pytest.raises(ValueError, match="not a progress record"):
        decode_progress(b'{"v":2,"ids":[]}')
    assert transactional_id("orders", 3) == "pyharvest.orders.3"


def test_every_record_once_in_order_and_every_batch_carries_its_progress():
    db, kafka = FakeBinding(), FakeTransactionalKafka()
    expected = fill(db, 3000, keys=17)
    with make(db, kafka) as engine:
        wait_until(lambda: len(db) == 0, 30, "the outbox to drain")
    assert per_key(kafka.txns.records("data")) == expected
    progress = kafka.txns.records("app.progress")
    assert len(progress) == kafka.txns.commits == engine.metrics.transactions_committed
    assert sorted(i for _k, v in progress for i in decode_progress(v)) == list(range(1, 3001))


def test_a_new_leader_purges_what_the_last_committed_transaction_carried_before_marking():
    """The previous leader committed rows 1-3 and died before purging them: they must not be
    published again, and the rest must."""
    db, kafka = FakeBinding(), FakeTransactionalKafka()
    fill(db, 5, keys=1)
    kafka.txns.committed[("app.progress", 0)].append(("0", encode_progress("dead-leader", [1, 2, 3])))
    with make(db, kafka):
        wait_until(lambda: len(db) == 0, 10, "the outbox to drain")
    assert kafka.txns.records("data") == [("k0", b"3"), ("k0", b"4")]


def test_the_takeover_says_how_many_rows_it_purged_not_how_many_ids_the_progress_named(caplog):
    """The last leader purged its committed rows before it stopped (the usual case): the ids
    its progress record names are gone, and the takeover purges none of them."""
    db, kafka = FakeBinding(), FakeTransactionalKafka()
    fill(db, 2, keys=1)  # ids 1 and 2, not named by the progress record
    kafka.txns.committed[("app.progress", 0)].append(("0", encode_progress("gone-leader", list(range(100, 110)))))
    with caplog.at_level("INFO", logger="pyharvest"), make(db, kafka):
        wait_until(lambda: len(db) == 0, 10, "the outbox to drain")
    (line,) = [r.getMessage() for r in caplog.records if "took over the transactions" in r.getMessage()]
    assert "named 10 records; 0 were still in the outbox" in line, line


def test_a_commit_of_unknown_outcome_is_settled_by_a_new_takeover_not_by_publishing_again():
    db, kafka = FakeBinding(), FakeTransactionalKafka()
    expected = fill(db, 200, keys=5)
    kafka.txns.commit_error = ("fatal", "after")  # the first commit took effect, then failed
    with make(db, kafka) as engine:
        wait_until(lambda: len(db) == 0, 10, "the outbox to drain")
    assert per_key(kafka.txns.records("data")) == expected  # nothing twice
    assert engine.metrics.transactions_aborted >= 1
    assert len(kafka.producers) >= 2  # the producer in doubt was replaced, with a fence


def test_a_failed_commit_remarks_the_batch_in_order():
    db, kafka = FakeBinding(), FakeTransactionalKafka()
    expected = fill(db, 200, keys=5)
    kafka.txns.commit_error = ("abortable", "before")
    with make(db, kafka) as engine:
        wait_until(lambda: len(db) == 0, 10, "the outbox to drain")
    assert per_key(kafka.txns.records("data")) == expected
    assert engine.metrics.leader_refreshes >= 1


def test_a_fenced_leader_cannot_commit_and_purges_nothing():
    """The old leader is held at its commit while a new producer of its shard initialises:
    its commit is refused and nothing of its batch is purged. (The engine, which the fake
    election never deposes, then takes over afresh and publishes each record once.)"""
    db, kafka = FakeBinding(), FakeTransactionalKafka()
    expected = fill(db, 50, keys=3)
    kafka.txns.hold_commit = held = threading.Event()
    with make(db, kafka) as engine:
        wait_until(lambda: kafka.producers and kafka.producers[-1].open, 10, "a transaction to be open")
        old = kafka.producers[-1]
        usurper = kafka.transactional_producer({"transactional.id": transactional_id("app", 0)})
        usurper.init_transactions(1.0)
        kafka.txns.hold_commit = None
        held.set()
        wait_until(lambda: engine.metrics.producer_fencings >= 1, 10, "the old commit to be refused")
        wait_until(lambda: len(db) == 0, 10, "the outbox to drain")
    assert old.commits == 0
    assert per_key(kafka.txns.records("data")) == expected


def test_a_poison_record_holds_only_its_key_then_is_quarantined():
    db, kafka = FakeBinding(), FakeTransactionalKafka()
    expected = fill(db, 300, keys=6)
    bad = next(r for r in db.rows.values() if r.key == "k2")
    kafka.cluster.fail = lambda s: (
        DeliveryError("MSG_SIZE_TOO_LARGE", "too large", retriable=False) if s.value == bad.value else None
    )
    with make(db, kafka, poison_policy="quarantine") as engine:
        wait_until(lambda: all(r.key == "k2" for r in db.rows.values()), 10, "every other key to drain")
        wait_until(lambda: "k2" in db.quarantined, 10, "the poison key to be quarantined")
        assert engine.metrics.records_quarantined == 1
    published = per_key(kafka.txns.records("data"))
    assert all(published[k] == v for k, v in expected.items() if k != "k2")
    # Only what came before the poison record went out for its key.
    assert published.get("k2", []) == expected["k2"][: expected["k2"].index(bad.value)]


def test_clients_without_transactions_are_refused_with_a_clear_error():
    with pytest.raises(ConfigError, match="exactly-once needs Kafka clients with transactions; FakeKafka has none"):
        make(FakeBinding(), FakeKafka())


def test_the_delivery_mode_is_checked():
    with pytest.raises(ConfigError, match="delivery: expected one of at-least-once, exactly-once, got 'twice'"):
        Config(delivery="twice").resolve()
    with pytest.raises(ConfigError, match="progressTopic: must differ from leaderTopic"):
        Config(leader_topic="x", progress_topic="x").resolve()
    assert Config(leader_group_id="orders").resolve().progress_topic == "orders.progress"
