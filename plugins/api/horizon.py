"""The database's cleanup horizon, as the outbox sees it: the oldest snapshot for which it
keeps dead rows, and who holds it.

An outbox is a queue in a table: each row is inserted, marked and deleted within moments, so
the table is mostly dead rows waiting for clean-up (PostgreSQL's vacuum, InnoDB's purge). A
snapshot that stays open anywhere it counts (a long report, a ``BEGIN`` left open in a
console, a ``pg_dump``, a replication slot, a replica's ``hot_standby_feedback``) holds the
clean-up back for every row deleted since it began: the table grows, and each mark reads
further through dead rows. Nothing the relay does can release it; what it can do is say who
holds it and for how long, before the operator finds out from the latency
(``pyharvest_cleanup_horizon_age_seconds``, read on the operations server's timer).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CleanupHorizon"]


@dataclass(frozen=True, slots=True)
class CleanupHorizon:
    """The oldest snapshot the database keeps dead rows for, or none (``holder`` empty)."""

    #: Who holds it, as the database names it: ``pid 4242 (idle in transaction: SELECT ...)``,
    #: ``replication slot 'standby1'``, ``thread 17 (...)``; empty when nothing old is held.
    holder: str = ""
    #: Seconds it has been held, where the database says (a replication slot does not).
    age_seconds: float | None = None
    #: How far behind the clean-up is held, in the database's own unit: PostgreSQL, the
    #: transactions since the horizon (``age(xmin)``); InnoDB, its history list length (undo
    #: logs of committed transactions not purged yet, server-wide).
    behind: int | None = None
    #: What ``behind`` counts, for people: ``transactions since``, ``history list length``.
    behind_unit: str = ""
