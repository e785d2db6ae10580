"""Stuck Kafka clients are replaced (pyharvest.core.healing.stuck_clients, through the confluent-kafka binding).

The stuck leader consumer is made on cue: a proxy answers its metadata requests, for a moment,
with a cluster of no brokers (what a lone Apache Kafka node answers right after its controller
fenced it: tests/helpers/faults/metadata_proxy.py), and librdkafka forgets the only broker it knew.
Without the heal it would bootstrap again only after 5 minutes; a consumer beside it without
the heal shows that it stays stuck. The producers' heals are driven with a probe that says
the cluster answers while their own connection is black-holed.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

import pytest

from pyharvest.bindings.kafka.confluent import ConfluentClients, ConfluentProducer
from pyharvest.bindings.kafka.embedded import free_port
from pyharvest.bindings.kafka.transactions import ConfluentTransactionalProducer
from pyharvest.core.election.group_protocol import leader_client_configs
from pyharvest.core.healing.stuck_clients import ProbeAnswer
from pyharvest.core.ports.kafka import DeliveryError, TransactionError
from pyharvest.core.telemetry.client_restarts import restarts
from tests.helpers.faults.apache import ApacheKafka
from tests.helpers.faults.kafka import proxied_broker
from tests.helpers.faults.metadata_proxy import MetadataProxy
from tests.helpers.fixtures.kafka import on_embedded_broker
from tests.helpers.topics import create_topic
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

# librdkafka asks for metadata every 5 minutes by default; the lie must reach it sooner.
REFRESH = {"topic.metadata.refresh.interval.ms": 1000}


@pytest.fixture
def lying_broker():
    """A private Apache Kafka that clients reach through a MetadataProxy."""
    if on_embedded_broker():
        pytest.skip("the stuck consumer is made on Apache Kafka (a private node behind a Kafka-aware proxy)")
    listen = free_port()
    with tempfile.TemporaryDirectory(prefix="pyharvest-kafka-") as data, \
            MetadataProxy(("127.0.0.1", listen)) as proxy, \
            ApacheKafka(Path(data), port=listen, advertised_port=proxy.port) as kafka:
        yield kafka, proxy


def test_a_leader_consumer_that_lost_every_broker_is_replaced_and_rejoins(lying_broker):
    kafka, proxy = lying_broker
    topic = f"stuck-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    base = {"bootstrap.servers": kafka.bootstrap_servers, **REFRESH}
    config, _ = leader_client_configs(base, f"stuck-{uuid.uuid4().hex[:8]}", 2.0)  # a 6 s session
    events: list[tuple[str, list[int]]] = []
    healed = ConfluentClients(heal_after=12.0).leader_consumer(config)
    healed.subscribe(topic, lambda ps: events.append(("assigned", ps)), lambda ps: events.append(("revoked", ps)))
    # The control: the same consumer, in a group of its own, without the heal.
    control_config = {**config, "group.id": f"control-{uuid.uuid4().hex[:8]}"}
    control = ConfluentClients().leader_consumer(control_config)
    control.subscribe(topic, lambda ps: None, lambda ps: None)

    def pump(until, timeout: float, what: str) -> None:
        def polled() -> bool:
            healed.poll(0.05)
            control.poll(0.05)
            return bool(until())
        wait_until(polled, timeout, what)

    before = restarts.snapshot().get("leader_consumer", 0)
    try:
        pump(lambda: events == [("assigned", [0])] and control._steady, 60, "both consumers to join")
        proxy.hide_brokers()
        # librdkafka bootstraps again at once the first time it knows no broker: the lie lasts
        # until both consumers have held no connection for a while, having nothing left to
        # connect to (the next bootstrap is 5 minutes away).
        forgot: list[float] = []

        def forgotten() -> bool:
            if proxy.connections == 0:
                forgot.append(time.monotonic())
                return forgot[-1] - forgot[0] > 3
            forgot.clear()
            return False

        pump(forgotten, 60, "both consumers to know no broker")
        proxy.show_brokers()
        lied_at = time.monotonic()
        pump(lambda: events[-1:] == [("assigned", [0])] and len(events) >= 3, 90, "the healed consumer to rejoin")
        assert events == [("assigned", [0]), ("revoked", [0]), ("assigned", [0])], events
        assert restarts.snapshot()["leader_consumer"] == before + 1
        # The fault was real: the consumer without the heal knows no broker, well after the cluster
        # answered again (librdkafka bootstraps again only after 5 minutes).
        assert not control._steady, f"the control rejoined {time.monotonic() - lied_at:.0f}s after the lie"
    finally:
        healed.close()
        control.close()


@pytest.fixture
def blackholed():
    if on_embedded_broker():
        pytest.skip("the producers' heals are shown on Apache Kafka")
    with proxied_broker() as (broker, proxy):
        yield broker, proxy


def answering(_timeout: float) -> ProbeAnswer:
    return ProbeAnswer(True, "the test says the cluster answers")


def test_a_producer_whose_messages_get_no_answer_is_replaced_and_each_message_reported_once(blackholed):
    broker, proxy = blackholed
    topic = f"stuck-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, topic, partitions=2)
    producer = ConfluentProducer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True,
                                  "delivery.timeout.ms": 3000, "linger.ms": 1}, heal_after=6.0)
    assert producer._watch is not None
    producer._watch._probe = answering
    reports: dict[int, list[DeliveryError | None]] = {}

    def send(n: int) -> None:
        reports[n] = []
        producer.produce(topic, f"k{n % 5}", str(n).encode(), (), reports[n].append)

    before = restarts.snapshot().get("producer", 0)
    first = producer._producer
    try:
        for n in range(20):
            send(n)
        wait_until(lambda: producer.poll(0.05) >= 0 and all(reports[n] == [None] for n in range(20)), 30,
                   "the first messages to be delivered")
        proxy.blackhole()
        n = 20
        # Keep producing, as the engine does after each failed delivery, until the producer is replaced.
        while producer._producer is first:
            send(n)
            n += 1
            producer.poll(0.1)
            assert n < 2000, "never replaced"
        proxy.heal()
        for m in range(n, n + 20):
            send(m)
        wait_until(lambda: producer.poll(0.05) >= 0 and all(reports[m] == [None] for m in range(n, n + 20)), 30,
                   "the new producer to deliver")
    finally:
        proxy.heal()
        producer.flush(10)
        producer.close()
    assert restarts.snapshot()["producer"] == before + 1
    # One report per message, never two, whatever producer held it: the engine's per-key gate needs that.
    assert all(len(r) == 1 for r in reports.values()), {k: v for k, v in reports.items() if len(v) != 1}
    failed = [r[0] for r in reports.values() if r[0] is not None]
    assert failed and all(e.retriable and not e.fatal for e in failed), failed


def test_a_transactional_producer_that_commits_nothing_is_refused_for_a_new_one(kafka_bootstrap):
    if on_embedded_broker():
        pytest.skip("the embedded broker has no transactions")
    producer = ConfluentTransactionalProducer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"stuck-{uuid.uuid4().hex[:8]}"}, heal_after=3.0
    )
    watch = producer._transactions_watch
    assert watch is not None
    watch._probe = answering
    before = restarts.snapshot().get("transactional_producer", 0)
    try:
        producer.init_transactions(30)
        # An idle producer is not stuck, however long since its last commit.
        watch._since -= 60
        producer.begin_transaction()
        producer.commit_transaction(30)
        # Transactions that never commit (here aborted, each): refused once the limit has
        # passed and a fresh client would get answers; the engine then takes over afresh.
        refused: list[TransactionError] = []

        def aborted_again() -> bool:
            try:
                producer.begin_transaction()
            except TransactionError as e:
                refused.append(e)
                return True
            producer.abort_transaction(30)
            return False

        wait_until(aborted_again, 30, "the stuck transactional producer to be refused", interval=0.2)
        assert refused[0].kind == "fatal" and "replacing the producer" in str(refused[0])
        assert restarts.snapshot()["transactional_producer"] == before + 1
    finally:
        producer.close()


def test_the_restarts_are_exported_for_every_client():
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from pyharvest.bindings.ops.collector import client_restarts

    class One:
        def collect(self):
            yield client_restarts("pyharvest")

    registry = CollectorRegistry()
    registry.register(One())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    for client in ("leader_consumer", "producer", "transactional_producer"):
        assert f'pyharvest_kafka_client_restarts_total{{client="{client}"}}' in text, text
