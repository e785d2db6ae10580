"""From Arrow record batches (what Spark hands a Python writer) to rows for the staging tables.

Validation is vectorised where it can be (nulls, key lengths, the few distinct topics), so
the per-row Python work is just building tuples. Error messages name columns and the Spark
partition, never values: values may be sensitive.
"""

from __future__ import annotations

import json
from base64 import b64encode
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from itertools import repeat
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pyharvest.bindings.spark.key_hashes import key_hashes
from pyharvest.bindings.spark.outbox_layout import EMPTY_HEADERS, KEY_LENGTH, encode_headers
from pyharvest.core.outbox.records import Header, InvalidRecordError, OutboxRecord, validate_record

__all__ = [
    "EventFunction",
    "EventMapping",
    "OutboxColumns",
    "derive_events",
    "outbox_payload",
    "row_dicts",
]

# What an events function returns per row: records, or (topic, key, value[, headers]) tuples.
EventFunction = Callable[[dict[str, Any]], Iterable[OutboxRecord | tuple[Any, ...]] | None]


@dataclass(frozen=True)
class OutboxColumns:
    """Which DataFrame columns hold the record's parts (checked against the schema on the driver)."""

    topic: str = "topic"
    key: str = "key"
    value: str = "value"
    headers: str | None = None  # optional column


@dataclass(frozen=True)
class EventMapping:
    """One event per row from columns: a literal topic, the key from a column, the value from
    a column or (``value_column=None``) the whole row as JSON."""

    topic: str
    key_column: str
    value_column: str | None = None


def _as_binary(col: pa.ChunkedArray | pa.Array) -> pa.Array | pa.ChunkedArray:
    t = col.type
    if pa.types.is_string(t):
        return pc.cast(col, pa.binary())  # zero-copy: same layout
    if pa.types.is_large_string(t):
        return pc.cast(col, pa.large_binary())
    return col


def _as_string(col: pa.ChunkedArray | pa.Array) -> pa.Array | pa.ChunkedArray:
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return col
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        try:
            return pc.cast(col, pa.large_string() if pa.types.is_large_binary(t) else pa.string())
        except pa.ArrowInvalid:
            raise InvalidRecordError(
                "record keys must be UTF-8 text; a binary key column holds invalid UTF-8"
            ) from None
    return pc.cast(col, pa.string())


def _check_topics(col: pa.Array, where: str) -> None:
    if col.null_count:
        raise InvalidRecordError(f"{where}: {col.null_count} row(s) have a null topic")
    for topic in pc.unique(col).to_pylist():
        validate_record(OutboxRecord(topic, "k"))  # raises naming the bad topic


def _check_keys(col: pa.Array, where: str) -> None:
    if col.null_count:
        raise InvalidRecordError(
            f"{where}: {col.null_count} row(s) have a null key; the harvester orders records per key"
        )
    if len(col):
        lengths = pc.utf8_length(col)
        shortest, longest = pc.min_max(lengths).values()
        if shortest.as_py() == 0:
            raise InvalidRecordError(f"{where}: a row has an empty key; the harvester orders records per key")
        if longest.as_py() > KEY_LENGTH:
            raise InvalidRecordError(
                f"{where}: a key is {longest.as_py()} characters long; the outbox holds at most {KEY_LENGTH}"
            )


def _header_pairs(entry: Any) -> list[Header]:
    # map<string, …> arrives as [(k, v)], array<struct<key, value>> as [{"key": k, "value": v}].
    pairs = [(e["key"], e["value"]) if isinstance(e, dict) else (e[0], e[1]) for e in entry]
    for k, v in pairs:
        if not isinstance(k, str) or not k or not isinstance(v, str | bytes):
            raise InvalidRecordError(
                "a header has a null or empty key or a null value; headers need a key and a str or bytes value"
            )
    return pairs


def _headers_text(col: pa.Array | None, n: int) -> Iterable[str]:
    if col is None or col.null_count == n:
        return repeat(EMPTY_HEADERS, n)
    return [EMPTY_HEADERS if not entry else encode_headers(_header_pairs(entry)) for entry in col.to_pylist()]


def _with_hashes(columns: tuple[Iterable[Any], ...], keys: pa.Array | None,
                 key_hash: bool) -> tuple[Iterable[Any], ...]:
    if not key_hash:
        return columns
    if keys is None:
        keys = pa.array(columns[1], pa.string())
    return (*columns, key_hashes(keys).to_pylist())


def outbox_payload(batch: pa.RecordBatch, cols: OutboxColumns, where: str,
                   key_hash: bool = False) -> tuple[Iterable[Any], ...]:
    """The columns (topic, key, value, headers-as-JSON[, key hash]) of a batch of records."""
    topic = batch.column(cols.topic)
    key = _as_string(batch.column(cols.key))
    value = _as_binary(batch.column(cols.value))
    _check_topics(topic, where)
    _check_keys(key, where)
    headers = batch.column(cols.headers) if cols.headers else None
    columns = (topic.to_pylist(), key.to_pylist(), value.to_pylist(), _headers_text(headers, batch.num_rows))
    return _with_hashes(columns, key, key_hash)


def row_dicts(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = batch.to_pylist()
    return rows


def _json_default(v: Any) -> Any:
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, bytes | bytearray):
        return b64encode(v).decode("ascii")
    raise TypeError(f"cannot put a {type(v).__name__} into an event's JSON value")


_dumps = json.JSONEncoder(separators=(",", ":"), default=_json_default).encode


def _record_tuple(item: OutboxRecord | tuple[Any, ...]) -> tuple[Any, ...]:
    if isinstance(item, OutboxRecord):
        r = item
    elif isinstance(item, tuple) and len(item) in (3, 4):
        r = OutboxRecord(*item)
    else:
        raise InvalidRecordError(
            f"an events function returned {type(item).__name__}; "
            "expected OutboxRecord or (topic, key, value[, headers])"
        )
    validate_record(r)
    if len(r.key) > KEY_LENGTH:
        raise InvalidRecordError(f"an event key is {len(r.key)} characters long; the outbox holds at most {KEY_LENGTH}")
    return (r.topic, r.key, r.value_bytes(), encode_headers(r.headers) if r.headers else EMPTY_HEADERS)


def derive_events(rows: Sequence[Mapping[str, Any]], batch: pa.RecordBatch,
                  events: EventMapping | EventFunction, where: str,
                  key_hash: bool = False) -> tuple[Iterable[Any], ...]:
    """The columns (topic, key, value, headers[, key hash]) of the events for these rows, in
    row order."""
    if isinstance(events, EventMapping):
        key = _as_string(batch.column(events.key_column))
        _check_keys(key, f"{where}, event key column {events.key_column!r}")
        if events.value_column is None:
            values: Iterable[Any] = (_dumps(r).encode() for r in rows)
        else:
            values = _as_binary(batch.column(events.value_column)).to_pylist()
        return _with_hashes((repeat(events.topic), key.to_pylist(), values, repeat(EMPTY_HEADERS)), key, key_hash)
    out: list[tuple[Any, ...]] = []
    for row in rows:
        produced = events(dict(row))
        if produced is None:
            continue
        if isinstance(produced, OutboxRecord):
            produced = (produced,)
        out.extend(_record_tuple(item) for item in produced)
    columns: tuple[Iterable[Any], ...] = tuple(zip(*out, strict=True)) if out else ((), (), (), ())
    return _with_hashes(columns, None, key_hash)
