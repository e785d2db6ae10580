"""What the operations server shows: metrics and health, never a record's value or a secret
(also when the database's error quotes its connection URL), on the loopback interface unless
``metrics.address`` says otherwise. The secured set-up's run of it: tests/test_secrets.py."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("prometheus_client")

from pyharvest import Config, Limits  # noqa: E402
from pyharvest.bindings.ops import OpsConfig, start_ops_server  # noqa: E402
from pyharvest.core.engine.harvest import HarvestEngine  # noqa: E402
from pyharvest.core.ports.kafka import DeliveryError  # noqa: E402
from tests.helpers.fakes import FakeBinding, FakeKafka  # noqa: E402
from tests.helpers.ops import LOCAL, get, probe  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402


def test_it_listens_on_this_machine_only_by_default():
    assert OpsConfig.from_mapping({}).address == "127.0.0.1"
    assert OpsConfig.from_mapping({"address": "0.0.0.0"}).address == "0.0.0.0"  # noqa: S104 - said so


def test_no_page_shows_a_record_value_or_a_secret():
    """The operations server serves metrics and health: never a record's value, and never a
    password, also when the database's error quotes its connection URL."""
    value = f"value-{uuid.uuid4().hex}"
    secrets = ["s3cr3t-sasl", "s3cr3t-db"]

    class Unreachable(FakeBinding):
        def ping(self) -> None:
            raise ConnectionError("could not connect to postgresql://app:s3cr3t-db@db:5432/app")

    db, kafka = Unreachable(), FakeKafka()
    for n in range(50):
        db.insert("orders", f"k{n % 5}", f"{value}-{n}".encode())
    failures = iter(range(3))
    kafka.cluster.fail = lambda sent: (  # the first three deliveries fail
        DeliveryError("MSG_SIZE_TOO_LARGE", "Broker: Message size too large", retriable=False)
        if next(failures, None) is not None else None
    )
    cfg = Config(base_kafka_config={"bootstrap.servers": "k:9093", "sasl.username": "svc", "sasl.password": secrets[0]},
                 leader_group_id="app", data_source=f"postgresql://app:{secrets[1]}@db/app",
                 limits=Limits(min_poll_interval=0.005, heartbeat_timeout=0.5, mark_backoff=0.001,
                               io_error_backoff=0.01, min_metrics_interval=0.05))
    engine = HarvestEngine(cfg, binding=db, kafka=kafka)
    with engine, start_ops_server(engine, {**LOCAL, "backlogInterval": "10ms"}) as ops:
        wait_until(lambda: len(db) == 0)
        wait_until(lambda: probe(ops, "/readyz")[0] == 503, what="the failing ping to show")
        pages = [get(ops.url + path)[1] for path in ("/", "/metrics", "/healthz", "/readyz", "/livez", "/nowhere", "/status")]
    assert "could not connect to postgresql://app:***@db" in pages[3]
    assert 'pyharvest_delivery_errors_total{code="MSG_SIZE_TOO_LARGE"}' in pages[1]
    for page in pages:
        assert value not in page
        assert not [s for s in secrets if s in page]
