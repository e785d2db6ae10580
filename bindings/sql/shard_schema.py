"""What makes an outbox table ready to be harvested in shards, and the check that it is.

Three things, all made by ``reaper init-db --shards N`` (:func:`pyharvest.bindings.sql.schema.prepare_shards`):

* the key hash column, filled in for the rows written before it existed;
* the key hash guard (the dialect's ``pyharvest_key_hash_guard``): the database refuses a new
  row without a hash. A writer that read the table before the column existed would otherwise
  go on writing rows the shard filter puts in shard 0, while the same key's other rows sit in
  their own shard, published by another leader: one key, two leaders, order lost. Refused,
  the writer's stasher rereads the table and the retried transaction stores the hash;
* the shard index the shard's mark reads through.

A sharded harvester refuses to start on a table that lacks any of them (:func:`check_shardable`).
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa

from pyharvest.bindings.sql.component_grants import Grant, check_grants
from pyharvest.core.errors import BindingError
from pyharvest.core.outbox.keys import key_hash
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.plugins.api import (
    KEY_HASH_COLUMN,
    KEY_HASH_GUARD_SUFFIX,
    MAX_PART_LENGTH,
    NATIVE,
    Dialect,
    OutboxTable,
    TableName,
)

__all__ = [
    "accepts_rows_without_hash",
    "check_shardable",
    "fill_key_hashes",
    "has_key_hash",
    "has_shard_index",
    "key_hash_guard_name",
    "shard_index_name",
]


def _object_name(name: TableName, suffix: str) -> str:
    """``<table><suffix>``, shortened with a hash past the identifier limit."""
    base = name.name
    if len(base) + len(suffix) > MAX_PART_LENGTH:
        digest = hashlib.sha1(base.encode(), usedforsecurity=False).hexdigest()[:8]
        base = f"{base[: MAX_PART_LENGTH - len(suffix) - 9]}_{digest}"
    return base + suffix


def shard_index_name(name: TableName, shards: int) -> str:
    """``<table>_shards<N>``, shortened with a hash past the identifier limit."""
    return _object_name(name, f"_shards{int(shards)}")


def key_hash_guard_name(name: TableName) -> str:
    """``<table>_key_hash_required``: the guard's constraint or trigger, named in its refusals."""
    return _object_name(name, KEY_HASH_GUARD_SUFFIX)


def has_key_hash(engine: sa.Engine | sa.Connection, name: TableName) -> bool:
    """Whether the table has the key hash column that places rows in shards."""
    columns = sa.inspect(engine).get_columns(name.name, schema=name.schema)
    return any(c["name"].lower() == KEY_HASH_COLUMN for c in columns)


def has_shard_index(engine: sa.Engine, name: TableName, shards: int, dialect: Dialect | None = None) -> bool:
    from pyharvest.plugins.api import dialect_of

    dialect = dialect or dialect_of(engine)
    if dialect is None:
        raise BindingError(f"no pyharvest dialect serves {engine.url.get_backend_name()!r}")
    with engine.connect() as conn:
        return shard_index_name(name, shards).lower() in dialect.index_names(conn, name)


def accepts_rows_without_hash(engine: sa.Engine, outbox: OutboxTable) -> bool:
    """Whether the table still takes a row without a key hash: one is inserted, and the
    transaction rolled back either way (what the database does is what matters, whichever
    constraint or trigger its dialect uses)."""
    probe = outbox.encode(OutboxRecord("pyharvest.probe", "pyharvest.probe", None), OutboxTable.now(), None)
    probe[KEY_HASH_COLUMN] = None
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            conn.execute(sa.insert(outbox.table), probe)
        except sa.exc.DBAPIError as e:
            if KEY_HASH_GUARD_SUFFIX not in str(e).lower():
                raise
            return False
        finally:
            trans.rollback()
    return True


def fill_key_hashes(engine: sa.Engine, outbox: OutboxTable, batch: int = 1000) -> int:
    """Set the key hash of rows written without one (by a writer that predates the column)."""
    t = outbox.table
    hash_column = t.c[KEY_HASH_COLUMN]
    pending = sa.select(t.c.id, t.c.kafka_key).where(hash_column.is_(None), t.c.id > sa.bindparam("after"))
    pending = pending.order_by(t.c.id).limit(batch)
    fill = sa.update(t).where(t.c.id == sa.bindparam("row_id")).values({KEY_HASH_COLUMN: sa.bindparam("h")})
    total, after = 0, -1
    while True:
        with engine.begin() as conn:
            rows = conn.execute(pending, {"after": after}).all()
            if not rows:
                return total
            conn.execute(fill, [{"row_id": i, "h": key_hash(k)} for i, k in rows])
        total += len(rows)
        after = rows[-1][0]


def check_shardable(engine: sa.Engine, outbox: OutboxTable, dialect: Dialect, shards: int, init_db: str) -> None:
    """Refuse a table not ready for ``shards`` shards, naming ``init_db``, the ``reaper init-db
    --shards N`` command that readies it."""
    name = outbox.name
    fix = f"{init_db} (with the harvesters stopped)"
    if outbox.layout != NATIVE:
        raise BindingError(
            f"outbox table {str(name)!r} has goharvest's layout, which cannot be harvested in shards (its table "
            "is kept exactly as goharvest writes it, with no key hash); use shards: 1"
        )
    if not outbox.key_hash:
        raise BindingError(
            f"outbox table {str(name)!r} has no {KEY_HASH_COLUMN} column, so its rows cannot be placed in "
            f"shards; add it with {fix}"
        )
    if not has_shard_index(engine, name, shards, dialect):
        raise BindingError(
            f"outbox table {str(name)!r} has no index for {shards} shards ({shard_index_name(name, shards)}), "
            f"so every shard's mark would scan the table; create it with {fix}"
        )
    why = "the start-up check that the table refuses rows without a key hash (one row, rolled back)"
    check_grants(engine, dialect, [Grant(("INSERT",), outbox.table, why)], "reaper")
    if accepts_rows_without_hash(engine, outbox):
        raise BindingError(
            f"outbox table {str(name)!r} still accepts rows without a key hash, which a writer that read the "
            f"table before the column existed would write (and two shards would then publish one key); "
            f"make it refuse them with {fix}"
        )
