"""The identity every published message carries: which outbox it came from and which row.

The harvester stamps these headers on every copy of a record it publishes, identically, so
that a consumer (:mod:`pyharvest.inbox`, :class:`pyharvest.bindings.spark.ExactlyOnceSink`)
can drop the copies an at-least-once relay produces. Renaming one breaks deduplication
against messages already in Kafka, so both names are fixed here, once.
"""

from __future__ import annotations

__all__ = ["OUTBOX_HEADER", "RECORD_ID_HEADER", "identity_stamp", "outbox_identity"]

#: ``<leaderGroupID>/<outboxTable>``: two harvesters of one table share it, two tables do not.
OUTBOX_HEADER = "pyharvest-outbox"
#: The row's id in that outbox, in decimal.
RECORD_ID_HEADER = "pyharvest-record-id"


def outbox_identity(leader_group_id: str, outbox_table: str) -> str:
    """The value of :data:`OUTBOX_HEADER` for one outbox."""
    return f"{leader_group_id}/{outbox_table}"


def identity_stamp(leader_group_id: str, outbox_table: str, enabled: bool = True) -> tuple[str, str] | None:
    """The :data:`OUTBOX_HEADER` header a publisher adds to every message (beside its
    :data:`RECORD_ID_HEADER`), or None when identity headers are turned off."""
    return (OUTBOX_HEADER, outbox_identity(leader_group_id, outbox_table)) if enabled else None
