"""A real Prometheus (Debian's package) scrapes a running ``reaper`` with the project's alerting
rules loaded (a copy whose ``for:`` durations are shortened): the lag query answers while it
runs, and the no-leader alert fires once it is gone."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.tools import free_port, require_tool
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "pyharvest" / "monitoring" / "pyharvest-alerts.yml"

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback only
        return json.loads(r.read())


class Prometheus:
    """``prometheus`` on a free loopback port, its data and log in ``folder``."""

    def __init__(self, folder: Path, target: str, rules: Path) -> None:
        binary = require_tool("prometheus", "prometheus")
        config = folder / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "reaper", "static_configs": [{"targets": [target]}]}],
        }))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = folder / "prometheus.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=folder,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited ({self.proc.returncode}):\n{self.log()}"
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:  # noqa: S310
                return r.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = get_json(self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]  # type: ignore[no-any-return]

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in get_json(self.url + "/api/v1/alerts")["data"]["alerts"] if a["labels"]["alertname"] == name]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def shortened_rules(folder: Path) -> Path:
    """The project's rules with every ``for:`` at 2s, so that the test needs no minutes."""
    text, n = re.subn(r"(?m)^(\s+for:) \S+$", r"\1 2s", RULES.read_text())
    assert n >= 5
    copy = folder / "pyharvest-alerts.yml"
    copy.write_text(text)
    return copy


def test_prometheus_answers_the_lag_query_and_fires_no_leader_when_the_reaper_stops(tmp_path, kafka_bootstrap):
    from pyharvest.bindings.sql import create_outbox_table
    from tests.helpers.reapers import ReaperProcess

    require_tool("prometheus", "prometheus")
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    create_outbox_table(url)
    config = {
        "harvest": {
            "baseKafkaConfig": {"bootstrap.servers": kafka_bootstrap},
            "leaderGroupID": f"prometheus-{uuid.uuid4().hex[:8]}",
            "dataSource": url,
            "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms"},
        },
        "metrics": {"address": "127.0.0.1", "port": 0, "ageInterval": "500ms"},
        "logging": {"level": "Info"},
    }
    reaper = ReaperProcess(config, tmp_path)
    prometheus: Prometheus | None = None
    try:
        target = reaper.ops_url().removeprefix("http://")
        prometheus = Prometheus(tmp_path, target, shortened_rules(tmp_path))
        wait_until(prometheus.ready, 60, "Prometheus to be ready")
        rules = get_json(prometheus.url + "/api/v1/rules")["data"]["groups"][0]["rules"]
        assert len(rules) == 9 and {r["health"] for r in rules} <= {"ok", "unknown"}, rules

        # The lag query of the dashboard and OutboxLagging answers with the reaper's age.
        lag = 'max by (job) (pyharvest_oldest_record_age_seconds{job=~"reaper"})'
        wait_until(lambda: prometheus.query(lag), 60, "the lag query to answer")
        [series] = prometheus.query(lag)
        assert series["metric"] == {"job": "reaper"} and float(series["value"][1]) >= 0
        wait_until(lambda: prometheus.query("pyharvest_leader == 1"), 60, "the reaper to lead")
        # Before the first scrape nothing was there (absent): the alert goes quiet once one leads.
        wait_until(lambda: prometheus.alerts("OutboxNoLeader") == [], 30, "OutboxNoLeader to be quiet")

        assert reaper.stop() == 0
        wait_until(lambda: [a["state"] for a in prometheus.alerts("OutboxNoLeader")] == ["firing"], 60,
                   "OutboxNoLeader to fire")
        [alert] = prometheus.alerts("OutboxNoLeader")
        assert alert["labels"]["severity"] == "critical", alert
        assert prometheus.query("up") and prometheus.query("up")[0]["value"][1] == "0"
    finally:
        reaper.stop()
        if prometheus is not None:
            prometheus.stop()
