"""A delivery callback that raises, on a real broker: nothing escapes into librdkafka's
dispatch. confluent-kafka would keep serving the flush's other reports with the exception
still set, each failing in ways that name nothing true, and the flush would raise (what
crashed an exactly-once shard in the cluster tests). The record whose report could not be
handled counts as not delivered (retried, never lost); every other record's report arrives
as it should."""

from __future__ import annotations

import logging

import pytest

from pyharvest.bindings.kafka.confluent import ConfluentProducer
from pyharvest.core.ports.kafka import DeliveryError
from tests.helpers.topics import create_topic


@pytest.mark.kafka
def test_a_raising_delivery_callback_fails_its_record_and_no_other(kafka_bootstrap, topic_name, caplog):
    caplog.set_level(logging.WARNING, logger="pyharvest.kafka")
    create_topic(kafka_bootstrap, topic_name, partitions=1)
    producer = ConfluentProducer({"bootstrap.servers": kafka_bootstrap})
    reports: dict[int, list[DeliveryError | None]] = {i: [] for i in range(20)}

    def on_delivery(i: int):
        def report(err: DeliveryError | None) -> None:
            reports[i].append(err)
            if i == 3 and err is None:
                raise RuntimeError("a bug in a delivery callback")
        return report

    try:
        for i in range(20):
            producer.produce(topic_name, f"k{i % 2}", f"v{i}".encode(), [], on_delivery(i))
        assert producer.flush(30) == 0  # no exception escapes the flush
    finally:
        producer.close()
    assert reports[3][0] is None and len(reports[3]) == 2 and reports[3][1] is not None
    assert reports[3][1].code == "_CALLBACK" and reports[3][1].retriable
    assert all(r == [None] for i, r in reports.items() if i != 3), reports
    logged = [r for r in caplog.records if "delivery report could not be handled" in r.getMessage()]
    assert logged and "a bug in a delivery callback" in logged[0].getMessage()


class LostException:
    """A librdkafka producer whose flush lost a callback's exception inside confluent-kafka."""

    def flush(self, timeout: float) -> int:
        raise SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL without setting an exception")

    def __len__(self) -> int:
        return 0


def test_a_flush_that_lost_an_exception_aborts_the_transaction(caplog):
    from pyharvest.bindings.kafka.transactions import ConfluentTransactionalProducer

    producer = ConfluentTransactionalProducer({"bootstrap.servers": "127.0.0.1:9", "transactional.id": "t-1"})
    real, producer._producer = producer._producer, LostException()  # type: ignore[assignment]
    try:
        # Counted as left over: the publisher aborts the transaction and remarks its records.
        assert producer.flush(1.0) == 1
    finally:
        producer._producer = real
    assert any("the transaction is aborted" in r.getMessage() for r in caplog.records)


def test_a_log_line_that_cannot_be_logged_stays_out_of_the_dispatch(capsys):
    from pyharvest.bindings.kafka.librdkafka_logs import _LibrdkafkaLogger

    class Broken:
        def log(self, *args: object) -> None:
            raise RuntimeError("a handler that fails")

    logger = _LibrdkafkaLogger(Broken())  # type: ignore[arg-type]
    logger.log(logging.WARNING, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "Connect failed")
    logger.log(logging.WARNING, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "Connect failed again")
    assert logger.lost == 2
    assert capsys.readouterr().err.count("RuntimeError: a handler that fails") == 1  # the first only
