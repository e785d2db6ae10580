"""The outbox table's DDL, creation, and the start-up check of an existing table."""

from __future__ import annotations

import hashlib
import logging
import warnings
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import NoSuchTableError

from pyharvest.bindings.sql.connect import create_engine, resolve
from pyharvest.core.errors import BindingError, TableNotFoundError
from pyharvest.core.shards import key_hash
from pyharvest.plugins.api import (
    KEY_HASH_COLUMN,
    MAX_PART_LENGTH,
    NATIVE,
    REQUIRED_COLUMNS,
    Dialect,
    OutboxTable,
    TableName,
    load_dialect,
    parse_table_name,
)

__all__ = [
    "check_privileges",
    "check_table",
    "create_outbox_table",
    "has_key_hash",
    "has_shard_index",
    "init_db_command",
    "missing_table",
    "prepare_shards",
    "schema_ddl",
    "shard_index_name",
]

log = logging.getLogger("pyharvest.bindings.sql")


def _layout_supported(plugin: Dialect, layout: str) -> None:
    if layout not in plugin.table_layouts():
        raise BindingError(
            f"dialect {plugin.name!r} does not support the {layout!r} table layout; "
            f"it supports: {', '.join(plugin.table_layouts())}"
        )


def schema_ddl(dialect_name: str, table: str | TableName = "outbox", layout: str = NATIVE) -> str:
    """The SQL that creates the outbox table (and what the mark needs) for a dialect."""
    plugin = load_dialect(dialect_name)
    _layout_supported(plugin, layout)
    statements = plugin.outbox_ddl(OutboxTable.build(parse_table_name(table), layout))
    return "".join(s.strip().rstrip(";") + ";\n" for s in statements)


def create_outbox_table(
    data_source: str,
    table: str | TableName = "outbox",
    dialect: str | None = None,
    layout: str = NATIVE,
    *,
    quarantine: bool = False,
    shards: int = 1,
) -> None:
    """Create the outbox table unless it exists (idempotent); an existing table is checked.
    ``quarantine=True`` also creates its quarantine table (``poisonPolicy: quarantine``).
    ``shards`` > 1 also makes it ready to be harvested in that many shards
    (:func:`prepare_shards`)."""
    name = parse_table_name(table)
    url, plugin = resolve(data_source, dialect)
    _layout_supported(plugin, layout)
    engine = create_engine(url, plugin, pool_size=1)
    try:
        if not sa.inspect(engine).has_table(name.name, schema=name.schema):
            with engine.begin() as conn:
                for stmt in plugin.outbox_ddl(OutboxTable.build(name, layout)):
                    conn.exec_driver_sql(stmt)
        check_table(engine, name, plugin, layout)
        if quarantine:
            from pyharvest.bindings.sql.quarantine import create_quarantine_table

            create_quarantine_table(engine, name)
        if shards > 1:
            prepare_shards(engine, name, plugin, shards)
    finally:
        engine.dispose()


def has_key_hash(engine: sa.Engine | sa.Connection, name: TableName) -> bool:
    """Whether the table has the key hash column that places rows in shards."""
    columns = sa.inspect(engine).get_columns(name.name, schema=name.schema)
    return any(c["name"].lower() == KEY_HASH_COLUMN for c in columns)


def shard_index_name(name: TableName, shards: int) -> str:
    """``<table>_shards<N>``, shortened with a hash past the identifier limit."""
    suffix = f"_shards{int(shards)}"
    base = name.name
    if len(base) + len(suffix) > MAX_PART_LENGTH:
        digest = hashlib.sha1(base.encode(), usedforsecurity=False).hexdigest()[:8]
        base = f"{base[: MAX_PART_LENGTH - len(suffix) - 9]}_{digest}"
    return base + suffix


def has_shard_index(engine: sa.Engine, name: TableName, shards: int) -> bool:
    wanted = shard_index_name(name, shards).lower()
    with warnings.catch_warnings():
        # SQLite's expression indexes are not reflected (its DDL is idempotent instead).
        warnings.simplefilter("ignore", sa.exc.SAWarning)
        indexes = sa.inspect(engine).get_indexes(name.name, schema=name.schema)
    return any((ix.get("name") or "").lower() == wanted for ix in indexes)


def prepare_shards(engine: sa.Engine, name: TableName, plugin: Dialect, shards: int) -> None:
    """Make the native table ready for ``shards`` shards (idempotent): add the key hash column
    if it is missing and fill it in for the rows already there, then create the dialect's shard
    index (see :func:`pyharvest.plugins.hookspecs.pyharvest_shard_ddl`)."""
    layout = check_table(engine, name, plugin)
    if layout != NATIVE:
        raise BindingError(
            f"outbox table {str(name)!r} has the {layout!r} layout, which has no {KEY_HASH_COLUMN} column: "
            "shards need the native layout (goharvest's table is kept exactly as goharvest writes it)"
        )
    preparer = engine.dialect.identifier_preparer
    if not has_key_hash(engine, name):
        with engine.begin() as conn:
            conn.exec_driver_sql(f"ALTER TABLE {name.quoted(preparer)} ADD {preparer.quote(KEY_HASH_COLUMN)} INTEGER")
        log.info("added column %s to %s", KEY_HASH_COLUMN, name)
    filled = fill_key_hashes(engine, OutboxTable.build(name, NATIVE, key_hash=True))
    if filled:
        log.info("filled in the key hash of %d existing row(s) of %s", filled, name)
    if not has_shard_index(engine, name, shards):
        outbox = OutboxTable.build(name, NATIVE, key_hash=True)
        with engine.begin() as conn:
            for stmt in plugin.shard_ddl(outbox, shards, shard_index_name(name, shards)):
                conn.execute(sa.text(stmt))  # text(): the driver sees a modulo, not a placeholder
        log.info("created the index for %d shards on %s", shards, name)


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


def init_db_command(engine: sa.Engine, name: TableName, options: str = "") -> str:
    """The ``reaper init-db`` command for ``name`` at ``engine``'s database, as it runs when
    printed: the data source included (its password masked, and said so)."""
    url = engine.url.render_as_string(hide_password=True)
    password = " (with the password in place of ***)" if engine.url.password else ""
    return f"`reaper init-db --data-source '{url}' --table {name}{options}`{password}"


def missing_table(engine: sa.Engine, name: TableName, plugin: Dialect) -> TableNotFoundError:
    """The one error for a missing outbox table, at start or mid-run: where it was looked for,
    and an ``init-db`` command that runs as printed (but for a masked password)."""
    return TableNotFoundError(
        str(name), f"at {engine.url.render_as_string(hide_password=True)}",
        f"{init_db_command(engine, name)} (or `reaper schema --binding {plugin.name}` to see the DDL)",
    )


def table_missing(engine: sa.Engine, name: TableName) -> bool:
    """Whether ``name`` is known not to exist; False when the database cannot tell now."""
    try:
        return not sa.inspect(engine).has_table(name.name, schema=name.schema)
    except Exception:  # noqa: BLE001 - the database is down rather than the table gone
        return False


def check_table(engine: sa.Engine, name: TableName, plugin: Dialect, layout: str | None = None) -> str:
    """Check the table exists with the columns of its layout; return the layout.

    ``layout=None`` recognises it from the columns (through the dialect's hook).
    """
    where = f"at {engine.url.render_as_string(hide_password=True)}"
    try:
        reflected = sa.inspect(engine).get_columns(name.name, schema=name.schema)
    except NoSuchTableError:
        raise missing_table(engine, name, plugin) from None
    except sa.exc.OperationalError as e:
        raise BindingError(f"cannot inspect outbox table {str(name)!r} {where}: {str(e.orig).splitlines()[0]}") from e
    columns: dict[str, Any] = {c["name"].lower(): c for c in reflected}
    if not columns:  # some backends report a missing table as no columns
        raise missing_table(engine, name, plugin)
    if layout is None:
        layout = plugin.detect_layout(columns) or NATIVE
    _layout_supported(plugin, layout)
    missing = [c for c in REQUIRED_COLUMNS[layout] if c not in columns]
    if missing:
        raise BindingError(
            f"outbox table {str(name)!r} {where} lacks column(s) {', '.join(missing)} of the {layout!r} layout; "
            f"compare it with `reaper schema --binding {plugin.name}`, or create a fresh one with `reaper init-db`"
        )
    return layout




def check_privileges(engine: sa.Engine, outbox: OutboxTable, extra: sa.Table | None = None) -> None:
    """Fail at start-up, naming the table and the statement, when the connecting role may not
    select, update and delete outbox rows (and select and delete rows of ``extra``, the
    quarantine table). The probes touch no row (``WHERE false``) and are rolled back."""
    t = outbox.table
    probes: list[tuple[str, sa.Executable]] = [
        (f"SELECT from {outbox.name}", sa.select(*t.c).where(sa.false())),
        (f"UPDATE of {outbox.name}", sa.update(t).where(sa.false()).values(leader_id=sa.null())),
        (f"DELETE from {outbox.name}", sa.delete(t).where(sa.false())),
    ]
    if extra is not None:
        shown = f"{extra.schema}.{extra.name}" if extra.schema else extra.name
        probes += [
            (f"SELECT from {shown}", sa.select(*extra.c).where(sa.false())),
            (f"DELETE from {shown}", sa.delete(extra).where(sa.false())),
        ]
    where = engine.url.render_as_string(hide_password=True)
    with engine.connect() as conn:
        for what, stmt in probes:
            trans = conn.begin()
            try:
                conn.execute(stmt)
            except sa.exc.DBAPIError as e:
                trans.rollback()
                reason = str(e.orig).strip().splitlines()[0] if e.orig is not None else str(e)
                raise BindingError(
                    f"the database user at {where} may not {what.split(' ')[0]} rows of the outbox "
                    f"({what} failed: {reason}); grant SELECT, UPDATE, DELETE on it"
                    + (" and SELECT, INSERT, DELETE on its quarantine table" if extra is not None else "")
                ) from None
            trans.rollback()
