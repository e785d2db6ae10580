"""OpenTelemetry spans of the harvester: one per mark, per published batch and per purge (never
per record), named and attributed by the messaging semantic conventions, and none at all while
OpenTelemetry has no tracer provider configured."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from pyharvest.bindings.ops.tracing import OpenTelemetryRecorder, install  # noqa: E402
from pyharvest.core.telemetry.spans import install_recorder, recorder  # noqa: E402
from tests.helpers.engine import fill, make  # noqa: E402
from tests.helpers.fakes import FakeBinding, FakeKafka  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans recorded through a provider of the test's own (the global one can be set once)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = recorder()
    install(provider)
    try:
        yield exporter
    finally:
        install_recorder(previous)
        provider.shutdown()


def test_a_harvest_records_a_span_per_mark_batch_and_purge(spans: InMemorySpanExporter) -> None:
    db, kafka = FakeBinding(), FakeKafka()
    fill(db, 300, 30, topic="orders")
    with make(db, kafka, max_in_flight_records=100, mark_query_records=100) as h:
        wait_until(lambda: len(db) == 0, 10)
        wait_until(lambda: h.metrics.records_purged == 300, 10)
    finished = spans.get_finished_spans()
    marks = [s for s in finished if s.name == "mark outbox"]
    sends = [s for s in finished if s.name == "send orders"]
    purges = [s for s in finished if s.name == "purge outbox"]
    assert marks and sends and purges, sorted({s.name for s in finished})
    # Per batch, never per record; every record counted once in the batches that carried it.
    assert len(finished) < 300
    assert sum(s.attributes["messaging.batch.message_count"] for s in sends) == 300
    assert sum(s.attributes["messaging.batch.message_count"] for s in purges) == 300
    assert sum(s.attributes["messaging.batch.message_count"] for s in marks) >= 300
    send = sends[0]
    assert send.kind.name == "PRODUCER"
    assert dict(send.attributes) | {"messaging.batch.message_count": 0} == {
        "messaging.system": "kafka",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "orders",
        "messaging.batch.message_count": 0,
        "db.collection.name": "outbox",
        "pyharvest.delivery": "at-least-once",
    }
    assert purges[0].attributes["messaging.operation.type"] == "settle"
    assert marks[0].attributes["messaging.operation.type"] == "receive" and marks[0].kind.name == "CLIENT"


def test_a_batch_of_several_topics_is_named_for_its_operation_alone(spans: InMemorySpanExporter) -> None:
    db, kafka = FakeBinding(), FakeKafka()
    for i in range(20):
        db.insert("orders" if i % 2 else "payments", f"k{i}", b"v")
    with make(db, kafka) as h:
        wait_until(lambda: h.metrics.records_purged == 20, 10)
    mixed = [s for s in spans.get_finished_spans() if s.name == "send"]
    assert mixed and all("messaging.destination.name" not in s.attributes for s in mixed)


def test_a_failed_mark_is_recorded_on_its_span(spans: InMemorySpanExporter) -> None:
    db, kafka = FakeBinding(), FakeKafka()
    fill(db, 10, 2)
    db.fail_next_marks = 1
    with make(db, kafka) as h:
        wait_until(lambda: h.metrics.records_purged == 10, 10)
    failed = [s for s in spans.get_finished_spans() if s.name == "mark outbox" and not s.status.is_ok]
    assert failed and failed[0].attributes["error.type"] == "ConnectionError"
    assert any(e.name == "exception" for e in failed[0].events)


def test_no_span_while_opentelemetry_has_no_tracer_provider() -> None:
    from opentelemetry import trace

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("a global tracer provider is set in this process")
    previous = recorder()
    otel = OpenTelemetryRecorder()  # the global provider: none configured
    install_recorder(otel)
    try:
        assert otel.start(lambda: ("mark outbox", "client", {})) is None
        db, kafka = FakeBinding(), FakeKafka()
        fill(db, 10, 2)
        with make(db, kafka) as h:
            wait_until(lambda: h.metrics.records_purged == 10, 10)
    finally:
        install_recorder(previous)


def test_exactly_once_records_a_span_per_transaction(spans: InMemorySpanExporter) -> None:
    from tests.helpers.engine import make_exactly_once as exactly_once
    from tests.helpers.fakes import FakeTransactionalKafka

    db = FakeBinding()
    fill(db, 50, 5, topic="orders")
    kafka = FakeTransactionalKafka()
    with exactly_once(db, kafka) as h:
        wait_until(lambda: len(db) == 0, 20)
        wait_until(lambda: h.metrics.transactions_committed >= 1, 20)
    sends = [s for s in spans.get_finished_spans() if s.name == "send orders"]
    assert sends and all(s.attributes["pyharvest.delivery"] == "exactly-once" for s in sends)
    assert sum(s.attributes["messaging.batch.message_count"] for s in sends) == 50
    assert [s for s in spans.get_finished_spans() if s.name == "purge outbox"]


@pytest.mark.kafka
def test_spans_of_a_real_harvest(spans: InMemorySpanExporter, tmp_path, kafka_config) -> None:
    import sqlalchemy as sa

    from pyharvest import Config, Harvest, Limits, OutboxRecord, stasher
    from pyharvest.bindings.sql import create_outbox_table

    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    create_outbox_table(url)
    topic = f"traced-{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(url)
    with engine.begin() as tx:
        for i in range(40):
            stasher.stash(tx, OutboxRecord(topic, f"k{i % 8}", b"v"))
    engine.dispose()
    cfg = Config(base_kafka_config=dict(kafka_config), leader_group_id=f"traced-{uuid.uuid4().hex[:8]}",
                 data_source=url, limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05))
    with Harvest(cfg) as harvest:
        wait_until(lambda: harvest.metrics.records_purged == 40, 60)
    names = {s.name for s in spans.get_finished_spans()}
    assert {"mark outbox", f"send {topic}", "purge outbox"} <= names
