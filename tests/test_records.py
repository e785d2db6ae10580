"""An ``OutboxRecord`` refuses a key or topic of the wrong type when it is built, where the mistake is made."""

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


def test_header_and_value_text_that_cannot_be_encoded_is_refused() -> None:
    for record in (OutboxRecord("t", "k", "\udcff"), OutboxRecord("t", "k", b"v", [("h", "\ud800")])):
        with pytest.raises(InvalidRecordError, match="not valid Unicode"):
            validate_record(record)
