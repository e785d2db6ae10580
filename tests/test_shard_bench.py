"""The benchmarks' own logic: a shard's outage is its records' longest wait; a read-back tells hidden from lost."""

from __future__ import annotations

import pytest

from benchmarks.children import python_module
from benchmarks.shard_bench import FailoverRun, SteadyWriter, measure_outage
from pyharvest.core.outbox.keys import shard_of


def test_outage_is_the_longest_commit_to_publish_delay_per_shard():
    keys = [f"key-{i}" for i in range(40)]
    victim = shard_of(keys[0], 6)
    writer = SteadyWriter.__new__(SteadyWriter)
    writer.records = [(k, str(i).encode()) for i, k in enumerate(keys * 3)]
    writer.committed_at = [100.0 + i * 0.01 for i in range(len(writer.records))]
    killed_at = 100.5
    published = []
    for seq, (key, _value) in enumerate(writer.records):
        wait = 12.0 if shard_of(key, 6) == victim and writer.committed_at[seq] >= killed_at - 1 else 0.02
        published.append((key, seq, writer.committed_at[seq] + wait))
    published.append((*published[0][:2], published[0][2] + 50))  # a duplicate counts at its first publish
    run = FailoverRun(6, "SIGKILL", victim_shards=[victim])
    measure_outage(run, writer, published, killed_at, after=30)
    assert run.victim_max_delay_s == 12.0
    assert run.survivor_max_delay_s == 0.02
    assert run.outage_s_by_shard[victim] == 12.0
    paused = {k for k in keys if shard_of(k, 6) == victim}
    assert run.keys_paused_share == round(len(paused) / len(keys), 3)


def test_takeovers_are_read_from_a_reapers_log(tmp_path):
    from datetime import datetime

    from benchmarks.shard_bench import Reaper

    log = tmp_path / "reaper.log"
    log.write_text(
        "2026-11-23 22:00:00,100 INFO    pyharvest.shards: shard 2 assigned (partition 2 of 'leader')\n"
        "2026-11-23 22:00:09,250 INFO    pyharvest.shards: shard 4 assigned (partition 4 of 'leader')\n"
        "2026-11-23 22:00:09,300 INFO    pyharvest.shards: shard 4 revoked; waiting for its in-flight records\n"
        "2026-11-23 22:00:12,000 INFO    pyharvest.neli: acquired leader status (partition 0 of 'leader' assigned)\n"
    )
    reaper = Reaper.__new__(Reaper)
    reaper.log_path = log
    killed = datetime(2026, 11, 23, 22, 0, 5).timestamp()
    assert reaper.takeovers(killed) == {4: killed + 4.25, 0: killed + 7.0}


@pytest.mark.kafka
def test_a_read_back_tells_records_the_broker_hid_from_records_lost(kafka_bootstrap, topic_name):
    """``benchmarks.topic_check``: a record never written stays lost after the write to every
    partition, and the markers written then are left out of the report."""
    from confluent_kafka import Producer

    from benchmarks.topic_check import NUDGE_KEY, read_back
    from tests.helpers.topics import create_topic

    create_topic(kafka_bootstrap, topic_name, 3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    written = [(f"k{i % 5}", str(i).encode()) for i in range(50)]
    for key, value in written:
        producer.produce(topic_name, value, key)
    assert producer.flush(15) == 0
    never_written = ("k0", b"never")

    report, hidden = read_back(kafka_bootstrap, topic_name, [*written, never_written], timeout=5, idle=1.0)

    assert hidden == 0
    assert dict(report.lost) == {"k0": (b"never",)}
    assert report.reorder_count == 0
    assert report.unexpected_count == 0 and report.duplicate_count == 0
    assert report.expected_count == 51 and report.received_count == 50
    assert NUDGE_KEY not in report.lost


@pytest.mark.kafka
def test_the_broker_acknowledgement_check_runs_and_reads_everything_back(tmp_path):
    """``benchmarks/broker_acks.py`` at toy size, on an embedded broker of its own that it
    pauses once: every acknowledged message is read back (after a write, if the broker hid some)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [*python_module("benchmarks.broker_acks"), "--producers", "2", "--messages", "3000",
         "--replacements", "1", "--pauses", "1", "--pause-seconds", "0.5", "--read-timeout", "30"],
        cwd=root, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "round 1: 6,000 acknowledged" in proc.stdout, proc.stdout


@pytest.mark.kafka
def test_the_group_handover_check_hands_a_stopped_members_partitions_to_the_others(kafka_bootstrap, tmp_path):
    """``benchmarks/group_handover.py`` at toy size, with the leader group's own consumer
    settings: after a SIGTERM and after a SIGKILL, the other members own every partition, and
    incremental rebalancing left them their own throughout. No timing is asserted."""
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "handover.json"
    proc = subprocess.run(
        [*python_module("benchmarks.group_handover"), "--bootstrap", kafka_bootstrap, "--rounds", "1",
         "--heartbeat-timeout", "2", "--json", str(out)],
        cwd=root, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    runs = json.loads(out.read_text())
    assert [r["signal"] for r in runs] == ["SIGTERM", "SIGKILL"]
    for r in runs:
        assert r["session_s"] == 6.0 and r["victim_partitions"], r
        assert r["handover_s"] is not None and r["survivors_kept_theirs"], r
