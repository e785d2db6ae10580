"""Kafka headers as portable text: a JSON array of ``[key, value]`` pairs.

The one header format pyharvest stores, in the outbox's ``kafka_headers`` column and in the
inbox's dead letters. A ``str`` value is stored as a JSON string; a ``bytes`` value as
``{"base64": "…"}``, so arbitrary bytes round-trip exactly and the two kinds stay
distinguishable; a ``None`` value (a Kafka header without a value) as ``null``. The JSON is
ASCII-only (``\\u`` escapes), so the column needs no Unicode-capable character set.
"""

from __future__ import annotations

import json
from base64 import b64decode, b64encode
from collections.abc import Sequence

from pyharvest.core.outbox.records import Header, HeaderValue

__all__ = ["EMPTY_HEADERS", "NullableHeader", "decode_headers", "decode_nullable_headers", "encode_headers"]

#: A header as Kafka delivers it to a consumer: its value may be absent.
NullableHeader = tuple[str, HeaderValue | None]

EMPTY_HEADERS = "[]"
_BYTES_TAG = "base64"
_dumps = json.JSONEncoder(separators=(",", ":")).encode
_loads = json.loads


def encode_headers(headers: Sequence[NullableHeader]) -> str:
    if not headers:
        return EMPTY_HEADERS
    return _dumps([[k, _encode_value(v)] for k, v in headers])


def _encode_value(v: HeaderValue | None) -> object:
    if v is None or isinstance(v, str):
        return v
    return {_BYTES_TAG: b64encode(v).decode("ascii")}


# Outboxes repeat a handful of header sets (a service stamps the same few on everything), and
# parsing JSON per row was an eighth of the harvester's CPU: decoded tuples are immutable, so
# rows with the same text share one. Bounded; cleared when full rather than tracking recency.
_CACHE_SIZE = 4096
_cache: dict[str, tuple[Header, ...]] = {}


def decode_headers(text: str) -> tuple[Header, ...]:
    """Inverse of :func:`encode_headers`; raises ``ValueError`` on anything it did not write."""
    if text == EMPTY_HEADERS:  # the common case: no JSON parse per row
        return ()
    cached = _cache.get(text)
    if cached is not None:
        return cached
    decoded: tuple[Header, ...] = _decode(text, nullable=False)  # type: ignore[assignment]  # no None without nullable
    if len(_cache) >= _CACHE_SIZE:
        _cache.clear()
    _cache[text] = decoded
    return decoded


def decode_nullable_headers(text: str) -> tuple[NullableHeader, ...]:
    """:func:`decode_headers` for headers as a consumer got them: ``null`` values allowed."""
    return _decode(text, nullable=True)


def _decode(text: str, nullable: bool) -> tuple[NullableHeader, ...]:
    pairs = _loads(text)
    if type(pairs) is not list:
        raise ValueError("headers are not a JSON array")
    out: list[NullableHeader] = []
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str:
            raise ValueError(f"header entry {pair!r} is not a [key, value] pair")
        k, v = pair
        if type(v) is str or (v is None and nullable):
            out.append((k, v))
        elif type(v) is dict and len(v) == 1 and type(v.get(_BYTES_TAG)) is str:
            out.append((k, b64decode(v[_BYTES_TAG], validate=True)))
        else:
            raise ValueError(f"header {k!r} has a value of unexpected form")
    return tuple(out)
