"""Per-job staging tables: where Spark tasks put rows until the job commits.

Each write job gets its own staging table per destination, named
``<table>_spark_<created, hex seconds>_<job id>``. Tasks write into it; the job commit moves
the rows of the winning task attempts into the real table in one transaction and drops it;
an abort just drops it. A table per job (rather than one shared table keyed by job id) makes
clean-up a cheap DROP instead of a large DELETE, and a zombie task attempt still writing
when the job ends fails on the missing table instead of leaving rows behind.

A driver that dies between planning and commit/abort leaves its staging tables behind;
:func:`drop_stale_staging` removes those older than a given age.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from pyharvest.bindings.spark.database import Database
from pyharvest.bindings.spark.outbox_layout import HEADERS, KEY, KEY_LENGTH, TOPIC, TOPIC_LENGTH, VALUE
from pyharvest.plugins.api import MAX_PART_LENGTH, TableName

__all__ = [
    "ATTEMPT",
    "PARTITION",
    "SEQ",
    "create_outbox_staging",
    "create_target_staging",
    "drop_stale_staging",
    "drop_table",
    "staging_name",
]

log = logging.getLogger("pyharvest.spark")

PARTITION = "spark_partition"
ATTEMPT = "spark_attempt"
SEQ = "spark_seq"
_MARKER = "_spark_"
_SUFFIX_LENGTH = len(_MARKER) + 8 + 1 + 8


def staging_name(table: TableName, job_id: str, created: float | None = None) -> TableName:
    stamp = int(created if created is not None else time.time())
    base = table.name[: MAX_PART_LENGTH - _SUFFIX_LENGTH]
    return TableName(f"{base}{_MARKER}{stamp:08x}_{job_id[:8]}", table.schema)


def _bookkeeping_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column(PARTITION, sa.Integer, nullable=False),
        sa.Column(ATTEMPT, sa.BigInteger, nullable=False),
        sa.Column(SEQ, sa.BigInteger, nullable=False),
    ]


def _table(db: Database, name: TableName, columns: list[sa.Column[Any]]) -> sa.Table:
    kwargs: dict[str, Any] = {}
    if db.is_postgresql:
        # Unlogged: no WAL for rows that live seconds. A server crash empties the table, which
        # the commit notices (row counts differ from the tasks' reports) and fails the job.
        kwargs["prefixes"] = ["UNLOGGED"]
    t = sa.Table(name.name, sa.MetaData(), *columns, schema=name.schema, **kwargs)
    if not db.is_postgresql:
        # The move reads in this order. PostgreSQL sorts in memory faster than it would
        # maintain the index while the tasks copy rows in.
        sa.Index(f"ix_{name.name}"[:MAX_PART_LENGTH], t.c[PARTITION], t.c[ATTEMPT], t.c[SEQ])
    return t


def create_outbox_staging(db: Database, name: TableName) -> None:
    """Create the outbox staging table (outbox ids are assigned by the commit's ordered INSERT … SELECT)."""
    columns = [
        *_bookkeeping_columns(),
        sa.Column(TOPIC, sa.Text if db.is_postgresql else sa.String(TOPIC_LENGTH), nullable=False),
        sa.Column(KEY, sa.Text if db.is_postgresql else sa.Unicode(KEY_LENGTH), nullable=False),
        sa.Column(VALUE, sa.LargeBinary, nullable=True),
        sa.Column(HEADERS, sa.Text, nullable=False),
    ]
    with db.engine.begin() as conn:
        _table(db, name, columns).create(conn)


def create_target_staging(db: Database, target: TableName, name: TableName, columns: list[str]) -> None:
    """Create a staging table for the target table holding ``columns`` with the target's types."""
    with db.engine.begin() as conn:
        reflected = sa.Table(target.name, sa.MetaData(), schema=target.schema, autoload_with=conn)
        cols = _bookkeeping_columns() + [sa.Column(c, reflected.c[c].type, nullable=True) for c in columns]
        _table(db, name, cols).create(conn)


def drop_table(conn: sa.Connection, db: Database, name: TableName) -> None:
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {db.table(name)}")


def drop_stale_staging(
    url: str, table: str, older_than: timedelta = timedelta(days=1), binding: str | None = None
) -> list[str]:
    """Drop staging tables of ``table`` created more than ``older_than`` ago (left by drivers
    that died mid-job); return their names. Do not pass an age shorter than your longest write job."""
    from pyharvest.plugins.api import parse_table_name

    name = parse_table_name(table)
    db = Database(url, binding)
    prefix = re.escape(name.name[: MAX_PART_LENGTH - _SUFFIX_LENGTH])
    pattern = re.compile(prefix + r"_spark_([0-9a-f]{8})_[0-9a-f]{8}$", re.I)
    cutoff = time.time() - older_than.total_seconds()
    dropped: list[str] = []
    try:
        for t in sa.inspect(db.engine).get_table_names(schema=name.schema):
            m = pattern.match(t)
            if m and int(m.group(1), 16) < cutoff:
                with db.engine.begin() as conn:
                    drop_table(conn, db, TableName(t, name.schema))
                dropped.append(t)
                log.warning("dropped stale Spark staging table %s", t)
    finally:
        db.engine.dispose()
    return dropped

