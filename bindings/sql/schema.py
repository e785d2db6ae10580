"""The outbox table's DDL, creation, and the start-up check of an existing table."""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import NoSuchTableError

from pyharvest.bindings.sql.connect import create_engine, resolve
from pyharvest.bindings.sql.shard_schema import (
    accepts_rows_without_hash,
    fill_key_hashes,
    has_key_hash,
    has_shard_index,
    key_hash_guard_name,
    shard_index_name,
)
from pyharvest.core.errors import BindingError, TableNotFoundError
from pyharvest.plugins.api import (
    KEY_HASH_COLUMN,
    NATIVE,
    REQUIRED_COLUMNS,
    Dialect,
    OutboxTable,
    TableName,
    load_dialect,
    parse_table_name,
)

__all__ = [
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


def _layout_supported(dialect: Dialect, layout: str) -> None:
    if layout not in dialect.table_layouts():
        raise BindingError(
            f"dialect {dialect.name!r} does not support the {layout!r} table layout; "
            f"it supports: {', '.join(dialect.table_layouts())}"
        )


def schema_ddl(dialect_name: str, table: str | TableName = "outbox", layout: str = NATIVE) -> str:
    """The SQL that creates the outbox table (and what the mark needs) for a dialect."""
    dialect = load_dialect(dialect_name)
    _layout_supported(dialect, layout)
    statements = dialect.outbox_ddl(OutboxTable.build(parse_table_name(table), layout))
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
    url, chosen = resolve(data_source, dialect)  # the dialect ``dialect`` names, or the URL's
    _layout_supported(chosen, layout)
    engine = create_engine(url, chosen, pool_size=1)
    try:
        if not sa.inspect(engine).has_table(name.name, schema=name.schema):
            with engine.begin() as conn:
                for stmt in chosen.outbox_ddl(OutboxTable.build(name, layout)):
                    conn.exec_driver_sql(stmt)
        check_table(engine, name, chosen, layout)
        if quarantine:
            from pyharvest.bindings.sql.quarantine import create_quarantine_table

            create_quarantine_table(engine, name)
        if shards > 1:
            prepare_shards(engine, name, chosen, shards)
    finally:
        engine.dispose()


def prepare_shards(engine: sa.Engine, name: TableName, dialect: Dialect, shards: int) -> None:
    """Make the native table ready for ``shards`` shards (idempotent; see
    :mod:`~pyharvest.bindings.sql.shard_schema`): add the key hash column if it is missing, make
    the table refuse new rows without a hash, fill it in for the rows already there, then
    create the dialect's shard index (:func:`pyharvest.plugins.hookspecs.pyharvest_shard_ddl`).
    Writers may keep running throughout."""
    layout = check_table(engine, name, dialect)
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
    outbox = OutboxTable.build(name, NATIVE, key_hash=True)
    filled = fill_key_hashes(engine, outbox)
    _guard_key_hash(engine, outbox, dialect)
    # What writers that predate the column stored before the guard refused them.
    filled += fill_key_hashes(engine, outbox)
    if filled:
        log.info("filled in the key hash of %d existing row(s) of %s", filled, name)
    if not has_shard_index(engine, name, shards, dialect):
        with engine.begin() as conn:
            for stmt in dialect.shard_ddl(outbox, shards, shard_index_name(name, shards)):
                conn.execute(sa.text(stmt))  # text(): the driver sees a modulo, not a placeholder
        log.info("created the index for %d shards on %s", shards, name)


def _guard_key_hash(engine: sa.Engine, outbox: OutboxTable, dialect: Dialect, attempts: int = 5) -> None:
    """Make the table refuse new rows without a key hash, unless it already does."""
    for attempt in range(attempts):
        if not accepts_rows_without_hash(engine, outbox):
            return
        try:
            with engine.begin() as conn:
                for stmt in dialect.key_hash_guard(outbox, key_hash_guard_name(outbox.name)):
                    conn.exec_driver_sql(stmt)
        except sa.exc.DBAPIError:
            # A guard that also checks existing rows fails on those written since the last
            # fill: fill them in and try again.
            if attempt == attempts - 1:
                raise
            fill_key_hashes(engine, outbox)
            continue
        log.info("%s now refuses rows without a key hash (%s)", outbox.name, key_hash_guard_name(outbox.name))
        return


def init_db_command(engine: sa.Engine, name: TableName, options: str = "", *, init_db: str | None = None) -> str:
    """The ``reaper init-db`` command for ``name`` at ``engine``'s database, as it runs when
    printed. ``init_db`` is the command as the harvester's own configuration gives it (``reaper
    init-db -f reaper.yaml`` for a reaper started with ``-f``: the file holds the data source,
    password and all); without it, the data source is spelt out (its password masked, and said so)."""
    if init_db is not None:
        return f"`{init_db}{options}`"
    url = engine.url.render_as_string(hide_password=True)
    password = " (with the password in place of ***)" if engine.url.password else ""
    return f"`reaper init-db --data-source '{url}' --table {name}{options}`{password}"


def missing_table(
    engine: sa.Engine, name: TableName, dialect: Dialect, *, init_db: str | None = None
) -> TableNotFoundError:
    """The one error for a missing outbox table, at start or mid-run: where it was looked for,
    and an ``init-db`` command that runs as printed (``init_db``, or the data source's with a
    masked password: :func:`init_db_command`)."""
    return TableNotFoundError(
        str(name), f"at {engine.url.render_as_string(hide_password=True)}",
        f"{init_db_command(engine, name, init_db=init_db)} "
        f"(or `reaper schema --binding {dialect.name}` to see the DDL)",
    )


def table_missing(engine: sa.Engine, name: TableName) -> bool:
    """Whether ``name`` is known not to exist; False when the database cannot tell now."""
    try:
        return not sa.inspect(engine).has_table(name.name, schema=name.schema)
    except Exception:  # noqa: BLE001 - the database is down rather than the table gone
        return False


def check_table(
    engine: sa.Engine, name: TableName, dialect: Dialect, layout: str | None = None, *, init_db: str | None = None
) -> str:
    """Check the table exists with the columns of its layout; return the layout.

    ``layout=None`` recognises it from the columns (through the dialect's hook). A missing
    table's error advises ``init_db`` (see :func:`missing_table`).
    """
    where = f"at {engine.url.render_as_string(hide_password=True)}"
    try:
        reflected = sa.inspect(engine).get_columns(name.name, schema=name.schema)
    except NoSuchTableError:
        raise missing_table(engine, name, dialect, init_db=init_db) from None
    except sa.exc.OperationalError as e:
        raise BindingError(f"cannot inspect outbox table {str(name)!r} {where}: {str(e.orig).splitlines()[0]}") from e
    columns: dict[str, Any] = {c["name"].lower(): c for c in reflected}
    if not columns:  # some backends report a missing table as no columns
        raise missing_table(engine, name, dialect, init_db=init_db)
    if layout is None:
        layout = dialect.detect_layout(columns) or NATIVE
    _layout_supported(dialect, layout)
    missing = [c for c in REQUIRED_COLUMNS[layout] if c not in columns]
    if missing:
        raise BindingError(
            f"outbox table {str(name)!r} {where} lacks column(s) {', '.join(missing)} of the {layout!r} layout; "
            f"compare it with `reaper schema --binding {dialect.name}`, or create a fresh one with `reaper init-db`"
        )
    return layout
