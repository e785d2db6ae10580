"""Soak: three ``reaper`` processes contend for one outbox while a writer stashes
continuously over many keys; every few seconds the leader is killed (SIGKILL or SIGTERM, at
random) or the broker link is cut through the fault proxy. At the end the verifier must report
nothing lost and nothing reordered; the duplicate count is printed.

``PYHARVEST_SOAK_SECONDS`` sets how long the chaos lasts (default 20: CI's short run). The
long run is marked ``slow``: ``PYHARVEST_SOAK_SECONDS=600 pytest -m slow tests/test_soak.py``.
``PYHARVEST_SOAK_SEED`` replays a run's choices.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid

import pytest
import yaml

from benchmarks.topic_check import read_back
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.faults.kafka import proxied_broker
from tests.helpers.fixtures.kafka import on_embedded_broker
from tests.helpers.outbox import Writer, outbox_count
from tests.helpers.reapers import Reaper, stop_all
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
                time.sleep(rnd.uniform(3, 5))
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
