"""A key held back by a record Kafka refuses for good (``poisonPolicy: block``) is visible:
:attr:`Harvest.blocked_keys`, the status page, ``/readyz`` (200, ``degraded``) and the
``pyharvest_blocked_keys`` gauge name it until its record goes through, is quarantined or its
row is deleted; the log names every failing record of a batch, gives the advice once per key
and error, and the poison back-off ends once nothing refused is retried any more.

The record itself and the engine on the fakes of its ports first; then PostgreSQL and Apache
Kafka, with a producer whose ``message.max.bytes`` refuses a record and a row whose topic name
is invalid. (Not a topic's ``max.message.bytes``: the broker refuses the whole batch an
oversized record travels in, so its partition's other records fail with it.)
"""

from __future__ import annotations

import logging
import uuid

import pytest
import sqlalchemy as sa

from pyharvest.core.config.settings import Config, Limits
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.kafka import DeliveryError
from pyharvest.core.publishing.blocked_keys import BlockedKeys
from pyharvest.core.publishing.failures import name_failures
from pyharvest.core.publishing.settlement import Settlement
from pyharvest.core.telemetry.metrics import HarvestMetrics
from pyharvest.core.telemetry.spans import BatchSpans
from pyharvest.events import BlockedKey
from tests.helpers.engine import make, make_exactly_once
from tests.helpers.fakes import FakeBinding, FakeKafka, FakeTransactionalKafka
from tests.helpers.waiting import wait_until

TOO_LARGE = DeliveryError("MSG_SIZE_TOO_LARGE", "Broker: Message size too large", retriable=False)


def rec(rid: int, key: str, leader: str = "L1", topic: str = "t") -> OutboxRecord:
    return OutboxRecord(topic, key, b"v", (), rid, None, leader)


# ---------------------------------------------------------------------- the record


def test_a_refused_record_blocks_its_key_until_it_goes_through():
    blocked = BlockedKeys(shard=2)
    assert not blocked and blocked.snapshot() == () and blocked.total == 0
    blocked.failed(rec(7, "a"), "MSG_SIZE_TOO_LARGE: too big", 1)
    blocked.failed(rec(7, "a"), "MSG_SIZE_TOO_LARGE: too big", 2)
    (entry,) = blocked.snapshot()
    assert isinstance(entry, BlockedKey)
    assert (entry.key, entry.topic, entry.record_id, entry.error, entry.attempts, entry.shard) == (
        "a", "t", 7, "MSG_SIZE_TOO_LARGE: too big", 2, 2)
    with pytest.raises(AttributeError):
        entry.attempts = 3  # type: ignore[misc]  # a read-only view
    assert blocked.settled([1, 2], "went through") == [] and blocked.total == 1
    assert [b.key for b in blocked.settled([7], "went through")] == ["a"]
    assert not blocked


def test_a_mark_that_passes_a_blocked_row_by_frees_its_key():
    blocked = BlockedKeys()
    blocked.failed(rec(5, "a"), "e", 1)
    blocked.failed(rec(9, "b"), "e", 1)
    # Under a new leader id, the first mark returns the oldest rows: 3, 4 and 9 (asked for 3).
    # Row 5 would have come before 9: it is gone. Row 9 came: it is on its way again.
    gone = blocked.marked("L2", [rec(3, "x", "L2"), rec(4, "y", "L2"), rec(9, "b", "L2")], 3)
    assert [b.key for b in gone] == ["a"] and [b.key for b in blocked.snapshot()] == ["b"]
    # Later marks under the same id never return row 9 again: that proves nothing.
    assert blocked.marked("L2", [], 3) == [] and blocked.total == 1
    # A mark that does not reach past it (full, ids below it) says nothing either.
    blocked.failed(rec(9, "b", "L2"), "e", 2)
    assert blocked.marked("L3", [rec(1, "x", "L3"), rec(2, "y", "L3")], 2) == []
    # The outbox ran dry without it (a short mark): gone.
    assert [b.key for b in blocked.marked("L3", [], 2)] == ["b"] and not blocked


def test_the_view_is_capped_and_the_rest_counted():
    blocked = BlockedKeys(limit=3)
    for i in range(5):
        blocked.failed(rec(i + 1, f"k{i}"), "e", 1)
    assert [b.key for b in blocked.snapshot()] == ["k0", "k1", "k2"] and blocked.total == 5
    blocked.settled([1], "went through")
    assert [b.key for b in blocked.snapshot()] == ["k1", "k2", "k3"] and blocked.total == 4


def test_a_later_record_of_the_key_takes_the_place_of_a_deleted_one():
    blocked = BlockedKeys()
    blocked.failed(rec(5, "a"), "first", 1)
    blocked.failed(rec(8, "a", "L2"), "second", 1)
    (entry,) = blocked.snapshot()
    assert (entry.record_id, entry.error) == (8, "second")
    assert blocked.settled([5], "went through") == [] and blocked.total == 1


def test_every_failing_record_is_named_up_to_a_bound():
    failures = [(rec(i, f"k{i}"), TOO_LARGE) for i in range(1, 13)]
    text = name_failures(failures)
    for i in range(1, 11):
        assert f"record {i} key 'k{i}': MSG_SIZE_TOO_LARGE" in text
    assert "record 11" not in text and text.endswith("; and 2 more")
    assert name_failures(failures[:2], bound=10).count("record ") == 2


class _Patient:
    def may_retry(self) -> bool:
        return True

    def pause(self) -> None:
        return None


def test_the_poison_backoff_is_owed_only_while_a_refused_record_is_retried():
    config = Config(leader_topic="app.neli", leader_group_id="app", data_source="fake://",
                    limits=Limits(io_error_backoff=0.5)).resolve()
    settlement = Settlement(config, HarvestMetrics(), BatchSpans("outbox"), lambda e: None, _Patient())
    for attempt in range(1, 6):
        settlement.judge(FakeBinding(), [(rec(1, "a"), TOO_LARGE)])  # type: ignore[arg-type]
        assert settlement.poison_backoff() == min(10.0, 0.5 * 2 ** (attempt - 1))
    # A remark for another cause (a failed mark: the table dropped and re-created) waits for
    # nothing, though the key is still blocked.
    assert settlement.blocked and settlement.poison_backoff() == 0.0
    # The record went through: no back-off, and the next poison record starts from the bottom.
    settlement.delivered([1])
    assert not settlement.blocked and settlement.poison_backoff() == 0.0
    settlement.judge(FakeBinding(), [(rec(2, "b"), TOO_LARGE)])  # type: ignore[arg-type]
    assert settlement.poison_backoff() == 0.5
    # So too when the key was freed by a mark that found its row gone, with no remark between.
    settlement.judge(FakeBinding(), [(rec(2, "b"), TOO_LARGE)])  # type: ignore[arg-type]
    settlement.blocked.marked("L9", [], 10)
    settlement.judge(FakeBinding(), [(rec(3, "c"), TOO_LARGE)])  # type: ignore[arg-type]
    assert settlement.poison_backoff() == 0.5


# ---------------------------------------------------------------------- the engine on fakes


def poison(*keys: str):
    def fail(sent):  # noqa: ANN001, ANN202 - a FakeCluster hook
        return TOO_LARGE if sent.key in keys and sent.value == b"poison" else None

    return fail


def backoffs(caplog: pytest.LogCaptureFixture) -> int:
    return sum("before retrying a record Kafka refused" in r.getMessage() for r in caplog.records)


def test_the_engine_shows_blocked_keys_names_them_all_and_stops_backing_off_once_they_are_deleted(caplog):
    caplog.set_level(logging.INFO, logger="pyharvest")
    db, kafka = FakeBinding(), FakeKafka()
    bad = [db.insert("data", "bad-1", b"poison"), db.insert("data", "bad-2", b"poison")]
    db.insert("data", "bad-1", b"after")
    for i in range(5):
        db.insert("data", f"good-{i}", b"x")
    kafka.cluster.fail = poison("bad-1", "bad-2")
    h = make(db, kafka, io_error_backoff=0.01)
    with h:
        wait_until(lambda: {b.key: b.attempts for b in h.blocked_keys}.get("bad-2", 0) >= 4, 30,
                   "both poison records to be retried a few times")
        assert {b.key for b in h.blocked_keys} == {"bad-1", "bad-2"} and h.blocked_key_count == 2
        by_key = {b.key: b for b in h.blocked_keys}
        assert by_key["bad-1"].record_id == bad[0] and by_key["bad-1"].topic == "data"
        assert by_key["bad-1"].error.startswith("MSG_SIZE_TOO_LARGE") and by_key["bad-1"].since > 0
        lines = [r.getMessage() for r in caplog.records]
        # Both failing records named in one line, not only the first.
        assert any(f"record {bad[0]} key 'bad-1'" in line and f"record {bad[1]} key 'bad-2'" in line
                   for line in lines if "deliveries failed" in line), lines
        # The long advice once per key and error, however often it is retried.
        for key in ("bad-1", "bad-2"):
            advice = [line for line in lines if f"of key {key!r}" in line and "To fix it" in line
                      and "(repeated" not in line]  # a count of repeats comes every 30 s
            assert len(advice) == 1, advice
            assert "message.max.bytes" in advice[0]
        assert backoffs(caplog) >= 3
        # The operator deletes the poison rows: the keys are free, the back-off ends.
        with db._lock:
            for rid in bad:
                del db.rows[rid]
        # The line comes just after the key leaves the record: wait for both.
        wait_until(lambda: h.blocked_key_count == 0 and any(
            "key 'bad-1' is no longer held back: its record" in r.getMessage() for r in caplog.records
        ), 30, "the deleted rows' keys to be freed, and the log to say so")
        wait_until(lambda: len(db) == 0, 30, "the record behind the poison one to go")
        seen = backoffs(caplog)
        # Later remarks (a failed mark) no longer back off.
        db.fail_next_marks = 1
        wait_until(lambda: sum("marks succeed again" in r.getMessage() for r in caplog.records) >= 1, 30,
                   "a failed mark and the next good one")
        db.insert("data", "later", b"x")
        wait_until(lambda: len(db) == 0, 30, "a later record to go")
        assert backoffs(caplog) == seen


def test_a_record_that_goes_through_at_last_frees_its_key():
    db, kafka = FakeBinding(), FakeKafka()
    db.insert("data", "bad", b"poison")
    kafka.cluster.fail = poison("bad")
    h = make(db, kafka, io_error_backoff=0.01)
    with h:
        wait_until(lambda: h.blocked_key_count == 1, 30, "the key to be blocked")
        kafka.cluster.fail = lambda sent: None  # the operator raised the limit
        wait_until(lambda: len(db) == 0 and h.blocked_key_count == 0, 30, "the record to go and free its key")


def test_a_quarantined_key_is_no_longer_blocked():
    db, kafka = FakeBinding(), FakeKafka()
    db.insert("data", "bad", b"poison")
    kafka.cluster.fail = poison("bad")
    h = make(db, kafka, io_error_backoff=0.01, max_delivery_attempts=3)
    h.config.poison_policy = "quarantine"
    with h:
        wait_until(lambda: "bad" in db.quarantined, 30, "the key to be quarantined")
        assert h.blocked_key_count == 0


def test_exactly_once_shows_the_parked_key_until_its_row_is_deleted():
    db, kafka = FakeBinding(), FakeTransactionalKafka()
    bad = db.insert("data", "bad", b"poison")
    db.insert("data", "good", b"x")
    kafka.cluster.fail = poison("bad")
    h = make_exactly_once(db, kafka, poison_policy="block")
    with h:
        wait_until(lambda: h.blocked_key_count == 1, 30, "the key to be blocked")
        assert h.blocked_keys[0].record_id == bad
        with db._lock:
            del db.rows[bad]
        wait_until(lambda: h.blocked_key_count == 0 and len(db) == 0, 30, "the deleted row's key to be freed")


# ---------------------------------------------------------------------- PostgreSQL and Apache Kafka


@pytest.mark.kafka
@pytest.mark.timeout(240)
@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_a_blocked_key_on_postgresql_and_kafka_shows_everywhere_until_its_row_is_deleted(
    caplog, kafka_config, kafka_bootstrap, dialect, database_url, table_name, topic_name, delivery
):
    if dialect != "postgresql":
        pytest.skip("the blocked keys are dialect-independent: PostgreSQL covers them")
    from tests.helpers.fixtures.kafka import on_embedded_broker

    if delivery == "exactly-once" and on_embedded_broker():
        pytest.skip("the embedded broker has no transactions")
    from pyharvest import Harvest, stasher
    from pyharvest.bindings.ops import start_ops_server
    from pyharvest.bindings.sql import create_outbox_table
    from tests.helpers.ops import LOCAL, get, probe, scrape
    from tests.helpers.outbox import outbox_count
    from tests.helpers.topics import create_topic

    caplog.set_level(logging.INFO, logger="pyharvest")
    create_outbox_table(database_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=1)
    engine = sa.create_engine(database_url)
    out = stasher.Stasher(table_name)
    with engine.begin() as tx:
        out.stash(tx, OutboxRecord(topic_name, "big", b"P" * 30_000))  # the producer refuses it
        out.stash(tx, OutboxRecord(topic_name, "badtopic", b"x"))
        for i in range(5):
            out.stash(tx, OutboxRecord(topic_name, f"good-{i}", b"g"))
    with engine.begin() as tx:  # a topic name the stasher refuses, as an older writer could leave it
        tx.execute(sa.text(f"UPDATE {table_name} SET kafka_topic = 'nc bad!' WHERE kafka_key = 'badtopic'"))
    cfg = Config(
        base_kafka_config=dict(kafka_config),
        producer_kafka_config={"message.max.bytes": 20_000},
        leader_group_id=f"blocked-{uuid.uuid4().hex[:8]}",
        data_source=database_url,
        outbox_table=table_name,
        poison_policy="block",
        delivery=delivery,  # type: ignore[arg-type]
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05, io_error_backoff=0.05),
    )
    harvest = Harvest(cfg)
    ops = start_ops_server(harvest, {**LOCAL, "ageInterval": "200ms"})
    assert ops is not None
    try:
        with harvest:
            def both_blocked() -> bool:
                keys = {b.key: b for b in harvest.blocked_keys}
                return set(keys) == {"big", "badtopic"} and min(b.attempts for b in keys.values()) >= 2

            wait_until(both_blocked, 90, "both poison records to be retried")
            wait_until(lambda: outbox_count(database_url, table_name) == 2, 60, "the good keys to drain")
            big = next(b for b in harvest.blocked_keys if b.key == "big")
            assert big.topic == topic_name and "MSG_SIZE_TOO_LARGE" in big.error
            # /readyz: 200 (the relay serves), degraded, with the keys.
            status, body = probe(ops, "/readyz")
            assert status == 200 and body["degraded"] is True and body["blocked_key_count"] == 2
            assert {k["key"] for k in body["blocked_keys"]} == {"big", "badtopic"}
            assert all({"topic", "record_id", "error", "attempts", "since"} <= set(k) for k in body["blocked_keys"])
            # The gauge.
            assert scrape(ops)["pyharvest_blocked_keys"] == 2
            # The status page: a warning badge, the keys above the fold (before the shards).
            status, page = get(ops.url + "/")
            assert status == 200
            assert 'class="badge warn">degraded<' in page
            assert page.index('id="blocked"') < page.index("<h2>Quarantined keys</h2>") < page.index("<h2>Shards</h2>")
            assert "<code>big</code>" in page and "<code>badtopic</code>" in page and "nc bad!" in page
            # The advice once per key and error, though each was retried.
            advice = [r.getMessage() for r in caplog.records
                      if "To fix it" in r.getMessage() and "(repeated" not in r.getMessage()]
            assert sum("key 'big'" in a for a in advice) == 1, advice

            with engine.begin() as tx:
                tx.execute(sa.text(f"DELETE FROM {table_name} WHERE kafka_key IN ('big', 'badtopic')"))
            wait_until(lambda: harvest.blocked_key_count == 0, 60, "the deleted rows' keys to be freed")
            assert scrape(ops)["pyharvest_blocked_keys"] == 0
            status, body = probe(ops, "/readyz")
            assert status == 200 and body["degraded"] is False and "blocked_keys" not in body
            status, page = get(ops.url + "/")
            assert 'id="blocked-empty"' in page and 'class="badge ready">ready<' in page
            seen = backoffs(caplog)
            # A later record goes, with no back-off line for the deleted ones.
            with engine.begin() as tx:
                out.stash(tx, OutboxRecord(topic_name, "later", b"l"))
            wait_until(lambda: outbox_count(database_url, table_name) == 0, 60, "a later record to go")
            assert backoffs(caplog) == seen
    finally:
        ops.stop()
        engine.dispose()
