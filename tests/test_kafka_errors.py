"""How the confluent-kafka binding classifies librdkafka's errors: one list of fencing codes,
a typed ``fenced`` flag on delivery errors, and the transactional calls' kinds read from it."""

from __future__ import annotations

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import KafkaError, KafkaException  # noqa: E402

from pyharvest.bindings.kafka.confluent import FENCING_CODES, delivery_error  # noqa: E402
from pyharvest.bindings.kafka.transactions import transaction_error  # noqa: E402


@pytest.mark.parametrize("name", ["PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED"])
def test_a_fencing_code_is_a_fenced_and_fatal_delivery_error_and_a_fenced_transaction(name):
    code = getattr(KafkaError, name)
    assert code in FENCING_CODES
    err = delivery_error(KafkaError(code, "a newer producer took over"))
    assert err.fenced and err.fatal and err.retriable
    assert transaction_error(KafkaException(KafkaError(code, "a newer producer took over"))).kind == "fenced"


def test_other_errors_are_not_fenced_whatever_their_text_says():
    # The old classification matched "FENCED" in the code's name; a message naming it is not a fence.
    err = delivery_error(KafkaError(KafkaError.REQUEST_TIMED_OUT, "not FENCED, only slow"))
    assert not err.fenced and not err.fatal and err.retriable
    fatal = delivery_error(KafkaError(KafkaError._FATAL, "fatal"))
    assert fatal.fatal and not fatal.fenced


def test_a_poison_error_is_not_retriable():
    err = delivery_error(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
    assert not err.retriable and not err.fenced
