"""Delivery processing (invariants 2 and 3) against an in-memory outbox: what is purged, reset or
quarantined, in which order, and when the keys are released."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any

import pytest

from pyharvest.core.config.settings import Config, Limits
from pyharvest.core.publishing.acks import AckProcessor
from pyharvest.core.publishing.at_least_once import UntilShutdown
from pyharvest.core.publishing.sender import Flight
from pyharvest.core.publishing.settlement import Settlement
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.kafka import DeliveryError
from pyharvest.core.telemetry.events import DeliveryFailed, MeterRead, RecordQuarantined
from pyharvest.core.telemetry.metrics import HarvestMetrics
from pyharvest.core.telemetry.spans import BatchSpans
from tests.helpers.fakes import FakeBinding

TIMEOUT = DeliveryError("REQUEST_TIMED_OUT", "broker did not answer")
TOO_LARGE = DeliveryError("MSG_SIZE_TOO_LARGE", "message too large", retriable=False)
FENCED = DeliveryError("PRODUCER_FENCED", "a newer producer fenced this one", fatal=True)


class JournalBinding(FakeBinding):
    """Writes every statement into a journal shared with the processor's callbacks."""

    def __init__(self, journal: list[tuple[Any, ...]]) -> None:
        super().__init__()
        self.journal = journal
        self.purge_failures = 0

    def purge(self, ids):
        if self.purge_failures:
            self.purge_failures -= 1
            raise ConnectionError("database connection lost during purge")
        self.journal.append(("purge", sorted(ids)))
        return super().purge(ids)

    def reset(self, ids, leader_id=None):
        self.journal.append(("reset", sorted(ids), leader_id))
        return super().reset(ids, leader_id)

    def quarantine(self, entries):
        self.journal.append(("quarantine", [e.record.id for e in entries]))
        return super().quarantine(entries)


class NoQuarantine:
    """A binding without the optional quarantine."""

    def __init__(self, inner: FakeBinding) -> None:
        self.mark, self.purge, self.reset, self.dispose = inner.mark, inner.purge, inner.reset, inner.dispose


class JournalWindow:
    """The key window as the processor sees it: its remarks and releases go to the journal."""

    def __init__(self, journal: list[tuple[Any, ...]]) -> None:
        self.journal = journal
        self.hold_acks = True

    def raise_remark(self) -> None:
        self.journal.append(("remark",))

    def release(self, keys: list[str]) -> None:
        self.journal.append(("release", sorted(keys)))

    def may_hold_acks(self) -> bool:
        return self.hold_acks


class ReportingSender:
    """The sender as the processor sees it: the reports, and the producer it polls."""

    def __init__(self) -> None:
        self.reports: deque[Flight] = deque()
        self.producer: Any = None


class Rig:
    def __init__(self, *, policy: str = "block", max_attempts: int = 3, coalesce_target: int = 1, **limits: Any):
        self.journal: list[tuple[Any, ...]] = []
        self.events: list[Any] = []
        self.db = JournalBinding(self.journal)
        self.deadline: float | None = None
        lim = Limits(io_error_backoff=0.001, min_metrics_interval=3600.0, max_delivery_attempts=max_attempts)
        for k, v in limits.items():
            setattr(lim, k, v)
        self.config = Config(leader_topic="app.neli", leader_group_id="app", data_source="fake://",
                             limits=lim, poison_policy=policy).resolve()
        self.metrics = HarvestMetrics()
        self.sender = ReportingSender()
        self.reports = self.sender.reports
        self.window = JournalWindow(self.journal)
        patience = UntilShutdown(lambda: self.deadline, 0.001)
        self.settlement = Settlement(self.config, self.metrics, BatchSpans("outbox"), self.events.append, patience)
        self.processor = AckProcessor(
            self.sender,  # type: ignore[arg-type]
            self.window,  # type: ignore[arg-type]
            self.settlement,
            self.metrics,
            coalesce_target=coalesce_target,
            min_metrics_interval=lim.min_metrics_interval or 0.0,
            emit=self.events.append,
        )

    def marked(self, *keys: str, leader_id: str = "L1") -> list[OutboxRecord]:
        for key in keys:
            self.db.insert("data", key, key.encode())
        return self.db.mark(leader_id, len(keys))

    def report(self, record: OutboxRecord, error: DeliveryError | None = None) -> None:
        Flight(record, self.reports.append)(error)

    def process(self, binding: Any = None) -> None:
        self.processor.process(binding if binding is not None else self.db)

    def failures(self) -> list[DeliveryFailed]:
        return [e for e in self.events if isinstance(e, DeliveryFailed)]


def test_acks_are_purged_in_one_statement_and_only_then_released():
    rig = Rig()
    records = rig.marked("a", "b", "c")
    for r in records:
        rig.report(r)
    rig.process()
    ids = [r.id for r in records]
    assert rig.journal == [("purge", ids), ("release", ["a", "b", "c"])]
    assert len(rig.db) == 0 and not rig.reports
    assert (rig.metrics.purge_statements, rig.metrics.records_purged) == (1, 3)


def test_a_failure_raises_the_remark_before_any_reset_and_keys_are_released_last():
    rig = Rig()
    ok, bad = rig.marked("ok", "bad")
    rig.report(ok)
    rig.report(bad, TIMEOUT)
    rig.process()
    assert rig.journal == [("remark",), ("purge", [ok.id]), ("reset", [bad.id], "L1"), ("release", ["bad", "ok"])]
    assert rig.db.rows[bad.id].leader_id is None  # free for the remark to take again
    assert rig.metrics.records_reset == 1 and rig.metrics.delivery_errors == {"REQUEST_TIMED_OUT": 1}
    assert [(e.record_id, e.attempts, e.retriable) for e in rig.failures()] == [(bad.id, 1, True)]


def test_each_reset_names_the_leader_id_its_rows_were_marked_under():
    rig = Rig()
    a, b, c = rig.marked("a", "b", "c")
    # c was marked again by a later leader id since it was sent.
    rig.db.rows[c.id].leader_id = "L2"
    c = replace(c, leader_id="L2")
    for r in (a, b, c):
        rig.report(r, TIMEOUT)
    rig.process()
    resets = [j for j in rig.journal if j[0] == "reset"]
    assert resets == [("reset", [a.id, b.id], "L1"), ("reset", [c.id], "L2")]
    assert rig.metrics.reset_statements == 2 and rig.metrics.records_reset == 3


def test_a_late_reset_leaves_a_row_another_leader_id_has_marked_since():
    rig = Rig()
    (rec,) = rig.marked("k")
    rig.db.rows[rec.id].leader_id = "L2"
    rig.report(rec, TIMEOUT)
    rig.process()
    assert rig.db.rows[rec.id].leader_id == "L2" and rig.metrics.records_reset == 0


def test_the_block_policy_resets_a_poison_record_and_counts_the_streak():
    rig = Rig(policy="block", max_attempts=1)
    (poison,) = rig.marked("bad")
    for _ in range(2):
        rig.report(poison, TOO_LARGE)
        rig.process()
    assert rig.settlement.poison_streak == 2
    assert [e.attempts for e in rig.failures()] == [1, 2] and not rig.failures()[0].retriable
    assert not rig.db.quarantined and poison.id in rig.db.rows
    rig.report(poison, TIMEOUT)  # a passing fault ends the streak, and its backoff
    rig.process()
    assert rig.settlement.poison_streak == 0


def test_the_quarantine_policy_parks_the_key_after_max_attempts():
    rig = Rig(policy="quarantine", max_attempts=2)
    (poison,) = rig.marked("bad")
    rig.report(poison, TOO_LARGE)
    rig.process()
    assert not rig.db.quarantined
    rig.report(poison, TOO_LARGE)
    rig.process()
    assert rig.db.quarantined == {"bad": (poison.id, str(TOO_LARGE), 2)}
    assert ("quarantine", [poison.id]) in rig.journal
    assert rig.journal[-1] == ("release", ["bad"])
    quarantined = [e for e in rig.events if isinstance(e, RecordQuarantined)]
    assert [(e.record_id, e.attempts) for e in quarantined] == [(poison.id, 2)]
    assert rig.metrics.records_quarantined == 1
    # Its attempts are forgotten: a replayed key starts counting again.
    rig.report(poison, TOO_LARGE)
    rig.process()
    assert [e.attempts for e in rig.failures()] == [1, 2, 1]


def test_an_invalid_topic_keeps_its_first_cause_not_librdkafkas_cached_unknown_topic():
    # What librdkafka does with a topic name the broker refuses: TOPIC_EXCEPTION once, then
    # _UNKNOWN_TOPIC from its cache at every later produce (checked against Apache Kafka).
    invalid = DeliveryError("TOPIC_EXCEPTION", "Broker: Invalid topic", retriable=False)
    unknown = DeliveryError("_UNKNOWN_TOPIC", "Unable to produce message: Local: Unknown topic", retriable=False)
    rig = Rig(policy="quarantine", max_attempts=3)
    (poison,) = rig.marked("bad")
    for error in (invalid, unknown, unknown):
        rig.report(poison, error)
        rig.process()
    assert rig.db.quarantined == {"bad": (poison.id, str(invalid), 3)}
    [quarantined] = [e for e in rig.events if isinstance(e, RecordQuarantined)]
    assert quarantined.error == str(invalid) and "not a valid topic name" in quarantined.hint
    assert "create it" not in quarantined.hint
    # Each attempt's own error is reported as it came; the advice follows the first cause.
    assert [e.error for e in rig.failures()] == [str(invalid), str(unknown), str(unknown)]
    assert all("not a valid topic name" in e.hint for e in rig.failures())


def test_quarantine_needs_a_binding_that_can_quarantine():
    rig = Rig(policy="quarantine", max_attempts=1)
    (poison,) = rig.marked("bad")
    rig.report(poison, TOO_LARGE)
    rig.process(NoQuarantine(rig.db))
    assert not rig.db.quarantined and rig.metrics.records_quarantined == 0
    assert ("reset", [poison.id], "L1") in rig.journal


def test_a_retriable_failure_is_never_quarantined():
    rig = Rig(policy="quarantine", max_attempts=1)
    (rec,) = rig.marked("k")
    for _ in range(3):
        rig.report(rec, TIMEOUT)
        rig.process()
    assert not rig.db.quarantined and rig.metrics.reset_statements == 3


def test_an_ack_forgets_the_failed_attempts_before_it():
    rig = Rig()
    (rec,) = rig.marked("k")
    rig.report(rec, TIMEOUT)
    rig.process()
    rig.report(rec)
    rig.process()
    rig.report(rec, TIMEOUT)
    rig.process()
    assert [e.attempts for e in rig.failures()] == [1, 1]


def test_a_fatal_error_marks_the_producer_broken():
    rig = Rig()
    (rec,) = rig.marked("k")
    rig.report(rec, TIMEOUT)
    rig.process()
    assert not rig.processor.producer_broken
    rig.report(rec, FENCED)
    rig.process()
    assert rig.processor.producer_broken


def test_a_failing_purge_is_retried_and_keys_wait_for_it():
    rig = Rig()
    rig.db.purge_failures = 2
    records = rig.marked("a", "b")
    for r in records:
        rig.report(r)
    rig.process()
    assert rig.journal == [("purge", [r.id for r in records]), ("release", ["a", "b"])]
    assert rig.metrics.db_errors == 2 and len(rig.db) == 0


def test_retries_give_up_past_the_shutdown_deadline_leaving_rows_for_the_next_leader():
    rig = Rig()
    rig.db.purge_failures = 1_000_000
    rig.deadline = time.monotonic() - 1
    records = rig.marked("a", "b")
    for r in records:
        rig.report(r)
    rig.process()
    assert rig.journal == [("release", ["a", "b"])]
    assert rig.metrics.db_errors == 1 and rig.metrics.purge_statements == 0 and len(rig.db) == 2


def test_the_meter_reports_acknowledged_records():
    rig = Rig(min_metrics_interval=0.0)
    records = rig.marked("a", "b", "c")
    for r in records:
        rig.report(r)
    reported = time.monotonic()
    while time.monotonic() == reported:  # the meter rates over elapsed time: the clock must have moved
        pass
    rig.process()
    stats = [e.stats for e in rig.events if isinstance(e, MeterRead)]
    assert stats and stats[-1].total == 3


class TrickleProducer:
    """Reports one pending record per poll; sets ``done`` once none is left."""

    def __init__(self, rig: Rig, records: list[OutboxRecord], done: threading.Event) -> None:
        self.pending = [Flight(r, rig.reports.append) for r in records]
        self.done = done

    def poll(self, timeout: float) -> int:
        if self.pending:
            self.pending.pop(0)(None)
        if not self.pending:
            self.done.set()
        return 1


def serve(may_wait: bool) -> Rig:
    rig = Rig(coalesce_target=4)
    done = threading.Event()
    producer = TrickleProducer(rig, rig.marked(*(f"k{i}" for i in range(8))), done)
    rig.sender.producer = producer
    rig.window.hold_acks = may_wait
    rig.processor.serve(rig.db, done)
    assert len(rig.db) == 0
    return rig


def test_serve_coalesces_acks_into_fewer_purges_while_no_one_waits_for_them():
    assert serve(may_wait=True).db.purge_calls < 8


def test_serve_purges_at_once_when_someone_waits():
    assert serve(may_wait=False).db.purge_calls == 8


def test_serve_stops_when_the_producer_is_gone():
    rig = Rig()
    rig.processor.serve(rig.db, threading.Event())  # the sender has no producer
    assert rig.journal == []


def test_a_poison_failure_says_what_to_do(caplog):
    rig = Rig(policy="block", max_attempts=1)
    (poison,) = rig.marked("bad")
    with caplog.at_level("WARNING", logger="pyharvest"):
        rig.report(poison, TOO_LARGE)
        rig.process()
    (failed,) = rig.failures()
    for text in (failed.hint, caplog.text):
        assert "max.message.bytes" in text and "poisonPolicy: quarantine" in text
        assert "reaper quarantine list" in text
    rig.report(poison, TIMEOUT)
    rig.process()
    assert rig.failures()[-1].hint == ""  # a passing fault needs nobody


def test_a_quarantined_key_says_how_to_replay_or_discard_it(caplog):
    rig = Rig(policy="quarantine", max_attempts=1)
    (poison,) = rig.marked("bad")
    with caplog.at_level("ERROR", logger="pyharvest"):
        rig.report(poison, DeliveryError("TOPIC_AUTHORIZATION_FAILED", "not authorised", retriable=False))
        rig.process()
    (quarantined,) = [e for e in rig.events if isinstance(e, RecordQuarantined)]
    for text in (quarantined.hint, caplog.text):
        assert "Write on topic" in text and "--operation Write" in text and "reaper quarantine replay" in text
        assert "discard" in text


def test_every_poison_code_of_the_kafka_binding_has_a_hint():
    from pyharvest.core.publishing.poison_hints import _HINTS

    confluent = pytest.importorskip("pyharvest.bindings.kafka.confluent")
    from confluent_kafka import KafkaError

    names = [n for n in dir(KafkaError) if not n.startswith("__") and n.lstrip("_").isupper()]
    poison = [n for n in names if getattr(KafkaError, n) in confluent._POISON_CODES]
    assert "MSG_SIZE_TOO_LARGE" in poison
    for name in poison:
        assert name.lstrip("_") in _HINTS, name
