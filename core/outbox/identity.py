"""The identity every published message carries: which outbox it came from and which row.

The harvester stamps these headers on every copy of a record it publishes, identically, so
that a consumer (:mod:`pyharvest.inbox`, :class:`pyharvest.bindings.spark.ExactlyOnceSink`)
can drop the copies an at-least-once relay produces. Renaming one breaks deduplication
against messages already in Kafka, so both names are fixed here, once.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyharvest.core.outbox.records import OutboxRecord

__all__ = ["OUTBOX_HEADER", "RECORD_ID_HEADER", "IdentityStamp", "outbox_identity"]

#: ``<leaderGroupID>/<outboxTable>``: two harvesters of one table share it, two tables do not.
OUTBOX_HEADER = "pyharvest-outbox"
#: The row's id in that outbox, in decimal.
RECORD_ID_HEADER = "pyharvest-record-id"


def outbox_identity(leader_group_id: str, outbox_table: str) -> str:
    """The value of :data:`OUTBOX_HEADER` for one outbox."""
    return f"{leader_group_id}/{outbox_table}"


class IdentityStamp:
    """The headers each published copy of a record goes out with: its own, then (unless
    identity headers are turned off) :data:`OUTBOX_HEADER` and :data:`RECORD_ID_HEADER`. Both
    delivery modes publish through one, so every copy of a record is stamped alike."""

    __slots__ = ("_outbox",)

    def __init__(self, leader_group_id: str, outbox_table: str, enabled: bool = True) -> None:
        self._outbox = (OUTBOX_HEADER, outbox_identity(leader_group_id, outbox_table)) if enabled else None

    def headers(self, record: OutboxRecord) -> Sequence[tuple[str, str | bytes]]:
        outbox = self._outbox
        if outbox is None:
            return record.headers
        # A list: the Kafka client takes it as it is, where a tuple would be copied.
        return [*record.headers, outbox, (RECORD_ID_HEADER, str(record.id))]
