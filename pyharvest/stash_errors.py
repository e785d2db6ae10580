"""What the stasher refuses before it writes anything, beyond an ill-formed record.

Kept apart from :mod:`pyharvest.stasher` so that ``import pyharvest`` can export them without
importing SQLAlchemy.
"""

from __future__ import annotations

from pyharvest.core.records import InvalidRecordError

__all__ = ["KAFKA_MESSAGE_MAX_BYTES", "KeyTooLongError", "OutboxTableMissingError", "RecordTooLargeError"]

#: Kafka's default ``message.max.bytes`` (broker) and ``max.message.bytes`` (topic).
KAFKA_MESSAGE_MAX_BYTES = 1_048_588


class KeyTooLongError(InvalidRecordError):
    """The record's key is longer than the outbox table's key column; the database would
    refuse the row (or, on SQLite, keep what others would refuse)."""


class RecordTooLargeError(InvalidRecordError):
    """The record (key, value and headers) is over the stasher's ``max_record_bytes``: Kafka
    would refuse it at publish, after it had been committed."""


class OutboxTableMissingError(LookupError):
    """The outbox table does not exist; the message says how to create it."""
