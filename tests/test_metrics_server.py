"""The operations server: Prometheus metrics scraped during a harvest, and health probes."""

from __future__ import annotations

import socket
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from pyharvest import Config, Limits  # noqa: E402
from pyharvest.bindings.ops import OpsConfig, start_ops_server  # noqa: E402
from pyharvest.bindings.ops.collector import HarvestCollector  # noqa: E402
from pyharvest.core.engine.harvest import HarvestEngine
from pyharvest.core.errors import ConfigError, HarvestError  # noqa: E402
from pyharvest.core.ports.kafka import DeliveryError  # noqa: E402
from tests.helpers.engine import fill, make  # noqa: E402
from tests.helpers.fakes import FakeBinding, FakeKafka  # noqa: E402
from tests.helpers.ops import LOCAL, count_readings, get, probe, scrape  # noqa: E402
from tests.helpers.waiting import wait_until

# ---------------------------------------------------------------------- on fakes


def test_counters_move_during_a_harvest_and_gauges_follow_in_flight_records():
    db, kafka = FakeBinding(), FakeKafka()
    fill(db, 300, 300)
    kafka.cluster.hold = True  # deliveries wait: records stay in flight
    h = make(db, kafka, max_in_flight_records=50, mark_query_records=50)
    ops = start_ops_server(h, LOCAL)
    try:
        before = scrape(ops)
        assert before["pyharvest_running"] == 0 and before["pyharvest_records_purged_total"] == 0
        with h:
            wait_until(lambda: h.in_flight_records == 50, 5)
            during = scrape(ops)
            assert during["pyharvest_leader"] == 1
            assert during["pyharvest_leader_acquisitions_total"] == 1
            assert during["pyharvest_in_flight_records"] == 50
            assert during["pyharvest_in_flight_keys"] == 50
            assert during["pyharvest_max_in_flight_records"] == 50
            assert during["pyharvest_records_marked_total"] >= 50
            assert during["pyharvest_records_purged_total"] == 0
            kafka.cluster.hold = False
            wait_until(lambda: len(db) == 0)
            wait_until(lambda: scrape(ops)["pyharvest_records_purged_total"] == 300)
        after = scrape(ops)
        assert after["pyharvest_records_marked_total"] == 300
        assert after["pyharvest_records_published_total"] == 300
        assert after["pyharvest_in_flight_records"] == 0
        assert after["pyharvest_running"] == 0 and after["pyharvest_leader"] == 0
        # Latencies: the reservoirs were drained into cumulative histograms, every observation once.
        assert after["pyharvest_mark_duration_seconds_count"] == after["pyharvest_marks_total"] == h.metrics.marks
        assert after["pyharvest_purge_duration_seconds_count"] >= 1
        assert after['pyharvest_purge_duration_seconds_bucket{le="+Inf"}'] == after[
            "pyharvest_purge_duration_seconds_count"
        ]
        assert h.metrics.mark_seconds == [] and h.metrics.purge_seconds == []
        # Publish latency: one observation per acknowledged record, create_time to the ack.
        assert after["pyharvest_publish_latency_seconds_count"] == 300
        assert 0 < after["pyharvest_publish_latency_seconds_sum"] < 300 * 60
        assert after['pyharvest_publish_latency_seconds_bucket{le="600.0"}'] == 300
        # Counts do not go backwards on a later scrape (the histograms keep what they drained).
        again = scrape(ops)
        assert again["pyharvest_purge_duration_seconds_count"] == after["pyharvest_purge_duration_seconds_count"]
        assert again["pyharvest_mark_duration_seconds_sum"] == after["pyharvest_mark_duration_seconds_sum"]
        # The standard process metrics come along.
        assert "process_cpu_seconds_total" in again or sys.platform != "linux"
    finally:
        ops.stop()


def test_parked_records_and_delivery_errors_by_code():
    db, kafka = FakeBinding(), FakeKafka()
    for i in range(20):
        db.insert("data", "same-key", str(i).encode())
    failures = {"left": 3}

    def fail(sent):
        if failures["left"]:
            failures["left"] -= 1
            return DeliveryError("MSG_SIZE_TOO_LARGE", "too big", retriable=True)
        return None

    kafka.cluster.fail = fail
    kafka.cluster.hold = True
    h = make(db, kafka)
    ops = start_ops_server(h, LOCAL)
    try:
        with h:
            wait_until(lambda: h.parked_records == 19, 5)
            m = scrape(ops)
            assert m["pyharvest_in_flight_records"] == 1 and m["pyharvest_parked_records"] == 19
            kafka.cluster.hold = False
            wait_until(lambda: len(db) == 0)
        m = scrape(ops)
        assert m['pyharvest_delivery_errors_total{code="MSG_SIZE_TOO_LARGE"}'] == 3
        assert m["pyharvest_records_reset_total"] == 3
        assert m["pyharvest_leader_refreshes_total"] >= 1
    finally:
        ops.stop()


class CountingBinding(FakeBinding):
    def count(self) -> int:
        return len(self)


def test_backlog_gauge_counts_through_the_binding_and_is_absent_without_count():
    db, kafka = CountingBinding(), FakeKafka()
    fill(db, 40, 4)
    kafka.cluster.hold = True
    h = make(db, kafka)
    ops = start_ops_server(h, {**LOCAL, "backlogInterval": "20ms"})
    try:
        assert "pyharvest_backlog_records" not in scrape(ops)  # not running: no binding yet
        with h:
            wait_until(lambda: scrape(ops).get("pyharvest_backlog_records") == 40, 5)
            kafka.cluster.hold = False
            wait_until(lambda: scrape(ops).get("pyharvest_backlog_records") == 0, 5)
    finally:
        ops.stop()

    plain = make(FakeBinding(), FakeKafka())
    ops = start_ops_server(plain, {**LOCAL, "backlogInterval": "20ms"})
    try:
        with plain:
            # Two readings of the backlog since the binding was connected: had it a count(),
            # the gauge would be there by then.
            wait_until(lambda: plain.is_leader, 10, "the plain harvester to lead")
            reads = count_readings(ops.backlog)
            wait_until(lambda: reads[0] >= 2, 10, "two readings of the backlog")
            assert "pyharvest_backlog_records" not in scrape(ops)
    finally:
        ops.stop()


def test_health_endpoints_follow_the_harvester_lifecycle():
    db, kafka = FakeBinding(), FakeKafka()
    h = make(db, kafka)
    ops = start_ops_server(h, LOCAL)
    try:
        status, body = probe(ops, "/readyz")
        assert status == 503 and body["down"] == ["harvester"] and body["state"] == "created"
        assert probe(ops, "/healthz")[0] == 200  # starting is alive
        with h:
            wait_until(lambda: h.is_leader, 5)
            status, body = probe(ops, "/readyz")
            assert status == 200 and body["status"] == "ready" and body["role"] == "leader"
            assert "down" not in body
            assert probe(ops, "/healthz") == (200, {"status": "alive", "state": "running"})
        assert probe(ops, "/healthz")[0] == 503
        assert probe(ops, "/readyz")[0] == 503
        assert get(ops.url + "/nope")[0] == 404
        req = urllib.request.Request(ops.url + "/readyz", method="HEAD")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)  # noqa: S310
        assert e.value.code == 503
    finally:
        ops.stop()


def test_readiness_reports_a_database_that_does_not_answer():
    class Unreachable(FakeBinding):
        def ping(self) -> None:
            raise ConnectionError("connection refused")

    h = make(Unreachable(), FakeKafka())
    ops = start_ops_server(h, LOCAL)
    try:
        with h:
            # The ping runs in the background: the first probes may answer before it has.
            wait_until(lambda: probe(ops, "/readyz")[0] == 503, 10)
            status, body = probe(ops, "/readyz")
            assert status == 503 and body["down"] == ["database"] and body["database_connected"] is False
            assert body["errors"] == {"database": "ConnectionError: connection refused"}
            assert scrape(ops)["pyharvest_database_connected"] == 0
            assert probe(ops, "/healthz")[0] == 200  # alive: a restart would not bring the database back
    finally:
        ops.stop()


def test_a_client_that_hangs_up_is_one_log_line_not_a_traceback(monkeypatch, caplog, capfd):
    import logging
    import struct

    from pyharvest.bindings.ops import server

    caplog.set_level(logging.DEBUG, logger="pyharvest.ops")
    h = make(FakeBinding(), FakeKafka())
    ops = start_ops_server(h, LOCAL)
    try:
        # Gone while its request was being read: the connection is reset under the server.
        with socket.create_connection(("127.0.0.1", ops.port), timeout=5) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
        # Gone before its answer was written (what a write to a closed socket raises).
        def hung_up(*_args, **_kwargs):
            raise BrokenPipeError(32, "Broken pipe")

        monkeypatch.setattr(server._Handler, "_send", hung_up)
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(ops.url + "/readyz")
        wait_until(lambda: len([r for r in caplog.records if "hung up" in r.getMessage()]) == 2, 5)
    finally:
        ops.stop()
    gone = [r for r in caplog.records if "hung up" in r.getMessage()]
    assert [r.levelname for r in gone] == ["INFO", "INFO"] and not any(r.exc_info for r in gone)
    # socketserver's default: a banner and a traceback on stderr for each.
    assert "Exception occurred during processing of request" not in capfd.readouterr().err


def test_a_second_collector_does_not_split_the_latency_histograms():
    from prometheus_client import CollectorRegistry, generate_latest

    db, kafka = FakeBinding(), FakeKafka()
    fill(db, 100, 10)
    h = make(db, kafka)
    first, second = CollectorRegistry(), CollectorRegistry()
    first.register(HarvestCollector(h))
    second.register(HarvestCollector(h))
    with h:
        wait_until(lambda: len(db) == 0)
    generate_latest(first)

    def count(registry) -> float:
        text = generate_latest(registry).decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "pyharvest_mark_duration_seconds_count":
                    return s.value
        raise AssertionError("no mark histogram")

    assert count(second) == count(first) == h.metrics.marks


def test_the_server_frees_its_port_and_threads():
    import threading

    h = make(FakeBinding(), FakeKafka())
    ops = start_ops_server(h, LOCAL)
    port = ops.port
    assert get(ops.url + "/healthz")[0] == 200
    ops.stop()
    ops.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # and the port can be bound again
    assert not [t for t in threading.enumerate() if t.name in ("pyharvest-ops", "pyharvest-backlog")]


# ---------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("section", "field", "fragment"),
    [
        ({"port": "http"}, "metrics.port", "TCP port"),
        ({"port": 70000}, "metrics.port", "TCP port"),
        ({"port": True}, "metrics.port", "TCP port"),
        ({"address": ""}, "metrics.address", "host name"),
        ({"backlogInterval": "often"}, "metrics.backlogInterval", "not a duration"),
        ({"backlogInterval": 0}, "metrics.backlogInterval", "positive"),
        ({"enabled": "yes"}, "metrics.enabled", "true or false"),
        ({"prot": 9433}, "metrics.prot", "unknown key"),
        ([9433], "metrics", "expected a mapping"),
    ],
)
def test_invalid_sections_name_the_key(section, field, fragment):
    with pytest.raises(ConfigError) as e:
        start_ops_server(make(FakeBinding(), FakeKafka()), section)
    assert str(e.value).startswith(field + ":") and fragment in str(e.value)


def test_defaults_and_disabled_sections():
    assert OpsConfig.from_mapping({}) == OpsConfig("127.0.0.1", 9433, None, True)  # this machine only
    assert OpsConfig.from_mapping({"backlogInterval": "1m"}).to_mapping() == {
        "address": "127.0.0.1", "port": 9433, "backlogInterval": "60s",
    }
    h = make(FakeBinding(), FakeKafka())
    assert start_ops_server(h, None) is None
    assert start_ops_server(h, {"enabled": False, "port": 1}) is None


@pytest.mark.parametrize(
    ("address", "shown"),
    [("0.0.0.0", "0.0.0.0:{port} (all interfaces)"), ("127.0.0.1", "127.0.0.1:{port}:")],  # noqa: S104
)
def test_the_start_up_line_names_the_address_it_listens_on(caplog, address, shown):
    caplog.set_level("INFO", logger="pyharvest")
    ops = start_ops_server(make(FakeBinding(), FakeKafka()), {"address": address, "port": 0})
    try:
        assert shown.format(port=ops.port) in caplog.text
    finally:
        ops.stop()


def test_a_port_in_use_is_a_one_line_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        expected = r"cannot listen on 127\.0\.0\.1:\d+ \(metrics\.address, metrics\.port\)"
        with pytest.raises(HarvestError, match=expected):
            start_ops_server(make(FakeBinding(), FakeKafka()), {"address": "127.0.0.1", "port": port})


def test_missing_prometheus_client_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigError, match=r"metrics: .*pip install 'pyharvest\[metrics\]'"):
        start_ops_server(make(FakeBinding(), FakeKafka()), LOCAL)


# ---------------------------------------------------------------------- on a real broker


def real_config(bootstrap: str) -> Config:
    return Config(
        base_kafka_config={"bootstrap.servers": bootstrap},
        leader_group_id=f"ops-{uuid.uuid4().hex[:8]}",
        data_source="fake://",
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05, shutdown_timeout=3.0),
    )


@pytest.mark.kafka
def test_scrape_during_a_harvest_on_a_real_broker(kafka_config, topic_name):
    from pyharvest.bindings.kafka.confluent import ConfluentClients

    db = FakeBinding()
    fill(db, 200, 20, topic=topic_name)
    h = HarvestEngine(real_config(str(kafka_config["bootstrap.servers"])), binding=db, kafka=ConfluentClients())
    ops = start_ops_server(h, LOCAL)
    try:
        with h:
            wait_until(lambda: len(db) == 0, 30)
            wait_until(lambda: scrape(ops).get("pyharvest_broker_connected") == 1, 10)
            m = scrape(ops)
            assert m["pyharvest_leader"] == 1 and m["pyharvest_ready"] == 1
            assert m["pyharvest_records_purged_total"] == 200
            assert m["pyharvest_purge_duration_seconds_count"] >= 1
            assert probe(ops, "/readyz")[0] == 200
    finally:
        ops.stop()


@pytest.mark.kafka
def test_readiness_goes_down_with_the_broker_and_comes_back(tmp_path):
    from pyharvest.bindings.kafka.confluent import ConfluentClients
    from tests.helpers.faults.apache import ApacheKafka
    from tests.helpers.fixtures.kafka import on_embedded_broker

    if on_embedded_broker():
        pytest.skip("stopping and restarting a broker runs on Apache Kafka")
    broker = ApacheKafka(tmp_path / "kafka").start()
    h = HarvestEngine(real_config(broker.bootstrap_servers), binding=FakeBinding(), kafka=ConfluentClients())
    ops = start_ops_server(h, LOCAL)
    try:
        h.start()
        wait_until(lambda: probe(ops, "/readyz")[1].get("broker_connected") is True, 30)
        assert probe(ops, "/readyz")[0] == 200

        broker.stop()
        started = time.monotonic()
        wait_until(lambda: probe(ops, "/readyz")[0] == 503, 30)
        _, body = probe(ops, "/readyz")
        assert body["down"] == ["broker"] and body["broker_connected"] is False, body
        print(f"readiness went down {time.monotonic() - started:.2f}s after the broker")
        assert probe(ops, "/healthz")[0] == 200  # alive: it reconnects by itself
        assert scrape(ops)["pyharvest_broker_connected"] == 0

        broker.start()
        wait_until(lambda: probe(ops, "/readyz")[0] == 200, 60)
    finally:
        h.stop()
        h.join(20)
        ops.stop()
        broker.clean()


def test_the_kubernetes_example_is_consistent():
    from pathlib import Path

    import yaml

    from pyharvest.envconfig import apply_env_overrides

    docs = yaml.safe_load_all((Path(__file__).parent.parent / "docs/examples/kubernetes.yaml").read_text())
    by_kind = {d["kind"]: d for d in docs}
    raw = yaml.safe_load(by_kind["ConfigMap"]["data"]["reaper.yaml"])
    reaper = next(c for c in by_kind["Deployment"]["spec"]["template"]["spec"]["containers"] if c["name"] == "reaper")
    env = {e["name"]: "from-k8s" for e in reaper["env"]}
    from pyharvest.core.config.settings import ReaperConfig

    cfg = ReaperConfig.from_mapping(apply_env_overrides(raw, env))
    assert cfg.harvest.data_source == "from-k8s"
    ops = OpsConfig.from_mapping(cfg.extra["metrics"])
    port = {p["name"]: p["containerPort"] for p in reaper["ports"]}["metrics"]
    assert ops.port == port
    assert reaper["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert reaper["readinessProbe"]["httpGet"]["path"] == "/readyz"
    grace = by_kind["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > cfg.harvest.resolve().limits.shutdown_timeout

