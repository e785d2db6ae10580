"""pyharvest/monitoring/pyharvest-alerts.yml and pyharvest-dashboard.json (their one copy, shipped in the wheel): promtool
accepts the rules and their unit tests pass (tests/prometheus/alerts_test.yml), the dashboard is
well formed, and every metric either file uses is served by ``/metrics`` of a real harvester in
at least one configuration (at least once, exactly once, sharded)."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from tests.helpers.tools import require_tool

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "pyharvest" / "monitoring" / "pyharvest-alerts.yml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "pyharvest" / "monitoring" / "pyharvest-dashboard.json"

_METRIC = re.compile(r"\b(pyharvest_[a-z0-9_]+)")


def rule_expressions() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def used_metric_names() -> set[str]:
    return {m for expr in [*rule_expressions().values(), *dashboard_expressions()] for m in _METRIC.findall(expr)}


def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    promtool = require_tool("promtool", "prometheus")
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 9 rules found" in checked.stdout
    tested = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=60,
                            cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_rules_that_must_fire_when_the_reaper_is_gone_use_absent():
    exprs = rule_expressions()
    assert set(exprs) == {"OutboxLagging", "OutboxNoLeader", "OutboxTwoLeaders", "OutboxStalled",
                          "OutboxDeliveryErrors", "OutboxQuarantined", "OutboxKeysBlocked", "OutboxNotReady",
                          "OutboxCleanupHeldBack"}
    assert "absent(pyharvest_leader)" in exprs["OutboxNoLeader"]
    # Two leaders are counted per shard: a sharded deployment's processes each lead shards.
    assert "by (job, shard)" in exprs["OutboxTwoLeaders"]
    assert "pyharvest_oldest_record_age_seconds" in exprs["OutboxLagging"]


def test_the_dashboard_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "pyharvest" and dashboard["title"] == "pyharvest"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("lag", "latency", "backlog", "leaders per shard", "delivery errors", "quarantine", "transactions"):
        assert topic in titles, topic
    for panel in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
            for target in panel["targets"]:
                # Every query is scoped to the chosen jobs.
                assert 'job=~"$job"' in target["expr"], target["expr"]
    quantiles = [e for e in dashboard_expressions() if "pyharvest_publish_latency_seconds_bucket" in e]
    assert len(quantiles) >= 3


_AGGREGATION = re.compile(r"\b(sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\))?\s*\(")


def test_every_dashboard_query_splits_by_job():
    # With several jobs chosen, a line per job: a latency summed over jobs hides the slow one.
    for expr in dashboard_expressions():
        if "label_values" in expr:
            continue
        for aggregation, labels in _AGGREGATION.findall(expr):
            assert "job" in [label.strip() for label in labels.split(",")], f"{aggregation} without job: {expr}"
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            assert "{{job}}" in target["legendFormat"] or "{{instance}}" in target["legendFormat"], panel["title"]


def test_reaper_monitoring_export_writes_the_packages_files(tmp_path):
    from tests.helpers.cli import assert_one_line_error, reaper

    out = tmp_path / "monitoring"
    done = reaper("monitoring", "export", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(out / RULES.name), str(out / DASHBOARD.name)]
    assert (out / RULES.name).read_bytes() == RULES.read_bytes()
    assert (out / DASHBOARD.name).read_bytes() == DASHBOARD.read_bytes()
    (out / DASHBOARD.name).write_text("{}")  # edited in place: not overwritten unasked
    assert_one_line_error(reaper("monitoring", "export", str(out)), "already there", "--overwrite")
    assert (out / DASHBOARD.name).read_text() == "{}"
    assert reaper("monitoring", "export", str(out), "--overwrite").returncode == 0
    assert (out / DASHBOARD.name).read_bytes() == DASHBOARD.read_bytes()


def test_the_docs_have_no_copy_of_the_monitoring_files():
    # One copy: the package's. The docs site publishes it (docs/hooks.py).
    assert not list((ROOT / "docs").rglob(RULES.name)) and not list((ROOT / "docs").rglob(DASHBOARD.name))


# ---------------------------------------------------------------------- served by a real harvester

SMALL_LIMIT = 20_000


def _served(kafka_config: dict, url: str, table: str, **settings: object) -> set[str]:
    """Sample and family names a harvester of these settings serves once it has published."""
    from pyharvest import Config, Harvest, Limits, OutboxRecord, stasher
    from pyharvest.bindings.ops import start_ops_server
    from tests.helpers.ops import LOCAL, count_readings, families
    from tests.helpers.waiting import wait_until

    topic = f"served-{uuid.uuid4().hex[:8]}"
    cfg = Config(
        base_kafka_config=dict(kafka_config),
        leader_group_id=f"served-{uuid.uuid4().hex[:8]}",
        data_source=url,
        outbox_table=table,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05, io_error_backoff=0.05, max_delivery_attempts=1),
        **settings,  # type: ignore[arg-type]
    )
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    out = stasher.Stasher(table)
    with engine.begin() as tx:
        for i in range(20):
            out.stash(tx, OutboxRecord(topic, f"k{i % 4}", b"v"))
        if cfg.poison_policy == "quarantine":
            out.stash(tx, OutboxRecord(topic, "poison", b"P" * (SMALL_LIMIT + 10_000)))
    harvest = Harvest(cfg)
    ops = start_ops_server(harvest, {**LOCAL, "ageInterval": "100ms", "backlogInterval": "100ms"})
    assert ops is not None
    assert ops.backlog is not None and ops.watch is not None
    backlog_reads, watch_reads = count_readings(ops.backlog), count_readings(ops.watch)

    def scrape() -> tuple[set[str], dict[str, float]]:
        served = families(ops)
        names = {f.name for f in served} | {s.name for f in served for s in f.samples}
        return names, {s.name: s.value for f in served for s in f.samples}

    try:
        with harvest:
            def published() -> bool:
                _, values = scrape()
                left = 1 if cfg.poison_policy == "quarantine" else 0
                return (values.get("pyharvest_publish_latency_seconds_count", 0) >= 1
                        and values.get("pyharvest_quarantined_records", -1) == left
                        and values.get("pyharvest_oldest_record_age_seconds", -1) >= 0
                        and values.get("pyharvest_broker_connected") == 1)  # librdkafka's statistics: every second

            wait_until(published, 90, f"a harvester with {settings} to publish")
            # One more read of the age and the backlog after the drain, however long it takes.
            reads = backlog_reads[0], watch_reads[0]
            wait_until(lambda: backlog_reads[0] > reads[0] and watch_reads[0] > reads[1], 30,
                       "one more read of the age and the backlog")
            return scrape()[0]
    finally:
        ops.stop()
        engine.dispose()


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_every_metric_the_dashboard_and_the_rules_use_is_served(tmp_path, kafka_config):
    from pyharvest.bindings.sql import create_outbox_table
    from tests.helpers.fixtures.kafka import on_embedded_broker

    served: dict[str, set[str]] = {}
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    create_outbox_table(url, "plain", quarantine=True)
    served["at-least-once"] = _served(kafka_config, url, "plain", poison_policy="quarantine",
                                      producer_kafka_config={"message.max.bytes": SMALL_LIMIT})
    create_outbox_table(url, "sharded", shards=2)
    served["sharded"] = _served(kafka_config, url, "sharded", shards=2)
    if not on_embedded_broker():  # the embedded broker has no transactions
        create_outbox_table(url, "transactional")
        served["exactly-once"] = _served(kafka_config, url, "transactional", delivery="exactly-once")
    everywhere = set().union(*served.values())
    used = used_metric_names()
    assert len(used) >= 20, used
    # Served where the database says who holds its clean-up back (PostgreSQL, MariaDB, MySQL;
    # not SQLite): tests/test_cleanup_horizon.py scrapes it from a real one.
    missing = sorted(used - everywhere - {"pyharvest_cleanup_horizon_age_seconds"})
    assert not missing, f"used by the dashboard or the rules, served by no configuration: {missing}"
    # Per shard, for OutboxNoLeader and OutboxTwoLeaders; latency as a histogram.
    assert {"pyharvest_leader", "pyharvest_publish_latency_seconds_bucket"} <= served["sharded"]
