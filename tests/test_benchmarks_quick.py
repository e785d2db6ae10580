"""The benchmark's scenarios at toy sizes: correctness (nothing lost, order held), not timing.

The benchmark verifies its own output, so a scenario that loses or reorders records fails
here; the figures it prints mean nothing at these sizes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.children import python_module

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent


def test_every_scenario_runs_and_verifies(dialect, database_url, kafka_bootstrap, tmp_path):
    if dialect == "sqlite":
        # A file both the benchmark's processes can reach.
        database_url = f"sqlite:///{tmp_path / 'bench.db'}"
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [*python_module("benchmarks.harvest_bench"), "--quick", "--database", database_url,
         "--bootstrap", kafka_bootstrap, "--scenarios", "drain,skew,large,steady,stasher", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [r["scenario"] for r in results] == ["drain", "skew", "large", "steady", "stasher"]
    for r in results:
        assert r["lost"] == 0 and r["reordered"] == 0, r
        assert r["records_per_second"] > 0, r


def test_both_delivery_modes_run_side_by_side(dialect, database_url, kafka_bootstrap, tmp_path):
    """``--delivery at-least-once,exactly-once`` at toy size: each scenario in each mode, and
    the exactly-once runs read back with no duplicate (Apache Kafka; PostgreSQL is enough)."""
    from tests.helpers.fixtures.kafka import on_embedded_broker

    if dialect != "postgresql" or on_embedded_broker():
        pytest.skip("exactly-once needs Apache Kafka; one live database proves the plumbing")
    out = tmp_path / "modes.json"
    proc = subprocess.run(
        [*python_module("benchmarks.harvest_bench"), "--quick", "--database", database_url,
         "--bootstrap", kafka_bootstrap, "--scenarios", "drain,steady", "--delivery", "at-least-once,exactly-once",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [(r["scenario"], r["delivery"]) for r in results] == [
        ("drain", "at-least-once"), ("drain", "exactly-once"), ("steady", "at-least-once"), ("steady", "exactly-once")]
    for r in results:
        assert r["lost"] == 0 and r["reordered"] == 0 and r["records_per_second"] > 0, r
        if r["delivery"] == "exactly-once":
            assert r["duplicates"] == 0 and r["notes"]["transactions"] >= 1, r
    assert all("visible_ms_p50_p99_max" in r["notes"] for r in results if r["scenario"] == "steady")


def test_shard_drain_runs_and_verifies(dialect, database_url, kafka_bootstrap, tmp_path):
    """The sharded drain at toy size, through the latency proxy too (PostgreSQL: the proxy
    speaks TCP, and one live database is enough to prove the scenario's plumbing)."""
    if dialect != "postgresql":
        pytest.skip("the shard benchmark's quick run uses PostgreSQL")
    out = tmp_path / "shards.json"
    proc = subprocess.run(
        [*python_module("benchmarks.shard_bench"), "--quick", "--database", database_url,
         "--bootstrap", kafka_bootstrap, "--scenarios", "drain", "--layouts", "1x1,2x4", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    runs = json.loads(out.read_text())["drain"]
    assert [(r["processes"], r["shards"], r["added_rtt_ms"], r["keys"]) for r in runs] == [
        (1, 1, 0, 1000), (2, 4, 0, 1000), (1, 1, 1, 1000), (2, 4, 1, 1000)]
    for r in runs:
        assert r["lost"] == 0 and r["reordered"] == 0 and r["records_per_second"] > 0, r


def test_idle_benchmark_runs(dialect, database_url, kafka_bootstrap, tmp_path):
    """``benchmarks/idle_bench.py`` at toy sizes: every lone record is acknowledged, and the
    idle scenario reports the leader's marks (on PostgreSQL, what NOTIFY costs writers too)."""
    if dialect == "sqlite":
        database_url = f"sqlite:///{tmp_path / 'bench.db'}"
    if dialect not in ("sqlite", "postgresql", "mysql"):
        pytest.skip("the idle benchmark reads PostgreSQL's and MariaDB's counters; others are not benchmarked")
    scenarios = "idle,lone" + (",notify-cost" if dialect == "postgresql" else "")
    out = tmp_path / "idle.json"
    proc = subprocess.run(
        [*python_module("benchmarks.idle_bench"), "--database", database_url, "--bootstrap", kafka_bootstrap,
         "--scenarios", scenarios, "--idle-seconds", "1", "--settle", "1", "--lone-records", "5",
         "--notify-seconds", "0.5", "--notify-writers", "1", "--notify-batches", "1", "--notify-rounds", "1",
         "--notify-rate", "0", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    results = {r["scenario"]: r["figures"] for r in json.loads(out.read_text())}
    assert results["idle"]["marks_per_s"] > 0
    assert results["lone"]["acked"] == 5
    if dialect == "postgresql":
        assert results["notify-cost"]["w1-b1-every-tx"]["tx_per_s"][0] > 0
