"""PostgreSQL's view of the other sessions on a shared database: how long the harvester's own
statements wait for their locks (``lock_timeout``), who holds locks on the outbox
(``pg_locks``, ``pg_stat_activity``) and who holds the clean-up horizon back (the oldest
``xmin``). The hooks of :mod:`pyharvest.plugins.postgresql`, which registers them."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from pyharvest.plugins.api import CleanupHorizon, LockHolder, TableName, hookimpl

_preparer = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]  # SQLAlchemy's dialect __init__ is unannotated


# The oldest xmin that keeps this database's dead rows: a session's snapshot here (another
# database's sessions do not hold this one's tables back), a replication slot's, a prepared
# transaction's. Each running statement holds one for a moment; the oldest is what matters.
_HORIZON = sa.text("""
SELECT holder, seconds, behind, state, query FROM (
  SELECT 'pid ' || pid AS holder, EXTRACT(EPOCH FROM now() - COALESCE(xact_start, query_start)) AS seconds,
         age(backend_xmin) AS behind, state, query
  FROM pg_stat_activity
  WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() AND datname = current_database()
  UNION ALL
  SELECT 'replication slot ' || quote_literal(slot_name), NULL, age(xmin), NULL, NULL
  FROM pg_replication_slots WHERE xmin IS NOT NULL
  UNION ALL
  SELECT 'prepared transaction ' || quote_literal(gid), EXTRACT(EPOCH FROM now() - prepared), age(transaction),
         NULL, NULL
  FROM pg_prepared_xacts WHERE database = current_database()
) held
ORDER BY behind DESC NULLS LAST
LIMIT 1
""")


@hookimpl
def pyharvest_cleanup_horizon(connection: sa.Connection) -> CleanupHorizon:
    row = connection.execute(_HORIZON).first()
    if row is None:
        return CleanupHorizon(age_seconds=0.0, behind=0, behind_unit=_BEHIND)
    holder, seconds, behind, state, query = row
    said = LockHolder(holder, "", None, state or "", query or "").describe()
    return CleanupHorizon(said, None if seconds is None else max(0.0, float(seconds)), int(behind), _BEHIND)


_BEHIND = "transactions since"


@hookimpl
def pyharvest_lock_timeout_statements(seconds: float) -> Sequence[str]:
    return [f"SET lock_timeout = '{max(1, round(seconds * 1000))}ms'"]


# The sessions holding a lock on the table that the harvester's statements could wait for:
# every mode but ACCESS SHARE (a plain SELECT, which conflicts only with ACCESS EXCLUSIVE, never
# taken by the harvester). A writer's short transactions hold ROW EXCLUSIVE too, so the row
# modes count only in a transaction open longer than the wait that ran out: a console's
# forgotten SELECT ... FOR UPDATE, say. The strongest lock first, then the oldest transaction.
_LOCK_HOLDERS = sa.text("""
SELECT l.pid, l.mode, a.state, EXTRACT(EPOCH FROM now() - a.xact_start) AS open_for, a.query
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.relation = to_regclass(:table) AND l.granted
  AND l.pid <> pg_backend_pid() AND l.mode <> 'AccessShareLock'
  AND (l.mode NOT IN ('RowShareLock', 'RowExclusiveLock') OR a.xact_start <= now() - make_interval(secs => :older))
ORDER BY l.mode IN ('RowShareLock', 'RowExclusiveLock'), a.xact_start
LIMIT 10
""")


@hookimpl
def pyharvest_lock_holders(connection: sa.Connection, table: TableName, older_than: float) -> Sequence[LockHolder]:
    rows = connection.execute(_LOCK_HOLDERS, {"table": table.quoted(_preparer), "older": older_than}).all()
    holders: dict[int, LockHolder] = {}
    for pid, mode, state, open_for, query in rows:
        holders.setdefault(pid, LockHolder(
            f"pid {pid}", mode, None if open_for is None else float(open_for), state or "", query or ""
        ))
    return list(holders.values())
