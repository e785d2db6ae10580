"""What an outbox table costs its database over time, as the soak samples it each minute.

PostgreSQL (per table, from ``pg_stat_user_tables`` and the size functions): the table's and
its indexes' size on disk, live and dead tuples, how many times autovacuum (and a manual
``VACUUM``) has run on it. Dead tuples are what a mark has to step over: every purged row
leaves one until vacuum reclaims it, and the mark's walk of the primary key reads their index
entries' pages. ``mark_probe_buffers`` counts the pages a mark's row choice reads now from the
lowest id (an ``EXPLAIN (ANALYZE, BUFFERS)`` of it, without the row locks): what every mark
read before the key-set cursor, and what a new leader id's first mark and the late-row scan
read; ``cursor_probe_buffers`` the same from where the cursor about stands (``cursor_rows``
below the highest id: the rate times ``markLookback``).

:class:`HorizonHold` is the colleague who holds the clean-up horizon back: another session's
snapshot (PostgreSQL: ``REPEATABLE READ`` and a read; MariaDB: ``START TRANSACTION WITH
CONSISTENT SNAPSHOT``) open from one moment of the run to another.

MariaDB / MySQL: the table's data and index length and its free space
(``information_schema.TABLES``, InnoDB's estimates), the size of its file on disk, and
InnoDB's history list length: undo records the purge thread has not yet cleaned, server-wide
(other databases' transactions count too), which is what deleted rows wait on before their
space is reused.

The benchmark may ask a database's name (it is not the library, whose code keeps database
differences in the dialect plugins).
"""

from __future__ import annotations

import re
import threading
import time

import sqlalchemy as sa

__all__ = ["HorizonHold", "TableStats"]


class TableStats:
    def __init__(self, url: str, table: str, cursor_rows: int = 0) -> None:
        self.engine = sa.create_engine(url, pool_size=1)
        self.table = table
        self.kind = self.engine.dialect.name
        self.cursor_rows = cursor_rows

    def sample(self) -> dict[str, float]:
        with self.engine.connect() as c:
            if self.kind == "postgresql":
                return self._postgresql(c)
            if self.kind in ("mysql", "mariadb"):
                return self._mysql(c)
        return {}

    def _postgresql(self, c: sa.Connection) -> dict[str, float]:
        row = c.execute(sa.text(
            "SELECT pg_table_size(relid), pg_indexes_size(relid), n_live_tup, n_dead_tup, autovacuum_count,"
            " vacuum_count, autoanalyze_count FROM pg_stat_user_tables WHERE relid = CAST(:t AS regclass)"),
            {"t": self.table}).one()
        out = {"table_bytes": row[0], "index_bytes": row[1], "live_tuples": row[2], "dead_tuples": row[3],
               "autovacuum_runs": row[4], "vacuum_runs": row[5], "autoanalyze_runs": row[6]}
        # The pages a mark's row choice reads: a measure of what dead tuples cost each mark that
        # the machine's load does not blur (its time is printed beside it).
        plan = c.execute(sa.text(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM {self.table}"
            " WHERE leader_id IS NULL OR leader_id <> 'soak-probe' ORDER BY id LIMIT 1000")).scalar()
        top = plan[0]["Plan"]
        out["mark_probe_buffers"] = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
        out["mark_probe_ms"] = round(plan[0]["Execution Time"], 2)
        if self.cursor_rows:
            plan = c.execute(sa.text(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM {self.table}"
                # From the id sequence, not max(id): on an emptied table max(id) walks back
                # through every row purged during a hold, which is what the probe measures.
                f" WHERE id > (SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence(:t, 'id')), 0)"
                f" - {int(self.cursor_rows)})"
                " AND (leader_id IS NULL OR leader_id <> 'soak-probe') ORDER BY id LIMIT 1000"), {"t": self.table}).scalar()
            top = plan[0]["Plan"]
            out["cursor_probe_buffers"] = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
            out["cursor_probe_ms"] = round(plan[0]["Execution Time"], 2)
        c.rollback()
        return out

    def _mysql(self, c: sa.Connection) -> dict[str, float]:
        row = c.execute(sa.text(
            "SELECT data_length, index_length, data_free, table_rows FROM information_schema.TABLES"
            " WHERE table_schema = DATABASE() AND table_name = :t"), {"t": self.table}).one()
        out: dict[str, float] = {"table_bytes": row[0], "index_bytes": row[1], "data_free_bytes": row[2],
                                 "live_tuples": row[3]}
        file_size = c.execute(sa.text(
            "SELECT allocated_size FROM information_schema.INNODB_SYS_TABLESPACES WHERE name = CONCAT(DATABASE(), '/', :t)"),
            {"t": self.table}).scalar()
        if file_size is not None:
            out["file_bytes"] = file_size
        status = c.execute(sa.text("SHOW ENGINE INNODB STATUS")).one()[2]
        found = re.search(r"History list length (\d+)", status)
        if found:
            out["history_list_length"] = int(found.group(1))
        return out

    def dispose(self) -> None:
        self.engine.dispose()


class HorizonHold:
    """Another session's snapshot, held from ``at`` (a ``time.time()``) for ``seconds``, on a
    thread of its own: what a long analytics query or a ``BEGIN`` left open in a console does
    to the database's clean-up. :attr:`held` says whether it is held now."""

    def __init__(self, url: str, at: float, seconds: float) -> None:
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.kind = self.engine.dialect.name
        self.at, self.seconds = at, seconds
        self.held = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(max(0.0, self.at - time.time())):
            return
        with self.engine.connect() as c:
            if self.kind == "postgresql":
                c.exec_driver_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
                c.exec_driver_sql("SELECT count(*) FROM pg_class").scalar()
            else:
                c.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                c.exec_driver_sql("SELECT count(*) FROM mysql.innodb_table_stats").scalar()
            self.held = True
            self._stop.wait(self.seconds)
            c.rollback()
            self.held = False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.engine.dispose()
