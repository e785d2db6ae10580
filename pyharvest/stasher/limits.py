"""What a record must fit before the stasher writes it: the table's key column and the
stasher's ``max_record_bytes``.

Kept apart from :mod:`pyharvest.stasher`, with :mod:`pyharvest.stasher.errors`, so that the size
Kafka counts can be computed without SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from pyharvest.core.outbox.records import check_record
from pyharvest.stasher.errors import (
    HARVEST_OVERHEAD_BYTES,
    PRODUCER_MESSAGE_MAX_BYTES,
    KeyTooLongError,
    RecordTooLargeError,
)

if TYPE_CHECKING:
    from pyharvest.core.outbox.records import OutboxRecord
    from pyharvest.plugins.api import TableName

__all__ = ["KEY_COLUMN", "StashLimits", "headers_bytes", "record_bytes"]

#: The outbox's key column, in both layouts.
KEY_COLUMN = "kafka_key"


def record_bytes(record: OutboxRecord) -> int:
    """The size Kafka counts against ``max.message.bytes`` for ``record``'s payload: its key,
    value and headers (names and values), in bytes. ``record`` is checked on the way
    (:func:`~pyharvest.core.outbox.records.check_record`, which the stasher calls once per
    record and takes the size from)."""
    return check_record(record)[0]


def headers_bytes(headers: Iterable[tuple[str, str]]) -> int:
    """The size Kafka counts of headers added to a checked record: the trace's."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in headers)


class StashLimits(NamedTuple):
    """What a record must fit: the table's key column and the stasher's size limit."""

    table: TableName | str
    key_length: int | None
    max_record_bytes: int | None

    def check(self, record: OutboxRecord, size: int) -> None:
        """Refuse ``record``, of ``size`` bytes (:func:`record_bytes`), if it does not fit."""
        if self.key_length is not None and len(record.key) > self.key_length:
            raise KeyTooLongError(
                f"record key is {len(record.key)} characters long, but the key column ({KEY_COLUMN}) of "
                f"the outbox table {self.table} holds at most {self.key_length}: shorten the key "
                f"(a hash or an id of the entity), or widen the column (key {record.key[:40]!r}...)"
            )
        if self.max_record_bytes is not None and size > self.max_record_bytes:
            raise RecordTooLargeError(
                f"record for topic {record.topic!r} with key {record.key[:40]!r} is {size} bytes "
                f"(key, value and headers), over the Stasher's max_record_bytes={self.max_record_bytes}: the "
                f"harvester's producer would refuse it at publish (librdkafka's message.max.bytes, "
                f"{PRODUCER_MESSAGE_MAX_BYTES} by default, counts the harvester's headers too). Store the "
                f"payload elsewhere and stash a reference, or raise together the Stasher's max_record_bytes, "
                f"message.max.bytes in the reaper's producerKafkaConfig (at least max_record_bytes + "
                f"{HARVEST_OVERHEAD_BYTES}) and the topic's max.message.bytes"
            )
