"""The outbox record: what a service stashes and what the harvester publishes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

__all__ = ["Header", "HeaderValue", "InvalidRecordError", "OutboxRecord", "validate_record"]

HeaderValue = str | bytes
Header = tuple[str, HeaderValue]

# Kafka's own limit on a topic name.
MAX_TOPIC_LENGTH = 249
_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


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
        # Refused where the mistake is made, not later by the stasher or the database. Only the
        # cheap type checks: the harvester builds a record for every row it marks.
        if not isinstance(self.key, str):
            raise InvalidRecordError(
                f"record key must be a str, got {type(self.key).__name__} ({self.key!r}); "
                "Kafka orders records per key, compared as text: "
                + (
                    "decode it (key.decode('utf-8'), or key.hex() for binary keys); str(key) would give "
                    "the text of its repr"
                    if isinstance(self.key, bytes | bytearray)
                    else "pass its text form, e.g. str(key)"
                )
            )
        if not isinstance(self.topic, str):
            raise InvalidRecordError(f"record topic must be a str, got {type(self.topic).__name__} ({self.topic!r})")

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


def validate_record(record: object) -> OutboxRecord:
    """Check a record a caller wants to stash; raise :class:`InvalidRecordError` naming the bad field."""
    if not isinstance(record, OutboxRecord):
        raise InvalidRecordError(f"expected an OutboxRecord, got {type(record).__name__}")
    topic = record.topic
    if not isinstance(topic, str) or not topic:
        raise InvalidRecordError(f"record topic must be a non-empty string, got {topic!r}")
    if len(topic) > MAX_TOPIC_LENGTH or topic in (".", "..") or not _TOPIC_CHARS.issuperset(topic):
        raise InvalidRecordError(
            f"record topic {topic!r} is not a valid Kafka topic name "
            f"(1-{MAX_TOPIC_LENGTH} characters from [a-zA-Z0-9._-])"
        )
    key = record.key
    if not isinstance(key, str):
        raise InvalidRecordError(f"record key must be a str, got {type(key).__name__}")
    if not key:
        raise InvalidRecordError("record key must be a non-empty string: the harvester orders records per key")
    _check_text("record key", key)
    value = record.value
    if value is not None and not isinstance(value, bytes | str):
        raise InvalidRecordError(f"record value must be bytes, str or None, got {type(value).__name__}")
    if isinstance(value, str) and not value.isascii():
        _check_encodable("record value", value)
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
        if not hk.isascii():
            _check_encodable(f"record header #{i} key", hk)
        if isinstance(hv, str) and not hv.isascii():
            _check_encodable(f"record header {hk!r} value", hv)
    return record


def _check_text(what: str, text: str) -> None:
    """Refuse what some database would refuse or mangle, on every database alike: NUL
    (PostgreSQL refuses it in text, others truncate at it or keep it) and text that is not
    valid Unicode."""
    if "\x00" in text:
        raise InvalidRecordError(
            f"{what} {text[:40]!r} contains a NUL character (\\x00), which databases refuse or truncate in text: "
            "remove it, or encode binary keys (key.hex())"
        )
    if not text.isascii():
        _check_encodable(what, text)


def _check_encodable(what: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRecordError(
            f"{what} {text[:40]!r} is not valid Unicode ({e.reason} at position {e.start}: a lone surrogate, "
            "often from bytes decoded with errors='surrogateescape'): it cannot be stored as UTF-8; "
            "decode the source bytes properly, or encode binary data (bytes.hex())"
        ) from None
