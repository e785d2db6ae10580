"""What the stasher refuses before it writes anything, beyond an ill-formed record.

Nothing here imports SQLAlchemy, so that ``import pyharvest`` can export them without it
(:mod:`pyharvest.stasher` loads the stashers themselves on first use).
"""

from __future__ import annotations

from pyharvest.core.outbox.records import InvalidRecordError

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "KAFKA_MESSAGE_MAX_BYTES",
    "PRODUCER_MESSAGE_MAX_BYTES",
    "KeyTooLongError",
    "OutboxTableChangedError",
    "OutboxTableMissingError",
    "RecordTooLargeError",
]

#: Kafka's default ``message.max.bytes`` (broker) and ``max.message.bytes`` (topic).
KAFKA_MESSAGE_MAX_BYTES = 1_048_588
#: librdkafka's default ``message.max.bytes``: the harvester's producer refuses a larger record
#: itself, before any broker sees it. It is the lowest of the three limits a record meets.
PRODUCER_MESSAGE_MAX_BYTES = 1_000_000
#: What the harvester adds to a stashed record on the wire: its identity headers (the outbox's
#: identity, the record id) and the record's framing, with room to spare.
HARVEST_OVERHEAD_BYTES = 1_000
#: The stasher's default ``max_record_bytes``: what the harvester's producer, at its default
#: ``message.max.bytes``, still publishes once it has added its headers. A record the stasher
#: accepts by default is one the harvester can publish by default.
DEFAULT_MAX_RECORD_BYTES = PRODUCER_MESSAGE_MAX_BYTES - HARVEST_OVERHEAD_BYTES


class KeyTooLongError(InvalidRecordError):
    """The record's key is longer than the outbox table's key column; the database would
    refuse the row (or, on SQLite, keep what others would refuse)."""


class RecordTooLargeError(InvalidRecordError):
    """The record (key, value and headers) is over the stasher's ``max_record_bytes``: Kafka
    would refuse it at publish, after it had been committed."""


class OutboxTableMissingError(LookupError):
    """The outbox table does not exist; the message says how to create it."""


class OutboxTableChangedError(RuntimeError):
    """The outbox table now refuses rows without a key hash (``reaper init-db --shards`` made it
    ready for shards after this process had read it). The database refused the row, so the
    transaction must be rolled back; the stasher has forgotten the table's old shape, and the
    transaction run again stores the hash. The message says so."""
