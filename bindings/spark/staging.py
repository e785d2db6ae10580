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
from pyharvest.bindings.spark.outbox_layout import HEADERS, KEY, KEY_HASH, KEY_LENGTH, TOPIC, TOPIC_LENGTH, VALUE
from pyharvest.core.errors import BindingError
from pyharvest.plugins.api import MAX_PART_LENGTH, TableName

__all__ = [
    "ATTEMPT",
    "PARTITION",
    "SEQ",
    "SEQ_SHIFT",
    "create_outbox_staging",
    "create_target_staging",
    "drop_stale_staging",
    "drop_table",
    "first_seq",
    "outbox_staging_table",
    "staging_name",
    "target_staging_table",
]

log = logging.getLogger("pyharvest.spark")

PARTITION = "spark_partition"
ATTEMPT = "spark_attempt"
# The row's place in the job: (Spark partition << SEQ_SHIFT) + its place in the partition, so
# that one int8 orders a job's rows by partition, then DataFrame order (one key sorts ~1.5x
# faster than two). Room for 2**23 partitions of 2**40 rows.
SEQ = "spark_seq"
SEQ_SHIFT = 40
_MARKER = "_spark_"
_SUFFIX_LENGTH = len(_MARKER) + 8 + 1 + 8


def staging_name(table: TableName, job_id: str, created: float | None = None) -> TableName:
    stamp = int(created if created is not None else time.time())
    base = table.name[: MAX_PART_LENGTH - _SUFFIX_LENGTH]
    return TableName(f"{base}{_MARKER}{stamp:08x}_{job_id[:8]}", table.schema)


def first_seq(partition: int) -> int:
    """The :data:`SEQ` of a Spark partition's first row."""
    if not 0 <= partition < 1 << (63 - SEQ_SHIFT):
        raise BindingError(f"Spark partition {partition}: the outbox writer orders at most {1 << (63 - SEQ_SHIFT)} "
                           "partitions a job; repartition to fewer")
    return partition << SEQ_SHIFT


def _bookkeeping_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column(PARTITION, sa.Integer, nullable=False),
        sa.Column(ATTEMPT, sa.BigInteger, nullable=False),
        sa.Column(SEQ, sa.BigInteger, nullable=False),
    ]


def _table(name: TableName, columns: list[sa.Column[Any]]) -> sa.Table:
    t = sa.Table(name.name, sa.MetaData(), *columns, schema=name.schema)
    # The commits read in this order; a dialect that sorts faster leaves the index out
    # (Dialect.staging_table).
    sa.Index(f"ix_{name.name}"[:MAX_PART_LENGTH], t.c[SEQ], t.c[PARTITION], t.c[ATTEMPT])
    return t


def outbox_staging_table(name: TableName, key_hash: bool = False) -> sa.Table:
    """The outbox staging table's definition: the tasks copy rows in with these exact types.
    ``key_hash``: the outbox has the key hash column, which the tasks fill too."""
    return _table(
        name,
        [
            *_bookkeeping_columns(),
            sa.Column(TOPIC, sa.String(TOPIC_LENGTH), nullable=False),
            sa.Column(KEY, sa.Unicode(KEY_LENGTH), nullable=False),
            sa.Column(VALUE, sa.LargeBinary, nullable=True),
            sa.Column(HEADERS, sa.Text, nullable=False),
            *([sa.Column(KEY_HASH, sa.Integer, nullable=False)] if key_hash else []),
        ],
    )


def target_staging_table(name: TableName, columns: list[str]) -> sa.Table:
    """A target staging table known by its column names only (types as created: not exact)."""
    return sa.Table(name.name, sa.MetaData(), *_bookkeeping_columns(), *(sa.Column(c) for c in columns),
                    schema=name.schema)


def _create(db: Database, conn: sa.Connection, table: sa.Table) -> None:
    db.dialect.staging_table(table).create(conn)


def create_outbox_staging(db: Database, name: TableName, key_hash: bool = False) -> None:
    """Create the outbox staging table (outbox ids are assigned by the commit's ordered INSERT … SELECT)."""
    with db.engine.begin() as conn:
        _create(db, conn, outbox_staging_table(name, key_hash))


def create_target_staging(db: Database, target: TableName, name: TableName, columns: list[str]) -> None:
    """Create a staging table for the target table holding ``columns`` with the target's types."""
    with db.engine.begin() as conn:
        reflected = sa.Table(target.name, sa.MetaData(), schema=target.schema, autoload_with=conn)
        cols = _bookkeeping_columns() + [sa.Column(c, reflected.c[c].type, nullable=True) for c in columns]
        _create(db, conn, _table(name, cols))


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

