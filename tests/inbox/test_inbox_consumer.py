"""The Kafka consumer adapter, on a fake confluent-kafka ``Consumer``: the configuration the
inbox owns, seeking to the database's offsets, rebalances as plain calls, and which fetched
messages reach the inbox."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException

from pyharvest.bindings.kafka.inbox_consumer import ConfluentInboxConsumer, inbox_consumer_config
from pyharvest.bindings.kafka.librdkafka_logs import librdkafka_logger
from pyharvest.errors import InboxError
from pyharvest.inbox import InboxMessage, delivery_id_for
from tests.helpers.inbox.fakes import GROUP, TOPIC, FakeConfluentConsumer, kafka_error, kafka_message


class Listener:
    """Records the calls; ``starts`` answers ``assigned``, ``fail`` makes a call raise."""

    def __init__(self, starts=None) -> None:
        self.starts: dict[tuple[str, int], int | None] = starts or {}
        self.calls: list[tuple[str, list[tuple[str, int]]]] = []
        self.fail: dict[str, BaseException] = {}

    def _call(self, event, tps):
        self.calls.append((event, tps))
        if event in self.fail:
            raise self.fail[event]

    def assigned(self, partitions):
        self._call("assigned", partitions)
        return {tp: self.starts.get(tp) for tp in partitions}

    def revoked(self, partitions):
        self._call("revoked", partitions)

    def lost(self, partitions):
        self._call("lost", partitions)


def make(base=None, starts=None) -> tuple[ConfluentInboxConsumer, FakeConfluentConsumer, Listener]:
    built: list[FakeConfluentConsumer] = []

    def factory(conf):
        built.append(FakeConfluentConsumer(conf))
        return built[0]

    consumer = ConfluentInboxConsumer(base or {"bootstrap.servers": "x:9092"}, GROUP, factory=factory)
    listener = Listener(starts)
    consumer.subscribe([TOPIC], listener)
    return consumer, built[0], listener


def test_the_inbox_owns_group_and_offsets_in_the_configuration():
    conf = inbox_consumer_config({"bootstrap.servers": "x:9092", "session.timeout.ms": 6000}, "g")
    assert conf["group.id"] == "g"
    assert conf["enable.auto.commit"] is False and conf["enable.auto.offset.store"] is False
    assert conf["auto.offset.reset"] == "earliest"  # a default, not an override
    assert conf["session.timeout.ms"] == 6000
    assert conf["logger"] is librdkafka_logger()  # repeats collapsed, counted across clients
    assert inbox_consumer_config({"auto.offset.reset": "latest"}, "g")["auto.offset.reset"] == "latest"


def test_assignment_seeks_to_the_database_offsets_not_kafkas():
    consumer, fake, listener = make(starts={(TOPIC, 0): 7})
    assert fake.topics == [TOPIC]
    fake.rebalance("assign", [(TOPIC, 0), (TOPIC, 1)])
    assert consumer.poll(10, 0) == []
    assert listener.calls == [("assigned", [(TOPIC, 0), (TOPIC, 1)])]
    assert fake.assignment == [(TOPIC, 0, 7), (TOPIC, 1, OFFSET_BEGINNING)]
    assert fake.resumed == [(TOPIC, 0), (TOPIC, 1)], "partitions paused by an earlier fence loss flow again"


def test_partitions_without_a_database_offset_follow_auto_offset_reset():
    consumer, fake, _ = make(base={"bootstrap.servers": "x:9092", "auto.offset.reset": "latest"})
    fake.rebalance("assign", [(TOPIC, 0)])
    consumer.poll(10, 0)
    assert fake.assignment == [(TOPIC, 0, OFFSET_END)]


def test_poll_builds_inbox_messages_with_identities():
    consumer, fake, _ = make()
    fake.rebalance("assign", [(TOPIC, 0)])
    fake.deliver(kafka_message(0, 0, "a", b"1", source=("g/outbox", 5)), kafka_message(0, 1, None, b"2"))
    got = consumer.poll(10, 0)
    assert [type(m) for m in got] == [InboxMessage, InboxMessage]
    a, b = got
    assert (a.topic, a.partition, a.offset, a.key, a.value) == (TOPIC, 0, 0, b"a", b"1")
    assert a.source == ("g/outbox", 5) and a.delivery_id == delivery_id_for(GROUP, TOPIC, 0, 0, ("g/outbox", 5))
    assert a.timestamp_ms == 1_700_000_000_000
    assert b.key is None and b.source is None and b.headers == ()
    assert b.delivery_id == delivery_id_for(GROUP, TOPIC, 0, 1, None)


def test_poll_drops_unassigned_partitions_and_offsets_already_delivered():
    consumer, fake, _ = make(starts={(TOPIC, 0): 5})
    fake.rebalance("assign", [(TOPIC, 0)])
    fake.deliver(
        kafka_message(0, offset=4),  # before the database's offset: a stale fetch
        kafka_message(0, offset=5),
        kafka_message(1, offset=0),  # not assigned to us
        kafka_message(0, offset=5),  # delivered already
        kafka_message(0, offset=6),
    )
    assert [(m.partition, m.offset) for m in consumer.poll(10, 0)] == [(0, 5), (0, 6)]


def test_errors_are_skipped_unless_fatal(caplog):
    consumer, fake, _ = make()
    fake.rebalance("assign", [(TOPIC, 0)])
    fake.deliver(
        kafka_error(KafkaError._PARTITION_EOF),
        kafka_error(KafkaError._TRANSPORT),
        kafka_message(0, offset=0),
    )
    with caplog.at_level(logging.WARNING, logger="pyharvest.inbox"):
        assert [m.offset for m in consumer.poll(10, 0)] == [0]
    assert len([r for r in caplog.records if "retried" in r.getMessage()]) == 1, "end of partition is not worth a line"
    fake.deliver(kafka_error(KafkaError._FATAL, fatal=True))
    with pytest.raises(InboxError, match="fatal Kafka consumer error"):
        consumer.poll(10, 0)


def test_a_refused_assignment_stops_the_inbox_and_delivers_nothing():
    consumer, fake, listener = make()
    listener.fail["assigned"] = RuntimeError("database down\nSELECT secret")
    fake.rebalance("assign", [(TOPIC, 0)])
    fake.deliver(kafka_message(0, offset=0))
    with pytest.raises(InboxError, match=r"cannot take partitions over: RuntimeError: database down$") as raised:
        consumer.poll(10, 0)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert fake.assignment == []
    assert consumer.poll(10, 0) == [], "messages of partitions never claimed are not delivered"


def test_revocation_and_loss_are_plain_calls_and_stop_delivery():
    consumer, fake, listener = make()
    fake.rebalance("assign", [(TOPIC, 0), (TOPIC, 1)])
    fake.rebalance("revoke", [(TOPIC, 0)])
    fake.rebalance("lost", [(TOPIC, 1)])
    fake.deliver(kafka_message(0, offset=0), kafka_message(1, offset=0))
    assert consumer.poll(10, 0) == []
    assert [event for event, _ in listener.calls] == ["assigned", "revoked", "lost"]


def test_what_a_rebalance_raises_is_raised_by_the_poll_that_ran_it():
    consumer, fake, listener = make()
    fake.rebalance("assign", [(TOPIC, 0)])
    consumer.poll(10, 0)
    boom = KeyError("in revoked")
    listener.fail["revoked"] = boom
    fake.rebalance("revoke", [(TOPIC, 0)])
    with pytest.raises(KeyError) as raised:
        consumer.poll(10, 0)
    assert raised.value is boom
    assert consumer.poll(10, 0) == [], "raised once"


def test_pause_stops_delivery_until_assigned_again():
    consumer, fake, _ = make()
    fake.rebalance("assign", [(TOPIC, 0)])
    consumer.poll(10, 0)
    consumer.pause([(TOPIC, 0)])
    assert fake.paused == [(TOPIC, 0)]
    fake.deliver(kafka_message(0, offset=0))
    assert consumer.poll(10, 0) == []
    fake.fail_pause = KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
    consumer.pause([(TOPIC, 0)])  # no longer assigned: nothing to pause, not an error
    fake.rebalance("assign", [(TOPIC, 0)])
    fake.deliver(kafka_message(0, offset=1))
    assert [m.offset for m in consumer.poll(10, 0)] == [1]


def test_offsets_are_committed_to_kafka_for_monitoring_only():
    consumer, fake, _ = make()
    consumer.commit({(TOPIC, 0): 5, (TOPIC, 1): 9})
    assert fake.commits == [[(TOPIC, 0, 5), (TOPIC, 1, 9)]]
    fake.fail_commit = KafkaException(KafkaError(KafkaError._NO_OFFSET))
    consumer.commit({(TOPIC, 0): 6})  # never worth failing a batch for


def test_close_leaves_the_group_once_and_then_does_nothing():
    consumer, fake, listener = make()
    fake.rebalance("assign", [(TOPIC, 0)])
    consumer.poll(10, 0)
    consumer.close()
    assert fake.closed and listener.calls[-1] == ("revoked", [(TOPIC, 0)])
    consumer.close()
    consumer.commit({(TOPIC, 0): 1})
    consumer.pause([(TOPIC, 0)])
    assert fake.commits == [] and fake.paused == []
