"""The message a handler receives, and the identities that make redeliveries recognisable.

Two identities matter:

* the **source identity** — which outbox row a message was published from: the
  ``pyharvest-outbox`` and ``pyharvest-record-id`` headers the harvester stamps, identical
  on every copy it publishes. The inbox drops a copy whose source identity it already applied.
* the **delivery id** — Cues' *delivery hash*: a digest of the consumer group and the
  source identity (or, for messages without the headers, of topic/partition/offset). Every
  redelivery of the same message to the same group carries the same value, so a handler can
  pass it to an external system as an idempotency key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from pyharvest.core.outbox.identity import OUTBOX_HEADER, RECORD_ID_HEADER

__all__ = [
    "OUTBOX_HEADER",
    "RECORD_ID_HEADER",
    "InboxMessage",
    "MessageHeader",
    "Source",
    "build_message",
    "delivery_id_for",
    "source_identity",
]


#: A header as Kafka delivers it: raw bytes, or None for a null value. Not an outbox record's
#: :data:`pyharvest.core.outbox.records.Header`, whose value is the str or bytes the stasher wrote.
MessageHeader = tuple[str, bytes | None]

#: A source identity: the outbox (``<leaderGroupID>/<outboxTable>``) and the record's id in it.
Source = tuple[str, int]


def source_identity(headers: Sequence[MessageHeader] | None) -> tuple[str, int] | None:
    """``(outbox, record id)`` from the harvester's headers, or None when absent or malformed.

    A malformed header is treated as absent (the message then falls back to its offset
    identity, which the checkpoint already covers) rather than rejected: the inbox must not
    be stopped by a header some other producer happened to set.
    """
    if not headers:
        return None
    outbox: bytes | None = None
    record: bytes | None = None
    for name, value in headers:
        if name == OUTBOX_HEADER:
            outbox = value
        elif name == RECORD_ID_HEADER:
            record = value
    if not outbox or not record or not record.isdigit() or len(record) > 19:
        return None
    try:
        return outbox.decode(), int(record)
    except UnicodeDecodeError:
        return None


def delivery_id_for(group_id: str, topic: str, partition: int, offset: int, source: tuple[str, int] | None) -> str:
    """The delivery hash: 32 hex digits, the same for every redelivery of one message."""
    if source is not None:
        basis = f"{group_id}\x00o\x00{source[0]}\x00{source[1]}"
    else:
        basis = f"{group_id}\x00k\x00{topic}\x00{partition}\x00{offset}"
    return hashlib.blake2b(basis.encode(), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class InboxMessage:
    """One Kafka message, as the handler sees it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[MessageHeader, ...] = ()
    #: Milliseconds since the epoch, as Kafka reports it (None if the broker gave none).
    timestamp_ms: int | None = None
    #: ``(outbox, record id)`` when the message came from a pyharvest harvester.
    source: tuple[str, int] | None = None
    #: Stable across redeliveries; use it as an idempotency key for external calls.
    delivery_id: str = field(default="")

    @property
    def key_text(self) -> str | None:
        """The key decoded as UTF-8 (outbox keys are strings)."""
        return None if self.key is None else self.key.decode("utf-8", "replace")

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or None."""
        found: bytes | None = None
        for n, v in self.headers:
            if n == name:
                found = v
        return found

    def __repr__(self) -> str:
        # Values may hold personal data: a repr for logs shows where the message is, not what.
        return (
            f"InboxMessage(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
            f"key={self.key_text!r}, source={self.source!r}, delivery_id={self.delivery_id!r})"
        )


_FIELDS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp_ms", "source", "delivery_id")
if tuple(f.name for f in fields(InboxMessage)) != _FIELDS:  # pragma: no cover - caught by any test run
    raise AssertionError("build_message() sets InboxMessage's fields by name: update it with them")
_new = object.__new__
_set_topic, _set_partition, _set_offset, _set_key, _set_value, _set_headers, _set_ts, _set_source, _set_delivery = (
    InboxMessage.__dict__[name].__set__ for name in _FIELDS
)


def build_message(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: tuple[MessageHeader, ...],
    timestamp_ms: int | None,
    source: tuple[str, int] | None,
    delivery_id: str,
) -> InboxMessage:
    """``InboxMessage(...)`` for the consumer, which builds one per message: the frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``, which costs
    about twice what setting its slots directly does (measured: 1.2 µs against 0.6 µs)."""
    m = _new(InboxMessage)
    _set_topic(m, topic)
    _set_partition(m, partition)
    _set_offset(m, offset)
    _set_key(m, key)
    _set_value(m, value)
    _set_headers(m, headers)
    _set_ts(m, timestamp_ms)
    _set_source(m, source)
    _set_delivery(m, delivery_id)
    return m
