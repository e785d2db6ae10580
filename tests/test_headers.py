"""The one stored header format: the outbox's kafka_headers column and the inbox's dead letters."""

from __future__ import annotations

import base64
import json

import pytest

from pyharvest.bindings.sql.inbox.deadletters import _decode_headers as dead_letter_headers
from pyharvest.core.outbox.headers import decode_headers, decode_nullable_headers, encode_headers


def test_str_bytes_and_none_values_round_trip_distinguishably() -> None:
    headers = [("a", "text"), ("b", b"\x00\xffbytes"), ("c", None), ("d", "")]
    text = encode_headers(headers)
    assert text.isascii()
    assert decode_nullable_headers(text) == tuple(headers)


def test_outbox_rows_refuse_a_header_without_a_value() -> None:
    # The outbox stores what a service stashed, which always has a value.
    with pytest.raises(ValueError, match="unexpected form"):
        decode_headers(encode_headers([("c", None)]))


def test_dead_letters_use_the_same_format() -> None:
    headers = [("pyharvest-outbox", b"app/outbox"), ("empty", None)]
    assert dead_letter_headers(encode_headers(headers)) == tuple(headers)


def test_dead_letters_stored_in_the_old_format_still_read() -> None:
    # Before the formats were one, dead letters stored each value as plain base64 text.
    old = json.dumps([["pyharvest-record-id", base64.b64encode(b"42").decode()], ["empty", None]])
    assert dead_letter_headers(old) == (("pyharvest-record-id", b"42"), ("empty", None))
