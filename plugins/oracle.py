"""Oracle Database 12.2+, through python-oracledb in thin mode (no Instant Client).

Mark: the shared row choice inside one update, ``UPDATE t SET leader_id = :leader_id WHERE
id IN (SELECT id FROM t WHERE <not ours> AND <every row filter> ORDER BY id FETCH FIRST n
ROWS ONLY) RETURNING id INTO :ret_0`` (SQLAlchemy binds the returned ids as an array), then
the rows are read back in the same transaction (they are locked by the update). Oracle
allows no ``FOR UPDATE`` beside ``FETCH FIRST``; a concurrent marker instead blocks on the
row lock and Oracle restarts its update against the committed rows, so a row is never
returned to two markers as if both held it.

Caveat: Oracle stores a zero-length BLOB bound from ``b""`` as NULL, so an empty value is
read back as a tombstone. Identifiers follow SQLAlchemy: lower-case names are Oracle's
case-insensitive (upper-case) names. ``schema_ddl`` has no ``IF NOT EXISTS`` before 23ai;
``create_outbox_table`` checks for the table first.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import oracle

from pyharvest.plugins.api import (
    KEY_LENGTH,
    NATIVE,
    Capabilities,
    DialectOptions,
    MarkOptions,
    MergeForm,
    OutboxTable,
    TableOptions,
    hookimpl,
)

_preparer = oracle.dialect().identifier_preparer  # type: ignore[no-untyped-call]  # SQLAlchemy's dialect __init__ is unannotated

_NATIVE_DDL = TableOptions(
    types={
        "id": oracle.NUMBER(19),  # type: ignore[no-untyped-call]
        "create_time": oracle.TIMESTAMP(timezone=True),
        "kafka_key": sa.NVARCHAR(KEY_LENGTH),  # SQLAlchemy renders Unicode as VARCHAR2 on Oracle
        "kafka_key_hash": oracle.NUMBER(10),  # type: ignore[no-untyped-call]
    },
    defaults={"create_time": "SYSTIMESTAMP"},
    identity=sa.Identity(),
    if_not_exists=False,  # init-db creates the table only when it is missing
)

DIALECT = DialectOptions(
    name="oracle",
    # DDL commits implicitly; IN lists stop at 1,000 (the default list limit).
    capabilities=Capabilities(
        transactional_ddl=False, driver_packages=(("oracledb", "pyharvest[oracle]"), ("cx_oracle", "cx_Oracle")),
        privilege_errors=(1031,),  # ORA-01031: insufficient privileges
    ),
    tables={NATIVE: _NATIVE_DDL},
    # lock=False: Oracle refuses FOR UPDATE beside FETCH FIRST; the update's own row locks serialise markers.
    mark=MarkOptions(returning="ids", lock=False),
    # MERGE may not touch a target row twice (ORA-30926): UpsertFromSelect reads each key's last row only.
    merge=MergeForm(alias_as=False, parenthesised_match=True, qualified_columns=True),
)


@hookimpl
def pyharvest_dialect() -> DialectOptions:
    return DIALECT


@hookimpl
def pyharvest_shard_ddl(table: OutboxTable, shards: int, index: str) -> Sequence[str]:
    # SQLAlchemy renders the default filter's modulo as MOD(): the index must say the same.
    return [
        f"CREATE INDEX {_preparer.quote(index)} ON {table.name.quoted(_preparer)} "
        f"(MOD(COALESCE(kafka_key_hash, 0), {int(shards)}), id)"
    ]


@hookimpl
def pyharvest_key_hash_guard(table: OutboxTable, name: str) -> Sequence[str]:
    # NOVALIDATE: new rows are checked at once, existing ones are left for init-db to fill in.
    return [
        f"ALTER TABLE {table.name.quoted(_preparer)} ADD CONSTRAINT {_preparer.quote(name)} "
        "CHECK (kafka_key_hash IS NOT NULL) ENABLE NOVALIDATE"
    ]
