"""The data producer a process's shards share (in memory; the sharded harvest tests run it
against the broker): one producer, each report to the shard that sent it, prompt wake-ups,
and a producer of its own for a shard that must replace a broken one."""

from __future__ import annotations

import threading
import time

from pyharvest.core.publishing.shared_producer import ProducerHandle, ShardKafkaClients, SharedProducer
from pyharvest.core.ports.kafka import DeliveryError, KafkaConfigMap
from tests.helpers.fakes import FakeKafka, FakeProducer
from tests.helpers.waiting import wait_until


class CountingKafka(FakeKafka):
    def __init__(self) -> None:
        super().__init__()
        self.producers: list[FakeProducer] = []
        self.closed = 0

    def producer(self, config: KafkaConfigMap) -> FakeProducer:
        kafka = self

        class Closing(FakeProducer):
            def close(self) -> None:
                kafka.closed += 1

        p = Closing(self.cluster)
        self.producers.append(p)
        return p


def reports_to(into: list[tuple[str, DeliveryError | None]], key: str):  # type: ignore[no-untyped-def]
    return lambda err: into.append((key, err))


def test_shards_share_one_producer_and_each_report_reaches_the_shard_that_sent_it() -> None:
    kafka = CountingKafka()
    shared = SharedProducer(kafka, {})
    a, b = (ShardKafkaClients(kafka, shared).producer({}) for _ in range(2))
    got_a: list[tuple[str, DeliveryError | None]] = []
    got_b: list[tuple[str, DeliveryError | None]] = []
    try:
        for i in range(50):
            a.produce("t", f"a{i}", b"v", [], reports_to(got_a, f"a{i}"))
            b.produce("t", f"b{i}", b"v", [], reports_to(got_b, f"b{i}"))
        wait_until(lambda: len(got_a) == 50 and len(got_b) == 50)
        assert len(kafka.producers) == 1
        assert [k for k, _ in got_a] == [f"a{i}" for i in range(50)]
        assert [k for k, _ in got_b] == [f"b{i}" for i in range(50)]
        assert [k for k, _ in kafka.cluster.logs["t"] if k.startswith("a")] == [f"a{i}" for i in range(50)]
    finally:
        shared.close()
    assert kafka.closed == 1


def test_a_shards_poll_returns_when_reports_arrive_not_at_its_timeout() -> None:
    kafka = CountingKafka()
    kafka.cluster.hold = True
    shared = SharedProducer(kafka, {})
    handle = ShardKafkaClients(kafka, shared).producer({})
    got: list[tuple[str, DeliveryError | None]] = []
    try:
        handle.produce("t", "k", b"v", [], reports_to(got, "k"))
        assert handle.poll(0.05) == 0 and not got  # held: nothing served, the wait ran out

        def release() -> None:
            # Once the shard's poll waits for its reports (a waiter on its Event's condition).
            wait_until(lambda: handle.arrived._cond._waiters, 10, "the shard's poll to wait")  # type: ignore[attr-defined]
            kafka.cluster.hold = False

        threading.Thread(target=release).start()
        started = time.monotonic()
        while not got:
            handle.poll(10.0)
        assert time.monotonic() - started < 2.0
        assert got == [("k", None)]
    finally:
        shared.close()


def test_a_shard_replacing_its_producer_gets_one_of_its_own() -> None:
    kafka = CountingKafka()
    shared = SharedProducer(kafka, {})
    clients = ShardKafkaClients(kafka, shared)
    first = clients.producer({})
    assert isinstance(first, ProducerHandle)
    first.close()  # the engine closes the broken one
    second = clients.producer({})
    assert not isinstance(second, ProducerHandle)
    assert len(kafka.producers) == 2
    # The other shards keep the shared one.
    other = ShardKafkaClients(kafka, shared).producer({})
    assert isinstance(other, ProducerHandle) and len(kafka.producers) == 2
    shared.close()


def test_closing_stops_the_poller_and_refuses_new_shards() -> None:
    kafka = CountingKafka()
    shared = SharedProducer(kafka, {})
    ShardKafkaClients(kafka, shared).producer({})
    shared.close()
    assert kafka.closed == 1
    assert not any(t.name == "pyharvest-producer" and t.is_alive() for t in threading.enumerate())
    try:
        shared.handle()
    except RuntimeError as e:
        assert "closed" in str(e)
    else:
        raise AssertionError("a closed shared producer handed out a handle")
