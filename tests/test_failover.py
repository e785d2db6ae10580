"""Failover between reaper processes: the leader is stopped (SIGTERM), then killed (SIGKILL),
mid-stream; the survivors finish the job with nothing lost and per-key order held."""

from __future__ import annotations

import signal
import threading
import uuid

import pytest
import sqlalchemy as sa
import yaml

from pyharvest import OutboxRecord, stasher
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.groups import settled
from tests.helpers.outbox import collapse_one_off_duplicates, outbox_count, wait_empty
from tests.helpers.reapers import Reaper, stop_all
from tests.helpers.topics import create_topic, read_topic, values_per_key
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]



def test_leader_stopped_then_killed_mid_stream(
    tmp_path, kafka_bootstrap, database_url, table_name, topic_name, group_protocol
):
    create_outbox_table(database_url, table_name)
    create_topic(kafka_bootstrap, topic_name, partitions=4)
    group = f"failover-{uuid.uuid4().hex[:8]}"
    config = {
        "harvest": {
            "baseKafkaConfig": {"bootstrap.servers": kafka_bootstrap},
            "leaderGroupID": group,
            "dataSource": database_url,
            "outboxTable": table_name,
            "groupProtocol": group_protocol,
            "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms", "maxInFlightRecords": 200},
        },
        "logging": {"level": "Info"},
    }
    config_path = tmp_path / "reaper.yaml"
    config_path.write_text(yaml.safe_dump(config))

    keys = [f"k{i}" for i in range(40)]
    sequence = dict.fromkeys(keys, 0)
    stop_writing = threading.Event()
    errors: list[BaseException] = []
    engine = sa.create_engine(database_url)

    def writer() -> None:
        # One writer: every key's records are causally ordered.
        try:
            i = 0
            while not stop_writing.is_set():
                with engine.begin() as conn:
                    prepared = stasher.Stasher(table_name).prepare(conn)
                    for _ in range(20):
                        key = keys[i % len(keys)]
                        prepared.stash(OutboxRecord(topic_name, key, f"{key}:{sequence[key]}".encode()))
                        sequence[key] += 1
                        i += 1
                stop_writing.wait(0.01)  # the writer's pace, cut short by the stop
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def flowing(records: int) -> None:
        """Wait until the leader has purged ``records`` more of the writer's records."""
        def purged() -> int:
            written = sum(sequence.values())  # read first: the outbox only has fewer rows since
            return written - outbox_count(database_url, table_name)

        before = purged()
        wait_until(lambda: purged() >= before + records, 60, f"{records} more records purged")

    reapers = [Reaper(config_path, tmp_path / f"reaper-{n}.log") for n in range(2)]
    writing = threading.Thread(target=writer)
    writing.start()
    try:
        wait_until(lambda: any(r.is_leader() for r in reapers), 60, "a first leader")
        flowing(200)
        first = next(r for r in reapers if r.is_leader())
        first.signal(signal.SIGTERM)
        assert first.wait(30) == 0, first.log()
        assert "stopped" in first.log()
        survivor = next(r for r in reapers if r is not first)
        wait_until(survivor.is_leader, 60, "the standby to take over after SIGTERM")
        # Bring a standby back (the rebalance may move leadership to it), then kill whoever
        # leads outright, with its in-flight window full.
        reapers.append(Reaper(config_path, tmp_path / "reaper-2.log"))
        live = [survivor, reapers[2]]
        wait_until(settled({"bootstrap.servers": kafka_bootstrap}, group, 2), 60, "the group to settle with two members")
        wait_until(lambda: sum(r.is_leader() for r in live) == 1, 60, "the group to settle on one leader")
        victim = next(r for r in live if r.is_leader())
        heir = next(r for r in live if r is not victim)
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        wait_until(heir.is_leader, 90, "the standby to take over after SIGKILL")
        flowing(200)
        stop_writing.set()
        writing.join()
        assert not errors, errors
        wait_empty(database_url, table_name, 120)
    finally:
        stop_writing.set()
        writing.join()
        stop_all(reapers)
        engine.dispose()

    total = sum(sequence.values())
    got = values_per_key(read_topic(kafka_bootstrap, topic_name, expect=total))
    duplicates = 0
    for key in keys:
        expected = [f"{key}:{i}".encode() for i in range(sequence[key])]
        received = got.get(key, [])
        assert collapse_one_off_duplicates(received) == expected, f"key {key}: lost or reordered"
        duplicates += len(received) - len(expected)
    print(f"failover: {total} records, {duplicates} one-off duplicates")
