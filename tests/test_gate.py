"""The per-key gate (invariant 1) and the dispatcher that opens and closes it (invariant 3), without threads of the engine."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict

from pyharvest.core.publishing.key_window import KeyGate, KeyWindow
from pyharvest.core.outbox.records import OutboxRecord

_ids = iter(range(1, 1_000_000))


def rec(key: str, value: str = "") -> OutboxRecord:
    return OutboxRecord("data", key, value.encode(), id=next(_ids), leader_id="L")


def values(records: list[OutboxRecord]) -> list[tuple[str, bytes | str | None]]:
    return [(r.key, r.value) for r in records]


# ---------------------------------------------------------------------------------- the gate


def test_admit_sends_one_record_per_key_and_parks_the_rest_in_order():
    gate = KeyGate(limit=10)
    sent = gate.admit([rec("a", "1"), rec("b", "1"), rec("a", "2"), rec("a", "3")], now=0.0)
    assert values(sent) == [("a", b"1"), ("b", b"1")]
    assert gate.in_flight == 2 and gate.parked_count == 2
    assert sorted(gate.in_flight_keys()) == ["a", "b"]
    # A later batch queues behind what is already parked, not beside it.
    assert values(gate.admit([rec("a", "4"), rec("c", "1")], now=1.0)) == [("c", b"1")]
    assert gate.parked_count == 3 and gate.in_flight == 3
    successors = [gate.release(["a"], dispatching=True, now=2.0) for _ in range(3)]
    assert [values(s) for s in successors] == [[("a", b"2")], [("a", b"3")], [("a", b"4")]]


def test_release_hands_over_the_key_to_its_next_parked_record():
    gate = KeyGate(limit=10)
    gate.admit([rec("a", "1"), rec("a", "2"), rec("a", "3"), rec("b", "1")], now=0.0)
    assert values(gate.release(["a"], dispatching=True, now=1.0)) == [("a", b"2")]
    # The successor took over the key's place in flight: the count does not move.
    assert gate.in_flight == 2 and gate.parked_count == 1 and "a" in gate.in_flight_keys()
    assert values(gate.release(["a", "b"], dispatching=True, now=2.0)) == [("a", b"3")]
    assert gate.in_flight == 1 and gate.in_flight_keys() == ["a"]
    assert gate.release(["a"], dispatching=True, now=3.0) == []
    assert gate.in_flight == 0 and gate.parked_count == 0 and gate.in_flight_keys() == []
    assert gate.oldest_parked() is None


def test_release_while_not_dispatching_drops_the_barrier_and_keeps_parked_records_until_dropped():
    gate = KeyGate(limit=10)
    gate.admit([rec("a", "1"), rec("a", "2")], now=0.0)
    assert gate.release(["a"], dispatching=False, now=1.0) == []
    assert gate.in_flight == 0 and gate.in_flight_keys() == []
    # Still counted against the window until the remark forgets them.
    assert gate.parked_count == 1 and gate.free == 9
    gate.drop_parked()
    assert gate.parked_count == 0 and gate.free == 10 and gate.oldest_parked() is None


def test_free_counts_parked_records_against_the_window():
    gate = KeyGate(limit=5)
    assert gate.free == 5
    gate.admit([rec("hot", str(i)) for i in range(4)], now=0.0)
    assert gate.in_flight == 1 and gate.parked_count == 3 and gate.free == 1


def test_oldest_parked_is_when_the_stuck_queue_last_moved():
    gate = KeyGate(limit=10)
    gate.admit([rec("a", "1"), rec("a", "2"), rec("a", "3")], now=5.0)
    gate.admit([rec("b", "1"), rec("b", "2")], now=7.0)
    assert gate.oldest_parked() == 5.0
    gate.release(["a"], dispatching=True, now=9.0)  # a's queue moved; b's has waited since 7
    assert gate.oldest_parked() == 7.0


def test_random_interleavings_keep_one_record_per_key_in_flight_and_per_key_order():
    rng = random.Random(14)
    gate = KeyGate(limit=1_000_000)
    admitted: dict[str, list[bytes]] = defaultdict(list)
    sent_order: dict[str, list[bytes]] = defaultdict(list)
    in_flight: set[str] = set()
    counter = 0

    def send(records: list[OutboxRecord]) -> None:
        for r in records:
            assert r.key not in in_flight, "two records of one key in flight"
            in_flight.add(r.key)
            sent_order[r.key].append(r.value)  # type: ignore[arg-type]

    for step in range(2000):
        if rng.random() < 0.5:
            batch = []
            for _ in range(rng.randint(1, 20)):
                counter += 1
                key = f"k{rng.randint(0, 9)}"
                r = rec(key, str(counter))
                admitted[key].append(r.value)  # type: ignore[arg-type]
                batch.append(r)
            send(gate.admit(batch, now=float(step)))
        elif in_flight:
            done = rng.sample(sorted(in_flight), rng.randint(1, len(in_flight)))
            in_flight.difference_update(done)
            send(gate.release(done, dispatching=True, now=float(step)))
        assert gate.in_flight == len(in_flight)
    while in_flight:
        done = sorted(in_flight)
        in_flight.clear()
        send(gate.release(done, dispatching=True, now=0.0))
    assert sent_order == admitted
    assert gate.in_flight == 0 and gate.parked_count == 0


# ---------------------------------------------------------------------------------- the dispatcher


class Outlet(list):
    """Where the window sends: a list of what it sent."""

    def send(self, records):
        self.extend(records)


def dispatcher(limit: int = 10) -> tuple[KeyWindow, list[OutboxRecord]]:
    sent = Outlet()
    return KeyWindow(KeyGate(limit), sent), sent


def test_nothing_is_dispatched_before_leading_or_after_stepping_down():
    d, sent = dispatcher()
    d.dispatch([rec("a")])
    assert sent == [] and d.gate.in_flight == 0
    d.lead()
    d.dispatch([rec("a", "1")])
    d.stop_leading()
    d.dispatch([rec("b", "1")])
    assert values(sent) == [("a", b"1")]


def test_a_raised_remark_stops_new_records_and_parked_successors():
    d, sent = dispatcher()
    d.lead()
    d.dispatch([rec("a", "1"), rec("a", "2")])
    # Invariant 3: the failure of a/1 raises the remark before its reset and release.
    d.raise_remark()
    d.dispatch([rec("b", "1")])
    d.release(["a"])
    assert values(sent) == [("a", b"1")]
    assert d.gate.in_flight == 0
    assert not d.may_hold_acks()
    # The remark starts under a new leader id: dispatching resumes, parked records forgotten.
    d.quiesce("remark", None, lambda: True)
    d.lead()
    assert not d.force_remark and d.gate.parked_count == 0
    d.dispatch([rec("a", "2")])
    assert values(sent) == [("a", b"1"), ("a", b"2")]


def test_release_sends_the_successor_while_leading():
    d, sent = dispatcher()
    d.lead()
    d.dispatch([rec("a", "1"), rec("a", "2")])
    assert not d.may_hold_acks()  # a/2 waits for a/1's ack: purge it at once
    d.release(["a"])
    assert values(sent) == [("a", b"1"), ("a", b"2")]
    assert d.may_hold_acks()


def test_quiesce_waits_for_the_window_to_empty():
    d, _ = dispatcher()
    d.lead()
    d.dispatch([rec("a", "1"), rec("b", "1"), rec("a", "2")])
    releaser = threading.Timer(0.05, d.release, args=(["a", "b"],))
    releaser.start()
    started = time.monotonic()
    d.quiesce("test", None, lambda: True)
    assert time.monotonic() - started >= 0.04
    assert d.gate.in_flight == 0 and d.gate.parked_count == 0
    releaser.join()


def test_quiesce_gives_up_at_the_deadline_or_when_no_delivery_thread_is_left():
    d, _ = dispatcher()
    d.lead()
    d.dispatch([rec("a", "1")])
    started = time.monotonic()
    d.quiesce("test", time.monotonic() + 0.05, lambda: True)
    assert 0.04 <= time.monotonic() - started < 1.0
    started = time.monotonic()
    d.quiesce("test", None, lambda: False)
    assert time.monotonic() - started < 2.0  # at once, not never (no deadline): a bound a busy machine meets
    assert d.gate.in_flight == 1


def test_wait_for_room_wakes_on_release_and_not_at_all_with_a_remark_due():
    d, _ = dispatcher(limit=2)
    d.lead()
    d.dispatch([rec("a", "1"), rec("b", "1")])
    threading.Timer(0.05, d.release, args=(["a"],)).start()
    started = time.monotonic()
    d.wait_for_room(threshold=1, timeout=5.0)
    assert 0.04 <= time.monotonic() - started < 2.0
    d.dispatch([rec("c", "1")])
    d.raise_remark()
    started = time.monotonic()
    d.wait_for_room(threshold=1, timeout=5.0)
    assert time.monotonic() - started < 2.5  # not at all, rather than the 5 s timeout


def test_a_key_stuck_longer_than_the_queue_timeout_raises_a_remark():
    d, _ = dispatcher()
    d.lead()
    d.check_parked(timeout=0.01)
    assert not d.force_remark  # nothing parked
    d.dispatch([rec("a", "1"), rec("a", "2")])
    d.check_parked(timeout=5.0)
    assert not d.force_remark
    deadline = time.monotonic() + 5  # until the gate's own clock says the key was stuck too long
    while not d.force_remark and time.monotonic() < deadline:
        d.check_parked(timeout=0.01)
    assert d.force_remark
