"""Poison records against live databases (``poisonPolicy: quarantine`` and ``block``).

The binding: a quarantined key's rows are skipped by every mark, replay and discard resume the
key in order, the plain mark statement is untouched when the quarantine is off. End to end:
a record Kafka refuses for good (larger than the producer's ``message.max.bytes``) is tried
``maxDeliveryAttempts`` times, its key is parked while every other key flows, ``reaper
quarantine list`` shows it, ``discard`` and (after the limit is raised) ``replay`` resume the
keys in order. Under ``block`` the record is retried with growing pauses and nothing of its
key overtakes it.
"""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa

from pyharvest import Config, Harvest, Limits, OutboxRecord
from pyharvest._cli import main as reaper
from pyharvest.bindings.sql import create_binding, create_outbox_table
from pyharvest.bindings.sql.quarantine import QuarantineTable, quarantine_table_name
from pyharvest.core.ports.database import QuarantineBinding, QuarantineEntry
from pyharvest.core.telemetry.events import DeliveryFailed, RecordQuarantined
from pyharvest.plugins.api import TableName
from pyharvest.verify import verify_topic
from tests.helpers.outbox import outbox_count, stash_all
from tests.helpers.topics import create_topic
from tests.helpers.waiting import wait_until

SMALL_LIMIT = 20_000  # the producer's message.max.bytes in the "broken" configuration
POISON = b"P" * 30_000



# ---------------------------------------------------------------------- the binding


def test_quarantined_key_is_skipped_by_marks_and_replay_or_discard_resume_it(database_url, table_name):
    create_outbox_table(database_url, table_name)
    stash_all(database_url, table_name, [OutboxRecord("t", k, f"{k}{i}") for i in range(3) for k in ("a", "b")])
    binding = create_binding(database_url, table_name, quarantine=True)
    try:
        assert isinstance(binding, QuarantineBinding)
        assert binding.count() == 6
        binding.ping()
        first = binding.mark("leader-1", 100)
        a0 = next(r for r in first if r.key == "a")
        assert binding.quarantine([QuarantineEntry(a0, "MSG_SIZE_TOO_LARGE: too big", 3)]) == 1
        # Parking the same key again keeps the first entry.
        assert binding.quarantine([QuarantineEntry(first[-1], "other", 9)] if first[-1].key == "a" else []) == 0
        listed = binding.quarantined()
        assert [(q.key, q.record_id, q.topic, q.attempts) for q in listed] == [("a", a0.id, "t", 3)]
        assert "too big" in listed[0].error and listed[0].quarantine_time is not None
        # A remark under a new leader id takes every row but the parked key's.
        again = binding.mark("leader-2", 100)
        assert {r.key for r in again} == {"b"} and len(again) == 3
        assert binding.replay("a") and not binding.replay("a")
        resumed = binding.mark("leader-3", 100)
        assert [r.value for r in resumed if r.key == "a"] == [b"a0", b"a1", b"a2"]
        # Discard: the poison record goes, the key resumes with the one after it.
        binding.quarantine([QuarantineEntry(a0, "again", 1)])
        discarded = binding.discard("a")
        assert discarded is not None and discarded.record_id == a0.id
        assert binding.discard("a") is None
        assert [r.value for r in binding.mark("leader-4", 100) if r.key == "a"] == [b"a1", b"a2"]
        assert binding.count() == 5
    finally:
        binding.dispose()


def test_quarantine_off_keeps_the_plain_mark_and_switches_over_on_first_use(database_url, table_name):
    create_outbox_table(database_url, table_name)
    stash_all(database_url, table_name, [OutboxRecord("t", "a", "x"), OutboxRecord("t", "b", "y")])
    plain = create_binding(database_url, table_name)
    engine = sa.create_engine(database_url)
    try:
        default_marker = plain.dialect.mark_strategy(plain.outbox)

        def sql(marker):
            return [str(s.compile(engine)) for s in marker.statements(10)]

        assert sql(default_marker) == sql(plain.marker)
        assert "quarantine" not in " ".join(sql(default_marker))
        assert plain.quarantined() == [] and plain.replay("a") is False
        assert not QuarantineTable.for_outbox(plain.outbox).exists(engine)
        rec = plain.mark("l1", 10)[0]
        # The engine quarantines through a binding built without the flag: the table appears
        # and marks skip the key from then on.
        plain.quarantine([QuarantineEntry(rec, "boom", 1)])
        assert QuarantineTable.for_outbox(plain.outbox).exists(engine)
        assert {r.key for r in plain.mark("l2", 10)} == {"b"}
    finally:
        plain.dispose()
        engine.dispose()


def test_init_db_creates_the_quarantine_table(database_url, table_name):
    create_outbox_table(database_url, table_name, quarantine=True)
    engine = sa.create_engine(database_url)
    try:
        assert QuarantineTable.for_outbox(TableName(table_name)).exists(engine)
    finally:
        engine.dispose()


def test_long_outbox_names_get_a_quarantine_name_within_the_identifier_limit():
    long = TableName("o" * 63)
    q = quarantine_table_name(long)
    assert len(q.name) <= 63 and q.name.endswith("_quarantine")
    assert q != quarantine_table_name(TableName("o" * 62 + "p"))
    assert quarantine_table_name(TableName("orders", "app")) == TableName("orders_quarantine", "app")


# ---------------------------------------------------------------------- end to end


def poison_config(kafka_config, url: str, table: str, group: str, *, policy: str, small: bool) -> Config:
    return Config(
        base_kafka_config=dict(kafka_config),
        producer_kafka_config={"message.max.bytes": SMALL_LIMIT} if small else {},
        leader_group_id=group,
        data_source=url,
        outbox_table=table,
        poison_policy=policy,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05, io_error_backoff=0.05, max_delivery_attempts=3),
    )


@pytest.mark.kafka
@pytest.mark.timeout(180)
def test_poison_key_is_quarantined_others_flow_and_discard_or_replay_resume_in_order(
    kafka_config, kafka_bootstrap, database_url, table_name, topic_name, capsys
):
    create_outbox_table(database_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    records: list[OutboxRecord] = []
    for i in range(4):
        records.append(OutboxRecord(topic_name, "bad-a", POISON if i == 1 else f"a{i}".encode()))
        records.append(OutboxRecord(topic_name, "bad-b", POISON if i == 1 else f"b{i}".encode()))
        records += [OutboxRecord(topic_name, f"good-{k}", f"g{k}-{i}".encode()) for k in range(5)]
    stash_all(database_url, table_name, records)
    group = f"quarantine-{uuid.uuid4().hex[:8]}"
    events: list[object] = []
    cli = ["--data-source", database_url, "--table", table_name]

    first = Harvest(poison_config(kafka_config, database_url, table_name, group, policy="quarantine", small=True))
    first.set_event_handler(events.append)
    with first:
        # The two poison records and the two records behind each stay; all else goes.
        wait_until(lambda: outbox_count(database_url, table_name) == 6, 60, "every unpoisoned key to drain")
        wait_until(lambda: first.metrics.records_quarantined == 2, 30, "two keys quarantined")
        failures = [e for e in events if isinstance(e, DeliveryFailed)]
        for key in ("bad-a", "bad-b"):
            assert [e.attempts for e in failures if e.key == key] == [1, 2, 3], failures
            assert not any(e.retriable for e in failures if e.key == key)
        assert {e.key for e in events if isinstance(e, RecordQuarantined)} == {"bad-a", "bad-b"}
        assert reaper(["quarantine", "list", *cli]) == 0
        listed = capsys.readouterr().out
        assert "2 quarantined key(s)" in listed and "'bad-a'" in listed and "'bad-b'" in listed
        assert "SIZE" in listed  # Kafka's reason is shown
        # Discard bad-a's poison record: the rest of bad-a flows, in order.
        assert reaper(["quarantine", "discard", *cli, "--key", "bad-a"]) == 0
        wait_until(lambda: outbox_count(database_url, table_name) == 3, 30, "bad-a to resume after the discard")
        assert reaper(["quarantine", "replay", *cli, "--key", "bad-a"]) == 1  # no longer parked
        capsys.readouterr()

    # The operator raises the limit and replays bad-b: its poison record goes first, then the rest.
    second = Harvest(poison_config(kafka_config, database_url, table_name, group, policy="quarantine", small=False))
    with second:
        # Leading and marking (the parked keys' rows left out): had they not been parked
        # across the restart, these marks would have taken them.
        wait_until(lambda: second.is_leader and second.metrics.marks >= 3, 60, "the second harvester to mark")
        assert outbox_count(database_url, table_name) == 3  # still parked across restarts
        assert reaper(["quarantine", "replay", *cli, "--key", "bad-b"]) == 0
        wait_until(lambda: outbox_count(database_url, table_name) == 0, 60, "bad-b to drain after the replay")
    assert reaper(["quarantine", "list", *cli]) == 0
    assert "no quarantined keys" in capsys.readouterr().out

    expected = [(r.key, r.value) for r in records if not (r.key == "bad-a" and r.value == POISON)]
    report = verify_topic(kafka_bootstrap, topic_name, expected, timeout=30)
    assert report.ok, str(report)


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_block_policy_retries_with_backoff_and_nothing_overtakes_the_poison_record(
    kafka_config, kafka_bootstrap, dialect, database_url, table_name, topic_name
):
    if dialect != "postgresql":
        pytest.skip("the block policy is dialect-independent: PostgreSQL covers it")
    create_outbox_table(database_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=1)
    records = [OutboxRecord(topic_name, "bad", POISON), OutboxRecord(topic_name, "bad", b"after")]
    # One record per good key: under block every retry of the poison record forces a remark
    # and a growing pause for *all* keys (see docs/guarantees.md), so a key with several
    # records would drain one record per retry.
    records += [OutboxRecord(topic_name, f"good-{i}", f"g{i}".encode()) for i in range(30)]
    stash_all(database_url, table_name, records)
    group = f"block-{uuid.uuid4().hex[:8]}"
    events: list[tuple[float, object]] = []
    h = Harvest(poison_config(kafka_config, database_url, table_name, group, policy="block", small=True))
    h.set_event_handler(lambda e: events.append((time.monotonic(), e)))
    with h:
        wait_until(lambda: outbox_count(database_url, table_name) == 2, 60, "the good keys to drain")
        wait_until(lambda: sum(isinstance(e, DeliveryFailed) for _t, e in events) >= 5, 60, "five attempts")
        assert outbox_count(database_url, table_name) == 2  # nothing of "bad" went
        failures = [(t, e) for t, e in events if isinstance(e, DeliveryFailed)]
        assert [e.attempts for _t, e in failures][:5] == [1, 2, 3, 4, 5]  # never quarantined under block
        # Which settings to raise: the producer's, the topic's, and the stasher's guard.
        hint = failures[0][1].hint
        assert "message.max.bytes in the reaper's producerKafkaConfig" in hint and "max_record_bytes" in hint
        assert not any(isinstance(e, RecordQuarantined) for _t, e in events)
        gaps = [b[0] - a[0] for a, b in zip(failures, failures[1:], strict=False)]
        assert gaps[3] > gaps[0], f"no growing backoff between attempts: {gaps}"
        assert sum(v for k, v in h.metrics.delivery_errors.items() if "SIZE" in k) >= 5
        assert h.metrics.records_quarantined == 0
    # With the limit raised, the parked key drains in order.
    with Harvest(poison_config(kafka_config, database_url, table_name, group, policy="block", small=False)):
        wait_until(lambda: outbox_count(database_url, table_name) == 0, 60, "the parked key to drain")
    report = verify_topic(kafka_bootstrap, topic_name, [(r.key, r.value) for r in records], timeout=30)
    assert report.ok, str(report)


def test_quarantine_cli_usage_errors(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert reaper(["quarantine", "replay", "--data-source", url]) == 2
    assert "--key is required" in capsys.readouterr().err
    assert reaper(["quarantine", "list", "--data-source", url, "--table", "x; DROP TABLE y"]) == 2
    assert "not a valid table name" in capsys.readouterr().err
    assert reaper(["quarantine", "list", "--data-source", url, "--table", "missing"]) == 1
    assert "does not exist" in capsys.readouterr().err
