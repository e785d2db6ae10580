"""The outbox table's DDL, creation, and the start-up check of an existing table."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import NoSuchTableError

from pyharvest.bindings.sql.connect import create_engine, resolve
from pyharvest.core.errors import BindingError
from pyharvest.plugins.api import (
    NATIVE,
    REQUIRED_COLUMNS,
    Dialect,
    OutboxTable,
    TableName,
    load_dialect,
    parse_table_name,
)

__all__ = ["check_privileges", "check_table", "create_outbox_table", "schema_ddl"]


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
) -> None:
    """Create the outbox table unless it exists (idempotent); an existing table is checked.
    ``quarantine=True`` also creates its quarantine table (``poisonPolicy: quarantine``)."""
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
    finally:
        engine.dispose()


def check_table(engine: sa.Engine, name: TableName, plugin: Dialect, layout: str | None = None) -> str:
    """Check the table exists with the columns of its layout; return the layout.

    ``layout=None`` recognises it from the columns (through the dialect's hook).
    """
    where = f"at {engine.url.render_as_string(hide_password=True)}"
    try:
        reflected = sa.inspect(engine).get_columns(name.name, schema=name.schema)
    except NoSuchTableError:
        raise BindingError(
            f"outbox table {str(name)!r} does not exist {where}; create it with "
            f"`reaper init-db --table {name}` (or `reaper schema --binding {plugin.name}` to see the DDL)"
        ) from None
    except sa.exc.OperationalError as e:
        raise BindingError(f"cannot inspect outbox table {str(name)!r} {where}: {str(e.orig).splitlines()[0]}") from e
    columns: dict[str, Any] = {c["name"].lower(): c for c in reflected}
    if not columns:  # some backends report a missing table as no columns
        raise BindingError(f"outbox table {str(name)!r} does not exist {where}; create it with `reaper init-db`")
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
