"""The outbox record: what a service stashes and what the harvester publishes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

__all__ = [
    "Header", "HeaderValue", "InvalidRecordError", "OutboxRecord", "check_record", "stored_record", "validate_record",
]

HeaderValue = str | bytes
Header = tuple[str, HeaderValue]

# Kafka's own limit on a topic name.
MAX_TOPIC_LENGTH = 249
_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
# Topic names found valid. A record's topic is checked when it is built and again when it is
# stashed (a field can be reassigned in between); an application writes to a handful of
# topics, so after the first record of each the check is one set look-up, not a scan of its
# characters, and a stashed record's topic is examined once. Bounded against a writer that
# invents topic names: past the bound, names are checked in full each time.
_VALID_TOPICS: set[str] = set()
_MAX_VALID_TOPICS = 4096


class InvalidRecordError(ValueError):
    """A record was refused before anything was written; the message says which field and why."""


@dataclass(slots=True, eq=True)
class OutboxRecord:
    """One message waiting in the outbox.

    ``topic``, ``key``, ``value`` and ``headers`` are what the service supplies. ``key`` is a
    required string: Kafka orders records per key, and so does the harvester. ``value`` of
    ``None`` publishes a tombstone. ``id``, ``create_time`` and ``leader_id`` are filled in on
    records read back from the outbox by a mark.
    """

    topic: str
    key: str
    value: bytes | str | None = None
    headers: Sequence[Header] = ()
    id: int | None = None
    create_time: datetime | None = None
    leader_id: str | None = None

    def __post_init__(self) -> None:
        # Refused where the mistake is made, not later by the stasher or the database: a key
        # that is not text, a topic Kafka would refuse. A record read back from a row is built
        # by stored_record(), which skips the topic's name: the harvester publishes what a row
        # holds, and a topic Kafka refuses is its delivery error, under the poison policy.
        if not isinstance(self.key, str):
            raise _wrong_key_type(self.key)
        _check_topic(self.topic)

    def value_bytes(self) -> bytes | None:
        v = self.value
        return v.encode() if isinstance(v, str) else v

    def __repr__(self) -> str:
        # Values may be large or sensitive; show their size, not their content.
        size = None if self.value is None else len(self.value)
        return (
            f"OutboxRecord(id={self.id!r}, topic={self.topic!r}, key={self.key!r}, "
            f"value_len={size!r}, headers={len(self.headers)}, leader_id={self.leader_id!r})"
        )


def stored_record(
    topic: str,
    key: str,
    value: bytes | str | None,
    headers: Sequence[Header],
    id: int | None,  # noqa: A002 - the field's name
    create_time: datetime | None,
    leader_id: str | None,
) -> OutboxRecord:
    """The record a row of the outbox holds, as a binding's mark reads it back: key and topic
    must be text, but the topic's name is not checked. A row written by hand, or by goharvest,
    may name a topic Kafka refuses (``nc bad!``); the harvester reports that as the delivery
    error it is (``poisonPolicy`` decides what follows), where a refusal here would fail every
    mark that reads the row."""
    if not isinstance(key, str):
        raise _wrong_key_type(key)
    if not isinstance(topic, str):
        raise _wrong_topic_type(topic)
    record = object.__new__(OutboxRecord)
    record.topic, record.key, record.value, record.headers = topic, key, value, headers
    record.id, record.create_time, record.leader_id = id, create_time, leader_id
    return record


def _check_topic(topic: object) -> None:
    """Refuse a topic that is not a name Kafka takes: 1-249 characters of [a-zA-Z0-9._-], not
    ``.`` or ``..`` (Kafka's own rule), with the same message when the record is built and when
    it is stashed."""
    if topic.__class__ is str and topic in _VALID_TOPICS:
        return
    if not isinstance(topic, str):
        raise _wrong_topic_type(topic)
    if not topic:
        raise InvalidRecordError(f"record topic must be a non-empty string, got {topic!r}")
    if len(topic) > MAX_TOPIC_LENGTH or topic in (".", "..") or not _TOPIC_CHARS.issuperset(topic):
        raise InvalidRecordError(
            f"record topic {topic[:MAX_TOPIC_LENGTH + 1]!r} is not a valid Kafka topic name "
            f"(1-{MAX_TOPIC_LENGTH} characters from [a-zA-Z0-9._-], not '.' or '..')"
        )
    if topic.__class__ is str and len(_VALID_TOPICS) < _MAX_VALID_TOPICS:
        _VALID_TOPICS.add(topic)


def _wrong_topic_type(topic: object) -> InvalidRecordError:
    return InvalidRecordError(f"record topic must be a str, got {type(topic).__name__} ({topic!r})")


def _wrong_key_type(key: object) -> InvalidRecordError:
    if key is None:
        # str(None) would put every keyless record on the key "None": one partition, one queue.
        advice = (
            "a record needs a key: use the id of the entity it is about (e.g. str(order.id)), so that "
            "its records keep their order; where order does not matter, a key of its own (str(uuid.uuid4())) "
            "spreads the records over the partitions"
        )
    elif isinstance(key, bytes | bytearray):
        advice = (
            "decode it (key.decode('utf-8'), or key.hex() for binary keys); str(key) would give the text of its repr"
        )
    else:
        advice = f"pass its text form (e.g. str(key) gives {str(key)!r})"
    return InvalidRecordError(
        f"record key must be a str, got {type(key).__name__} ({key!r}); Kafka orders records per key, "
        f"compared as text: {advice}"
    )


def validate_record(record: object) -> OutboxRecord:
    """Check a record a caller wants to stash; raise :class:`InvalidRecordError` naming the bad field."""
    check_record(record)
    return record  # type: ignore[return-value]  # check_record refuses anything but an OutboxRecord


def check_record(record: object) -> tuple[int, HeaderValue | None]:
    """:func:`validate_record`, returning what the check learnt on the way, so that a stash
    checks, sizes and encodes a record once: its size as Kafka counts it against
    ``max.message.bytes`` (key, value and headers, names and values, in bytes), and its value
    as it is stored in binary: a str that is not ASCII comes back as its UTF-8 (the check had
    to encode it), anything else unchanged (an ASCII str's bytes are its characters)."""
    if not isinstance(record, OutboxRecord):
        raise InvalidRecordError(f"expected an OutboxRecord, got {type(record).__name__}")
    _check_topic(record.topic)  # checked when built; again here in case it was reassigned since
    key = record.key
    if not isinstance(key, str):  # __post_init__ refused it, but a record's fields can be reassigned
        raise _wrong_key_type(key)
    if not key:
        raise InvalidRecordError("record key must be a non-empty string: the harvester orders records per key")
    size = _text_bytes("record key", key)
    value = record.value
    if isinstance(value, str):
        if not value.isascii():
            value = _encoded("record value", value)
        size += len(value)
    elif isinstance(value, bytes):
        size += len(value)
    elif value is not None:
        raise InvalidRecordError(f"record value must be bytes, str or None, got {type(value).__name__}")
    headers = record.headers
    if isinstance(headers, str | bytes) or not isinstance(headers, Sequence):
        raise InvalidRecordError(f"record headers must be a sequence of (str, str|bytes) pairs, got {headers!r}")
    for i, h in enumerate(headers):
        if not isinstance(h, tuple | list) or len(h) != 2:
            raise InvalidRecordError(f"record header #{i} must be a (key, value) pair, got {h!r}")
        hk, hv = h
        if not isinstance(hk, str) or not hk:
            raise InvalidRecordError(f"record header #{i} key must be a non-empty str, got {hk!r}")
        if not isinstance(hv, str | bytes):
            raise InvalidRecordError(f"record header {hk!r} value must be str or bytes, got {type(hv).__name__}")
        size += len(hk) if hk.isascii() else len(_encoded(f"record header #{i} key", hk))
        if isinstance(hv, bytes) or hv.isascii():
            size += len(hv)
        else:
            size += len(_encoded(f"record header {hk!r} value", hv))
    return size, value


def _text_bytes(what: str, text: str) -> int:
    """The length in UTF-8 of text a database stores in a text column (a key), refusing what
    some database would refuse or mangle, on every database alike: NUL (PostgreSQL refuses it
    in text, others truncate at it or keep it) and text that is not valid Unicode."""
    if "\x00" in text:
        raise InvalidRecordError(
            f"{what} {text[:40]!r} contains a NUL character (\\x00), which databases refuse or truncate in text: "
            "remove it, or encode binary keys (key.hex())"
        )
    return len(text) if text.isascii() else len(_encoded(what, text))


def _encoded(what: str, text: str) -> bytes:
    """``text`` in UTF-8, or :class:`InvalidRecordError` where it is not valid Unicode."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRecordError(
            f"{what} {text[:40]!r} is not valid Unicode ({e.reason} at position {e.start}: a lone surrogate, "
            "often from bytes decoded with errors='surrogateescape'): it cannot be stored as UTF-8; "
            "decode the source bytes properly, or encode binary data (bytes.hex())"
        ) from None
