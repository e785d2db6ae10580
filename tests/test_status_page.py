"""The status page at ``/``: its JSON (``Accept: application/json`` or ``/status``), its HTML
(self-contained, no external asset), and the page rendered by a real headless Chromium beside a
running ``reaper`` with a quarantined key: the chart has points and each key its commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from pyharvest import OutboxRecord, stasher  # noqa: E402
from pyharvest.bindings.ops import start_ops_server  # noqa: E402
from pyharvest.bindings.ops.status import quarantine_commands  # noqa: E402
from pyharvest.bindings.ops.status_page import render_status_page  # noqa: E402
from tests.helpers.engine import fill, make  # noqa: E402
from tests.helpers.fakes import FakeBinding, FakeKafka  # noqa: E402
from tests.helpers.ops import LOCAL  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


def fetch(url: str, accept: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=5) as r:  # noqa: S310 - loopback only
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


class AgingBinding(FakeBinding):
    """The fake outbox, with the SQL binding's look at its oldest row."""

    def oldest_create_time(self):
        with self._lock:
            return self.rows[min(self.rows)].create_time if self.rows else None


def test_json_at_accept_or_status_and_html_for_browsers():
    db, kafka = AgingBinding(), FakeKafka()
    fill(db, 30, 3)
    kafka.cluster.hold = True
    h = make(db, kafka)
    ops = start_ops_server(h, {**LOCAL, "ageInterval": "20ms"})
    try:
        with h:
            wait_until(lambda: h.in_flight_records == 3, 5)
            _, kind, body = fetch(ops.url + "/", "application/json")
            report = json.loads(body)
            assert kind == "application/json"
            # Today's index stays in it; the rest is the page's content.
            assert {"/metrics", "/healthz", "/readyz"} <= set(report["endpoints"])
            assert report["shards"] == [{"shard": 0, "role": "leader", "in_flight_records": 3, "backlog_records": None}]
            assert report["process"]["outbox_table"] == "outbox" and report["process"]["pid"] == os.getpid()
            assert json.loads(fetch(ops.url + "/status")[2])["shards"][0]["role"] == "leader"
            wait_until(lambda: (json.loads(fetch(ops.url + "/status")[2])["oldest_record_age_seconds"] or 0) > 0, 5)
            for accept in (None, BROWSER_ACCEPT, "text/html"):
                status, kind, page = fetch(ops.url + "/", accept)
                assert status == 200 and kind.startswith("text/html"), (accept, kind)
                assert "<svg" in page and 'class="leader">leader' in page
            kafka.cluster.hold = False
            wait_until(lambda: len(db) == 0, 10)
            wait_until(lambda: json.loads(fetch(ops.url + "/status")[2])["oldest_record_age_seconds"] == 0, 5)
    finally:
        ops.stop()


def test_the_page_loads_nothing_from_elsewhere():
    db, kafka = AgingBinding(), FakeKafka()
    h = make(db, kafka)
    ops = start_ops_server(h, {**LOCAL, "ageInterval": "20ms"})
    try:
        with h:
            wait_until(lambda: len(json.loads(fetch(ops.url + "/status")[2])["history"]) >= 2, 5)
            page = fetch(ops.url + "/")[2]
    finally:
        ops.stop()
    # No script, stylesheet, image or font from anywhere: the page works offline.
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(", page, re.IGNORECASE)
    assert re.findall(r'(?:src|href)="([^"]*)"', page) == ["/metrics", "/healthz", "/readyz", "/status"]
    assert 'xmlns="http://www.w3.org/2000/svg"' in page  # a namespace name, not a fetch


def test_a_standby_reports_its_role_and_the_age_too():
    db, kafka = AgingBinding(), FakeKafka()
    fill(db, 10, 10)
    kafka.cluster.hold = True
    leader, standby = make(db, kafka), make(db, kafka)
    with leader:
        wait_until(lambda: leader.is_leader, 5)
        ops = start_ops_server(standby, {**LOCAL, "ageInterval": "20ms"})
        try:
            with standby:
                wait_until(lambda: (json.loads(fetch(ops.url + "/status")[2])["oldest_record_age_seconds"] or 0) > 0, 5)
                report = json.loads(fetch(ops.url + "/status")[2])
                assert report["shards"][0]["role"] == "standby" and report["ready"] is True
                metrics = fetch(ops.url + "/metrics")[2]
                assert "pyharvest_oldest_record_age_seconds " in metrics and "pyharvest_leader 0.0" in metrics
        finally:
            ops.stop()
        kafka.cluster.hold = False


class LastHeartbeatKafka(FakeKafka):
    """The fake cluster, reading back the leader topic's last heartbeat as the binding does."""

    def __init__(self) -> None:
        super().__init__()
        self.last_heartbeat: bytes | None = None

    def producer(self, config):  # noqa: ANN001
        producer = super().producer(config)
        produce = producer.produce

        def recording(topic, key, value, headers, on_delivery, partition=None):  # noqa: ANN001
            if topic.endswith(".neli"):
                self.last_heartbeat = value
            produce(topic, key, value, headers, on_delivery, partition)

        producer.produce = recording  # type: ignore[method-assign]
        return producer

    def last_heartbeats(self, config, topic, partitions, timeout):  # noqa: ANN001
        return {0: self.last_heartbeat} if self.last_heartbeat else {}


def test_a_standby_names_the_process_that_leads():
    db, kafka = AgingBinding(), LastHeartbeatKafka()
    leader, standby = make(db, kafka), make(db, kafka)
    with leader:
        wait_until(lambda: leader.is_leader, 5)
        ops = start_ops_server(standby, LOCAL)
        try:
            with standby:
                def led_by() -> dict | None:
                    return json.loads(fetch(ops.url + "/status")[2])["shards"][0].get("led_by")

                wait_until(led_by, 10, "the standby to read the leader's heartbeat")
                who = led_by()
                assert who is not None
                assert (who["name"], who["pid"]) == (leader.config.name, os.getpid()), who
                assert who["last_heartbeat_seconds_ago"] >= 0
                readyz = json.loads(fetch(ops.url + "/readyz")[2])
                assert readyz["led_by"]["0"]["name"] == leader.config.name
                page = fetch(ops.url + "/")[2]
                assert f'led by {leader.config.name} (' in page and "last heartbeat" in page
        finally:
            ops.stop()
        assert leader.leaders() == {}  # the leader's own report names no other leader


def test_quarantined_keys_get_the_commands_that_release_them_quoted_for_a_shell():
    commands = quarantine_commands("-f /etc/reaper.yaml", "it's a key")
    assert commands == {
        "replay": "reaper quarantine replay -f /etc/reaper.yaml --key 'it'\"'\"'s a key'",
        "discard": "reaper quarantine discard -f /etc/reaper.yaml --key 'it'\"'\"'s a key'",
    }
    status = {
        "process": {"name": "n", "host": "h", "pid": 1, "version": "0", "uptime_seconds": 3.0,
                    "leader_group_id": "g", "outbox_table": "outbox", "delivery": "at-least-once",
                    "poison_policy": "quarantine"},
        "status": "ready", "ready": True, "health": {}, "endpoints": ["/", "/metrics"],
        "shards": [{"shard": 0, "role": "leader", "in_flight_records": 0, "backlog_records": 4}],
        "backlog_records": 4, "oldest_record_age_seconds": 12.5, "records_published_total": 9,
        "history": [], "sample_interval_seconds": 5.0,
        "quarantined": [{"key": "<b>k</b>", "record_id": 7, "topic": "orders", "error": "MSG_SIZE_TOO_LARGE: too big",
                         "attempts": 3, "quarantine_time": "2026-01-02T03:04:05+00:00",
                         "commands": quarantine_commands("-f reaper.yaml", "<b>k</b>")}],
    }
    page = render_status_page(status)
    assert "<b>k</b>" not in page and "&lt;b&gt;k&lt;/b&gt;" in page  # escaped, not markup
    assert "reaper quarantine replay -f reaper.yaml --key &#x27;&lt;b&gt;k&lt;/b&gt;&#x27;" in page
    assert "2026-01-02 03:04:05 UTC" in page and "no samples yet" in page


def test_blocked_keys_come_first_under_a_warning_badge():
    status = {
        "process": {"name": "n", "host": "h", "pid": 1, "version": "0", "uptime_seconds": 3.0,
                    "leader_group_id": "g", "outbox_table": "outbox", "delivery": "at-least-once",
                    "poison_policy": "block"},
        "status": "degraded", "ready": True, "degraded": True, "health": {}, "endpoints": ["/", "/metrics"],
        "shards": [{"shard": 0, "role": "leader", "in_flight_records": 1, "backlog_records": 4}],
        "backlog_records": 4, "oldest_record_age_seconds": 12.5, "records_published_total": 9,
        "history": [], "sample_interval_seconds": 5.0, "quarantined": [],
        "blocked_key_count": 3,
        "blocked_keys": [{"key": "<big>", "topic": "nc bad!", "record_id": 8591, "attempts": 7,
                          "since": "2026-01-02T03:04:05+00:00", "error": "TOPIC_EXCEPTION: Broker: Invalid topic"}],
    }
    page = render_status_page(status)
    assert 'class="badge warn">degraded<' in page
    assert page.index('id="blocked"') < page.index("<h2>Quarantined keys</h2>") < page.index("<h2>Shards</h2>")
    assert "<code>&lt;big&gt;</code>" in page and "nc bad!" in page and "2026-01-02 03:04:05 UTC" in page
    assert ">8591<" in page and ">7<" in page and "TOPIC_EXCEPTION" in page
    assert "and 2 more" in page and "3 keys held back" in page
    assert "quarantines no key" in page
    status.update(status="ready", degraded=False, blocked_key_count=0, blocked_keys=[])
    page = render_status_page(status)
    assert 'class="badge ready">ready<' in page and 'id="blocked-empty"' in page


# ---------------------------------------------------------------------- in a real browser

SMALL_LIMIT = 20_000  # the producer's message.max.bytes: a larger record is a poison record
POISON = b"P" * 30_000


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_the_page_in_headless_chromium_beside_a_running_reaper(tmp_path, kafka_bootstrap, topic_name):
    from pyharvest.bindings.sql import create_outbox_table
    from tests.helpers.browser import chromium
    from tests.helpers.reapers import ReaperProcess
    from tests.helpers.topics import create_topic

    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    create_outbox_table(url, "outbox", quarantine=True)
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    config = {
        "harvest": {
            "baseKafkaConfig": {"bootstrap.servers": kafka_bootstrap},
            "producerKafkaConfig": {"message.max.bytes": SMALL_LIMIT},
            "leaderGroupID": f"status-{uuid.uuid4().hex[:8]}",
            "dataSource": url,
            "poisonPolicy": "quarantine",
            "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms", "maxDeliveryAttempts": 2,
                       "ioErrorBackoff": "50ms"},
        },
        "metrics": {"address": "127.0.0.1", "port": 0, "ageInterval": "300ms", "backlogInterval": "300ms"},
        "logging": {"level": "Info"},
    }
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    stop_writing = threading.Event()

    def write() -> None:
        n = 0
        while not stop_writing.is_set():
            with engine.begin() as tx:
                stasher.stash(tx, OutboxRecord(topic_name, f"key-{n % 7}", f"value {n}".encode()))
                if n == 5:
                    stasher.stash(tx, OutboxRecord(topic_name, "poison-key", POISON))
            n += 1
            stop_writing.wait(0.02)

    writer = threading.Thread(target=write, daemon=True)
    with ReaperProcess(config, tmp_path) as reaper, _stopping(stop_writing, writer):
        base = reaper.ops_url()
        writer.start()

        def report() -> dict:
            return json.loads(fetch(base + "/status")[2])

        wait_until(lambda: report()["shards"][0]["role"] == "leader", 60, "the reaper to lead")
        wait_until(lambda: [q["key"] for q in report()["quarantined"] or []] == ["poison-key"], 60,
                   "the poison record's key to be quarantined")
        wait_until(lambda: sum(1 for s in report()["history"] if s["published_per_second"] > 0) >= 3, 60,
                   "three samples of a publish rate")
        wait_until(lambda: any(s["latency_p99_seconds"] for s in report()["history"]), 60,
                   "a sample of the publish latency")
        if os.environ.get("PYHARVEST_STATUS_SCREENSHOT"):
            stop_writing.wait(float(os.environ.get("PYHARVEST_STATUS_SECONDS", "40")))  # a longer history
        with chromium(height=1150) as browser:
            browser.get(base + "/")
            assert browser.title.startswith("pyharvest")
            shards = browser.find_element("id", "shards").text
            assert "leader" in shards, shards
            readiness = browser.find_element("id", "readiness").text
            assert readiness == "ready", readiness
            charts = browser.find_elements("css selector", "svg.series-chart")
            assert len(charts) == 3
            rate_points = charts[0].find_elements("css selector", "circle.point")
            latency_points = charts[1].find_elements("css selector", "circle.point")
            assert len(rate_points) >= 3 and len(latency_points) >= 1, (len(rate_points), len(latency_points))
            assert all(p.is_displayed() for p in rate_points)
            quarantine = browser.find_element("id", "quarantine").text
            assert "poison-key" in quarantine and "MSG_SIZE_TOO_LARGE" in quarantine
            command = "reaper quarantine replay -f reaper.yaml --key poison-key"
            assert command in quarantine, quarantine
            shot = tmp_path / "status-page.png"
            assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
            # Regenerate the screenshot in docs/operations.md with PYHARVEST_STATUS_SCREENSHOT=docs/images/status-page.png
            target = os.environ.get("PYHARVEST_STATUS_SCREENSHOT")
            if target:
                shutil.copyfile(shot, Path(target))
        stop_writing.set()
        assert reaper.stop() == 0
    engine.dispose()


@contextmanager
def _stopping(stop: threading.Event, thread: threading.Thread) -> Iterator[None]:
    """Stop the writer thread however the block ends."""
    try:
        yield
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(10)


def test_a_chart_leaves_gaps_blank_and_a_lone_sample_has_no_time_axis():
    from pyharvest.bindings.ops.status_page import _chart

    # Samples at 0..4 s with none at 2 s: two runs, no line across the gap, every sample a point.
    chart = _chart("latency", "ms", [0.0, 1.0, 2.0, 3.0, 4.0], [("p99", "#c00", [5.0, 6.0, None, 7.0, 8.0])])
    assert chart.count("<polyline") == 2 and chart.count('class="point"') == 4
    assert "-4.0 s" in chart
    # A fresh page: one sample, so nothing to say how far back it goes ("-0 ms" before).
    lone = _chart("latency", "ms", [10.0], [("p99", "#c00", [5.0])])
    assert "-0 ms" not in lone and "<polyline" not in lone and lone.count('class="point"') == 1
