"""The MP/R engine's logic against in-memory fakes: throttle, barrier, purge/reset, remark, leadership."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from pyharvest.core.ports.kafka import DeliveryError
from pyharvest.core.telemetry.events import LeaderAcquired, LeaderFenced, LeaderRefreshed, LeaderRevoked, MeterRead
from pyharvest.events import State
from tests.helpers.engine import fill, make, per_key
from tests.helpers.fakes import FakeBinding, FakeKafka
from tests.helpers.waiting import wait_until


def went_round(kafka: FakeKafka, times: int = 3, group: bool = True):
    """A condition: since this call, the engine's producers were polled ``10 * times`` more
    times and (with ``group``) its main loop polled the leader group ``times`` more times. It is
    the later event a test waits for before asserting that something did not happen: by then
    the engine had its chances to do it."""
    c = kafka.cluster
    consumers = list(c.consumers) if group else []
    polls, group_polls = c.polls, sum(x.polls for x in consumers)
    return lambda: c.polls >= polls + 10 * times and sum(x.polls for x in consumers) >= group_polls + times * group


def test_drains_everything_in_order_and_empties_the_outbox():
    db, kafka = FakeBinding(), FakeKafka()
    expected = fill(db, 2000, 37)
    events = []
    h = make(db, kafka)
    h.set_event_handler(events.append)
    with h:
        wait_until(lambda: len(db) == 0)
    assert h.state is State.STOPPED
    assert per_key(kafka.cluster.logs["data"]) == expected
    assert kafka.cluster.max_in_flight_per_key == 1
    assert isinstance(events[0], LeaderAcquired)
    assert any(isinstance(e, MeterRead) for e in events) or h.metrics.records_purged == 2000
    assert db.disposed
    # Purges are batched: far fewer statements than records.
    assert db.purge_calls < 2000 / 5


def test_in_flight_throttle_is_respected():
    db, kafka = FakeBinding(), FakeKafka()
    fill(db, 500, 500)
    kafka.cluster.hold = True
    h = make(db, kafka, max_in_flight_records=17, mark_query_records=10)
    with h:
        wait_until(lambda: kafka.cluster.max_in_flight >= 10, 5)
        # Had the engine ignored the throttle, it would have marked and sent more by then.
        wait_until(went_round(kafka), 10, "the engine's loops to go round")
        assert kafka.cluster.max_in_flight <= 17
        assert h.in_flight_records + h.parked_records <= 17
        kafka.cluster.hold = False
        wait_until(lambda: len(db) == 0)
    assert kafka.cluster.max_in_flight <= 17


def test_one_record_in_flight_per_key_even_with_a_single_hot_key():
    db, kafka = FakeBinding(), FakeKafka()
    expected = fill(db, 300, 1)
    h = make(db, kafka)
    with h:
        wait_until(lambda: len(db) == 0)
    assert kafka.cluster.max_in_flight_per_key == 1
    assert per_key(kafka.cluster.logs["data"]) == expected


def test_failed_delivery_resets_and_remarks_under_a_new_leader_id_keeping_order():
    db, kafka = FakeBinding(), FakeKafka()
    expected = fill(db, 400, 7)
    failures = {"left": 25}
    lock = threading.Lock()

    def fail(sent):
        with lock:
            # Fail some deliveries early on, as a flaky broker would.
            if failures["left"] and int(sent.value) % 9 == 0:
                failures["left"] -= 1
                return DeliveryError("REQUEST_TIMED_OUT", "broker did not answer")
        return None

    kafka.cluster.fail = fail
    events = []
    h = make(db, kafka)
    h.set_event_handler(events.append)
    with h:
        wait_until(lambda: len(db) == 0)
    refreshed = [e for e in events if isinstance(e, LeaderRefreshed)]
    assert refreshed, "a failed delivery must force a remark under a new leader id"
    assert len({e.leader_id for e in refreshed}) == len(refreshed)
    assert h.metrics.records_reset >= 1
    got = per_key(kafka.cluster.logs["data"])
    assert got == expected, "failures must not reorder or lose records"
    assert kafka.cluster.max_in_flight_per_key == 1


def test_failed_mark_forces_a_remark():
    db, kafka = FakeBinding(), FakeKafka()
    expected = fill(db, 50, 5)
    db.fail_next_marks = 1
    events = []
    h = make(db, kafka)
    h.set_event_handler(events.append)
    with h:
        wait_until(lambda: len(db) == 0)
    assert any(isinstance(e, LeaderRefreshed) for e in events)
    assert h.metrics.mark_errors == 1
    assert per_key(kafka.cluster.logs["data"]) == expected


def test_lost_heartbeats_fence_the_leader_and_returning_ones_restore_it():
    db, kafka = FakeBinding(), FakeKafka()
    events = []
    h = make(db, kafka, heartbeat_timeout=0.2)
    h.set_event_handler(events.append)
    with h:
        wait_until(lambda: h.is_leader)
        kafka.cluster.heartbeats_pass = False
        wait_until(lambda: any(isinstance(e, LeaderFenced) for e in events))
        assert not h.is_leader
        # Fenced: new records are not published.
        db.insert("data", "k", b"late")
        wait_until(went_round(kafka), 10, "the engine's loops to go round")
        assert kafka.cluster.logs["data"] == []
        kafka.cluster.heartbeats_pass = True
        wait_until(lambda: h.is_leader and len(db) == 0)
    acquired = [e for e in events if isinstance(e, LeaderAcquired)]
    assert len(acquired) == 2 and acquired[0].leader_id != acquired[1].leader_id


def test_revocation_stops_publishing_and_waits_for_in_flight_records():
    db, kafka = FakeBinding(), FakeKafka()
    fill(db, 100, 100)
    kafka.cluster.hold = True
    events = []
    h = make(db, kafka)
    h.set_event_handler(events.append)
    with h:
        wait_until(lambda: h.in_flight_records > 0)
        consumer = kafka.cluster.consumers[0]
        consumer.revoke_requested = True
        wait_until(lambda: not consumer.revoke_requested, 10, "the revocation to be delivered")
        # The main loop waits in the revocation for the in-flight records: the delivery loop goes round.
        wait_until(went_round(kafka, group=False), 10, "the delivery loop to go round")
        # The revocation waits for in-flight records: still leader-ish until they resolve.
        assert not any(isinstance(e, LeaderRevoked) for e in events)
        kafka.cluster.hold = False
        wait_until(lambda: any(isinstance(e, LeaderRevoked) for e in events))
        assert h.in_flight_records == 0
        assert not h.is_leader
        published = len(kafka.cluster.logs["data"])
        wait_until(went_round(kafka), 10, "the engine's loops to go round")
        assert len(kafka.cluster.logs["data"]) == published


def test_stop_with_records_in_flight_leaves_the_rest_for_the_next_leader():
    db, kafka = FakeBinding(), FakeKafka()
    fill(db, 100, 100)
    kafka.cluster.hold = True
    h = make(db, kafka, shutdown_timeout=0.3)
    h.start()
    wait_until(lambda: h.in_flight_records > 0)
    t0 = time.monotonic()
    h.stop()
    assert h.join(5)
    assert time.monotonic() - t0 < 3
    # Nothing was acknowledged, nothing purged: every row is still there for the next leader.
    assert len(db) == 100


def test_crash_in_binding_surfaces_through_join(caplog):
    class Broken(FakeBinding):
        def purge(self, ids):
            self.purge_calls += 1
            raise MemoryError("boom")

    db, kafka = Broken(), FakeKafka()
    fill(db, 5, 5)
    h = make(db, kafka, io_error_backoff=0.001, shutdown_timeout=0.2)
    h.start()
    wait_until(lambda: h.metrics.db_errors >= 3, 10, "three failed purges")
    h.stop()
    # An Exception from the binding (MemoryError too) is retried as an I/O error until shutdown
    # gives up on it: it surfaces as errors counted and logged, and join() has no crash to raise.
    assert h.join(5)
    assert h.metrics.db_errors == db.purge_calls and h.metrics.records_purged == 0
    assert len(db) == 5, "the rows the purge gave up on are left for the next leader"
    assert "giving up on purge of 5 records" in caplog.text and "MemoryError: boom" in caplog.text

    class Crash(BaseException):
        pass

    class Crashing(FakeBinding):
        def mark(self, leader_id, limit):
            raise Crash("the binding crashed")

    # What is not an Exception is no I/O error to retry: it stops the engine, and join() raises it.
    db, kafka = Crashing(), FakeKafka()
    fill(db, 5, 5)
    h = make(db, kafka, shutdown_timeout=0.2)
    h.start()
    wait_until(lambda: h.state is State.STOPPED, 10, "the crashed engine to stop")
    with pytest.raises(Crash, match="the binding crashed"):
        h.join(5)
    assert len(db) == 5


def test_start_twice_is_refused_and_a_handler_may_be_set_once_running():
    from pyharvest.core.errors import HarvestError

    db = FakeBinding()
    h = make(db, FakeKafka())
    events: list[object] = []
    with h:
        with pytest.raises(HarvestError):
            h.start()
        h.set_event_handler(events.append)  # the README's `with Harvest(config) as h:` order
        fill(db, 50, 5)
        wait_until(lambda: h.metrics.records_purged == 50)
    assert any(isinstance(e, LeaderRevoked) for e in events)  # delivered to the handler set late


def poison_for(bad_key: str):
    def fail(sent):
        if sent.key == bad_key and sent.value == b"poison":
            return DeliveryError("MSG_SIZE_TOO_LARGE", "message too large", retriable=False)
        return None

    return fail


def test_quarantine_parks_only_the_poisoned_key_and_replay_resumes_it_in_order():
    from pyharvest.core.telemetry.events import DeliveryFailed, RecordQuarantined

    db, kafka = FakeBinding(), FakeKafka()
    db.insert("data", "bad", b"before")
    db.insert("data", "bad", b"poison")
    db.insert("data", "bad", b"after-1")
    for i in range(50):
        db.insert("data", f"good-{i % 5}", f"{i}".encode())
    db.insert("data", "bad", b"after-2")
    kafka.cluster.fail = poison_for("bad")
    events = []
    h = make(db, kafka, max_delivery_attempts=3)
    h.config.poison_policy = "quarantine"
    h.set_event_handler(events.append)
    with h:
        wait_until(lambda: len(db) == 3)  # the poison record and the two parked behind it stay
        assert "bad" in db.quarantined
        got = per_key(kafka.cluster.logs["data"])
        assert got["bad"] == [b"before"]
        assert sum(len(v) for k, v in got.items() if k.startswith("good")) == 50
        failures = [e for e in events if isinstance(e, DeliveryFailed)]
        assert [e.attempts for e in failures] == [1, 2, 3] and not failures[0].retriable
        assert [e.attempts for e in events if isinstance(e, RecordQuarantined)] == [3]
        # The operator fixes the cause and replays the key: its records flow again, in order.
        kafka.cluster.fail = lambda s: None
        db.replay("bad")
        wait_until(lambda: len(db) == 0)
    assert per_key(kafka.cluster.logs["data"])["bad"] == [b"before", b"poison", b"after-1", b"after-2"]


def test_block_policy_retries_a_poison_record_with_backoff_and_holds_its_key():
    from pyharvest.core.telemetry.events import DeliveryFailed

    db, kafka = FakeBinding(), FakeKafka()
    db.insert("data", "bad", b"poison")
    db.insert("data", "bad", b"after")
    db.insert("data", "other", b"x")
    kafka.cluster.fail = poison_for("bad")
    h = make(db, kafka, io_error_backoff=0.02)
    failed_at: list[float] = []
    h.set_event_handler(lambda e: failed_at.append(time.monotonic()) if isinstance(e, DeliveryFailed) else None)
    with h:
        wait_until(lambda: len(failed_at) >= 5, 15, "five failed attempts of the poison record")
        # Retried with growing pauses (ioErrorBackoff, doubled each attempt), not in a tight loop;
        # nothing behind it overtook it.
        gaps = [b - a for a, b in itertools.pairwise(failed_at[:5])]
        assert all(gap >= 0.9 * 0.02 * 2**i for i, gap in enumerate(gaps)), gaps
        assert h.metrics.delivery_errors["MSG_SIZE_TOO_LARGE"] >= 5
        assert per_key(kafka.cluster.logs["data"]).get("bad", []) == []
        kafka.cluster.fail = lambda s: None
        wait_until(lambda: len(db) == 0, 15)
    assert per_key(kafka.cluster.logs["data"])["bad"] == [b"poison", b"after"]


def test_a_fatal_producer_error_replaces_the_producer():
    db, kafka = FakeBinding(), FakeKafka()
    expected = fill(db, 60, 6)
    created = []
    make_producer = kafka.producer

    def counting(config):
        created.append(config)
        return make_producer(config)

    kafka.producer = counting
    fenced = {"left": 3}

    def fail(sent):
        if fenced["left"]:
            fenced["left"] -= 1
            return DeliveryError("PRODUCER_FENCED", "a newer producer fenced this one", fatal=True)
        return None

    kafka.cluster.fail = fail
    h = make(db, kafka)
    with h:
        wait_until(lambda: len(db) == 0)
    # One data producer at start, one heartbeat producer, and at least one replacement.
    assert len(created) >= 3
    assert per_key(kafka.cluster.logs["data"]) == expected


def test_fenced_event_comes_before_in_flight_records_resolve():
    db, kafka = FakeBinding(), FakeKafka()
    fill(db, 20, 20)
    kafka.cluster.hold = True
    events = []
    h = make(db, kafka, heartbeat_timeout=0.2)
    # What was in flight when each event came (handlers run synchronously, on the engine's thread).
    h.set_event_handler(lambda e: events.append((e, h.in_flight_records)))
    with h:
        wait_until(lambda: h.in_flight_records > 0)
        kafka.cluster.heartbeats_pass = False
        wait_until(lambda: any(isinstance(e, LeaderFenced) for e, _ in events))
        # The application hears of the fence at once, before the in-flight records resolve
        # (the fenced producer then abandons them: they fail and are reset).
        assert next(n for e, n in events if isinstance(e, LeaderFenced)) > 0
        wait_until(lambda: h.in_flight_records == 0)
        kafka.cluster.hold = False
        kafka.cluster.heartbeats_pass = True
        wait_until(lambda: len(db) == 0)


def test_the_facades_take_the_event_handler_at_construction():
    from pyharvest import Harvest

    db = FakeBinding()
    events: list[object] = []
    cfg = make(db, FakeKafka()).config
    with Harvest(cfg, binding=db, kafka=FakeKafka(), on_event=events.append) as h:
        fill(db, 10, 2)
        wait_until(lambda: any(isinstance(e, LeaderAcquired) for e in events))
        assert h.leading_shards == [0] and h.engines == {0: h.runner}
    assert any(isinstance(e, LeaderRevoked) for e in events)


def test_one_harvest_honours_shards():
    from dataclasses import replace

    from pyharvest import Harvest
    from pyharvest.core.engine.sharded import ShardedHarvestEngine
    from pyharvest.errors import ConfigError

    db = FakeBinding()
    cfg = replace(make(db, FakeKafka()).config, shards=4)
    events: list[object] = []
    harvest = Harvest(cfg, binding=lambda: db, kafka=FakeKafka(), on_event=events.append)  # type: ignore[arg-type,return-value]
    assert isinstance(harvest.runner, ShardedHarvestEngine)
    assert harvest.runner._event_handler == events.append
    with pytest.raises(AttributeError, match="one engine per shard"):
        _ = harvest.metrics
    # A binding that cannot mark a shard's rows is refused before anything connects.
    with pytest.raises(ConfigError, match="cannot mark a shard's rows"):
        Harvest(cfg, binding=db, kafka=FakeKafka())
