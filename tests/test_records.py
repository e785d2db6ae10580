"""An ``OutboxRecord`` refuses a key of the wrong type, or a topic Kafka would refuse, when it is built, where the
mistake is made; a record read back from a row (``stored_record``) is not refused for its topic's name."""

from __future__ import annotations

import re

import pytest

from pyharvest import OutboxRecord
from pyharvest.core.outbox.records import InvalidRecordError, validate_record


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda: OutboxRecord("orders", key=42), "record key must be a str, got int (42)"),
        (lambda: OutboxRecord("orders", None, b"v"), "record key must be a str, got NoneType"),
        (lambda: OutboxRecord(b"orders", "k"), "record topic must be a str, got bytes"),
    ],
)
def test_a_key_or_topic_of_the_wrong_type_is_refused_when_built(build, reason):
    with pytest.raises(InvalidRecordError, match=re.escape(reason)):
        build()


def test_a_str_subclass_is_a_str():
    class Safe(str):
        pass

    assert OutboxRecord("orders", Safe("k")).key == "k"


def test_a_bytes_key_is_refused_with_advice_that_keeps_its_text() -> None:
    with pytest.raises(InvalidRecordError) as refused:
        OutboxRecord("t", b"\xff")  # type: ignore[arg-type]
    # str(b"\xff") is "b'\\xff'": the advice is to decode, not to take the repr.
    assert "key.decode('utf-8')" in str(refused.value) and "pass str(key)" not in str(refused.value)


def test_a_missing_key_is_refused_with_advice_that_does_not_put_every_record_on_one_key() -> None:
    with pytest.raises(InvalidRecordError) as refused:
        OutboxRecord("t", None)  # type: ignore[arg-type]
    # str(None) is "None": every keyless record on one key and one partition.
    message = str(refused.value)
    assert "str(key)" not in message and "str(order.id)" in message and "uuid" in message


def test_a_number_key_is_refused_with_its_text_form() -> None:
    with pytest.raises(InvalidRecordError, match=r"str\(key\) gives '42'"):
        OutboxRecord("t", 42)  # type: ignore[arg-type]


def test_header_and_value_text_that_cannot_be_encoded_is_refused() -> None:
    for record in (OutboxRecord("t", "k", "\udcff"), OutboxRecord("t", "k", b"v", [("h", "\ud800")])):
        with pytest.raises(InvalidRecordError, match="not valid Unicode"):
            validate_record(record)


@pytest.mark.parametrize("topic", ["nc bad!", "", ".", "..", "t" * 250, "ordres/eu", "ключ"])
def test_a_topic_kafka_would_refuse_is_refused_when_built_with_the_stash_message(topic):
    with pytest.raises(InvalidRecordError) as built:
        OutboxRecord(topic, "k", b"v")
    renamed = OutboxRecord("t", "k", b"v")
    renamed.topic = topic  # a field reassigned after the record was built: the stash's check still refuses it
    with pytest.raises(InvalidRecordError) as stashed:
        validate_record(renamed)
    assert str(built.value) == str(stashed.value)
    if topic:
        assert "is not a valid Kafka topic name (1-249 characters from [a-zA-Z0-9._-], not '.' or '..')" in str(
            built.value
        )
    else:
        assert "must be a non-empty string" in str(built.value)


@pytest.mark.parametrize("topic", ["t", "a" * 249, "orders.eu-west_1", "...", ".a"])
def test_a_topic_kafka_takes_is_accepted(topic):
    assert validate_record(OutboxRecord(topic, "k")).topic == topic


def test_a_row_read_back_keeps_a_topic_kafka_refuses_for_the_harvester_to_report():
    # Written by hand or by goharvest: the mark must not fail on it; the delivery error and the
    # poison policy handle it.
    from pyharvest.core.outbox.records import stored_record

    record = stored_record("nc bad!", "k", b"v", (), 7, None, None)
    assert (record.topic, record.key, record.id) == ("nc bad!", "k", 7)
    with pytest.raises(InvalidRecordError, match="record key must be a str"):
        stored_record("t", None, b"v", (), 7, None, None)  # type: ignore[arg-type]
