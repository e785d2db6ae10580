"""An ``OutboxRecord`` refuses a key or topic of the wrong type when it is built, where the mistake is made."""

from __future__ import annotations

import re

import pytest

from pyharvest import OutboxRecord
from pyharvest.core.records import InvalidRecordError


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
