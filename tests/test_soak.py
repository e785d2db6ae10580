"""Soaks.

The chaos soak: three ``reaper`` processes contend for one outbox while a writer stashes
continuously over many keys; every few seconds the leader is killed (SIGKILL or SIGTERM, at
random) or the broker link is cut through the fault proxy. At the end the verifier must report
nothing lost and nothing reordered; the duplicate count is printed.

``PYHARVEST_SOAK_SECONDS`` sets how long the chaos lasts (default 20: CI's short run). The
long run is marked ``slow``: ``PYHARVEST_SOAK_SECONDS=600 pytest -m slow tests/test_soak.py``.
``PYHARVEST_SOAK_SEED`` replays a run's choices.

The steady soak: ``benchmarks/soak.py`` for two minutes at a modest rate, one reaper, no
faults: every record arrives once in order, the outbox empties, and nothing the reaper holds
(memory, threads, file descriptors) or the backlog grows without bound. No timing is
asserted: the figures are the benchmark's (docs/performance.md), not the test's.
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from benchmarks.children import python_module
from benchmarks.topic_check import read_back
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.faults.kafka import proxied_broker
from tests.helpers.fixtures.kafka import on_embedded_broker
from tests.helpers.outbox import Writer, outbox_count
from tests.helpers.reapers import Reaper, pause_at_random, stop_all
from tests.helpers.topics import create_topic
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka]

SHORT = 20.0


def _soak(dialect: str, url: str, table: str, topic: str, tmp_path, seconds: float) -> None:
    if dialect != "postgresql":
        pytest.skip("the soak is dialect-independent: PostgreSQL covers it")
    seed = int(os.environ.get("PYHARVEST_SOAK_SEED", random.randrange(1 << 30)))
    rnd = random.Random(seed)
    print(f"soak: {seconds:.0f}s, seed {seed}")
    create_outbox_table(url, table)
    with proxied_broker() as (broker, proxy):
        bootstrap = broker.bootstrap_servers
        create_topic(bootstrap, topic, partitions=4)
        cfg_path = tmp_path / "reaper.yaml"
        cfg_path.write_text(yaml.safe_dump({
            "harvest": {
                "baseKafkaConfig": {"bootstrap.servers": bootstrap}, "leaderGroupID": f"soak-{uuid.uuid4().hex[:8]}",
                "dataSource": url, "outboxTable": table,
                "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms", "maxInFlightRecords": 500,
                           "shutdownTimeout": "3s"},
            },
            "logging": {"level": "Info"},
        }))
        n = 0

        def spawn() -> Reaper:
            nonlocal n
            n += 1
            return Reaper(cfg_path, tmp_path / f"reaper-{n}.log")

        reapers = [spawn() for _ in range(3)]
        writer = Writer(url, table, topic, keys=200, batch=20, pause=0.02).start()
        actions: list[str] = []
        try:
            wait_until(lambda: any(r.is_leader() for r in reapers), 60, "a first leader")
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                pause_at_random(rnd, 3, 5)
                action = rnd.choice(("SIGKILL", "SIGTERM", "cut"))
                leaders = [r for r in reapers if r.is_leader()]
                if action == "cut" or not leaders:
                    proxy.reset_connections()
                    actions.append("cut")
                    continue
                victim = leaders[0]
                victim.signal(signal.SIGKILL if action == "SIGKILL" else signal.SIGTERM)
                code = victim.wait(20)
                assert action == "SIGKILL" or code == 0, victim.log()[-3000:]
                actions.append(action)
                reapers[reapers.index(victim)] = spawn()
            writer.stop()
            wait_until(lambda: outbox_count(url, table) == 0, 120, "the survivors to drain the outbox")
        finally:
            writer._stop.set()
            stop_all(reapers)
        report, _hidden = read_back(bootstrap, topic, writer.expected, timeout=90, nudge_missing=on_embedded_broker())
        print(f"soak: actions {actions}")
        print(f"soak: {len(writer.expected)} records, {report.duplicate_count} duplicates")
        print(report)
        assert report.lost_count == 0 and report.reorder_count == 0, f"seed {seed}: {report}"
        assert report.ok, f"seed {seed}: {report}"


@pytest.mark.timeout(300)
def test_soak_short(dialect, database_url, table_name, topic_name, tmp_path):
    seconds = float(os.environ.get("PYHARVEST_SOAK_SECONDS", SHORT))
    _soak(dialect, database_url, table_name, topic_name, tmp_path, min(seconds, 60.0))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_soak_long(dialect, database_url, table_name, topic_name, tmp_path):
    if "PYHARVEST_SOAK_SECONDS" not in os.environ:
        pytest.skip("set PYHARVEST_SOAK_SECONDS for the long soak")
    _soak(dialect, database_url, table_name, topic_name, tmp_path, float(os.environ["PYHARVEST_SOAK_SECONDS"]))


STEADY_MINUTES, STEADY_RATE, STEADY_INTERVAL = 2.0, 500, 10.0


@pytest.mark.timeout(480)
def test_steady_soak_short(dialect, database_url, table_name, kafka_bootstrap, tmp_path):
    """Two minutes of ``benchmarks/soak.py``: a correctness check, not a measurement."""
    if dialect != "postgresql":
        pytest.skip("the steady soak is dialect-independent in what it checks: PostgreSQL covers it")
    if on_embedded_broker():
        pytest.skip("the steady soak's LogAppendTime topic needs Apache Kafka")
    out = tmp_path / "soak"
    proc = subprocess.run(
        [*python_module("benchmarks.soak"), "--database", database_url, "--bootstrap", kafka_bootstrap,
         "--minutes", str(STEADY_MINUTES), "--rate", str(STEADY_RATE), "--interval", str(STEADY_INTERVAL),
         "--table", table_name, "--out", str(out)],
        cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=460,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(Path(f"{out}.json").read_text())
    assert summary["lost"] == 0 and summary["reordered"] == 0, summary
    assert summary["records"] >= STEADY_RATE * STEADY_MINUTES * 60 * 0.5, summary  # the writer ran
    assert summary["reaper_exit"] == 0, summary
    wait_until(lambda: outbox_count(database_url, table_name) == 0, 60, "the reaper to empty the outbox")
    with open(f"{out}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 6, rows
    # From the second row on (the first includes start-up): nothing the reaper holds keeps growing.
    settled, last = rows[1], rows[-1]
    assert int(last["threads"]) <= int(settled["threads"]) + 2, rows
    assert int(last["fds"]) <= int(settled["fds"]) + 4, rows
    assert float(last["rss_mib"]) <= 1.5 * float(settled["rss_mib"]) + 30, rows
    # The backlog is bounded: whatever a loaded machine does to latency, the reaper keeps up.
    assert max(int(r["backlog"]) for r in rows[1:]) <= STEADY_RATE * STEADY_INTERVAL * 3, rows
