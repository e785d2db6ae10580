"""pyharvest for Alembic: create and drop the outbox table in a migration, with the DDL of
the database's dialect plugin, and keep autogenerate away from it.

.. code-block:: python

    from pyharvest.alembic import create_outbox_table, drop_outbox_table

    def upgrade() -> None:
        create_outbox_table(op)               # "outbox"; name=, schema= for another

    def downgrade() -> None:
        drop_outbox_table(op)

The statements are exactly those of ``reaper init-db`` and ``reaper schema`` (storage options
and defaults included), chosen by the dialect of the migration's connection, and they work
offline too (``alembic upgrade --sql``). In ``env.py``, pass
``include_name=ignore_outbox_tables()`` to ``context.configure`` so that autogenerate neither
drops the outbox (it is in the database, not in your metadata) nor compares it.

There is deliberately no ``Table`` of the outbox for ``target_metadata``: autogenerate would
create it from the columns alone and lose what the plugin's DDL carries (see
``docs/alembic.md`` for the list per database).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import sqlalchemy as sa

from pyharvest.core.errors import BindingError
from pyharvest.plugins.api import NATIVE, Dialect, OutboxTable, TableName, dialect_of, parse_table_name

if TYPE_CHECKING:
    from alembic.operations import Operations

__all__ = ["create_outbox_table", "drop_outbox_table", "ignore_outbox_tables", "outbox_ddl"]

#: Alembic's ``include_name`` hook: ``(name, type_, parent_names) -> bool``.
IncludeName = Callable[[str | None, str, Mapping[str, str | None]], bool]


def _table(name: str, schema: str | None) -> TableName:
    return parse_table_name(f"{schema}.{name}" if schema else name)


def _dialect_of(sa_dialect: sa.Dialect) -> Dialect:
    dialect = dialect_of(sa_dialect)
    if dialect is None:
        raise BindingError(
            f"no installed pyharvest dialect serves SQLAlchemy backend {sa_dialect.name!r}; "
            "install its dialect plugin (see docs/dialects/writing-a-plugin.md)"
        )
    return dialect


def outbox_ddl(dialect: sa.Dialect, name: str = "outbox", schema: str | None = None) -> list[str]:
    """The statements that create the outbox table on ``dialect``'s database (its pyharvest
    dialect plugin's, as ``reaper schema`` prints them)."""
    return _dialect_of(dialect).outbox_ddl(OutboxTable.build(_table(name, schema), NATIVE))


def _ddl(statement: str) -> sa.DDL:
    # DDL: never parsed for :bind parameters; its %-formatting needs literal '%' doubled.
    return sa.DDL(statement.replace("%", "%%"))  # type: ignore[no-untyped-call]  # SQLAlchemy leaves DDL.__init__ unannotated


def create_outbox_table(op: Operations, name: str = "outbox", schema: str | None = None) -> None:
    """In a migration's ``upgrade()``: create the outbox table ``schema.name`` with the DDL of
    the migration's database (``op.get_context().dialect``), indexes and storage options
    included: the table ``reaper init-db`` makes, which the harvester and the stasher use as is.
    Works online and offline (``alembic upgrade --sql``)."""
    for statement in outbox_ddl(op.get_context().dialect, name, schema):
        op.execute(_ddl(statement))


def drop_outbox_table(op: Operations, name: str = "outbox", schema: str | None = None) -> None:
    """In a migration's ``downgrade()``: drop the outbox table (and so any record not yet
    published). The quarantine table, which the harvester creates with ``poisonPolicy:
    quarantine``, is not dropped."""
    table = _table(name, schema)
    _dialect_of(op.get_context().dialect)  # the same refusal as create_outbox_table for an unserved database
    op.drop_table(table.name, schema=table.schema)


def ignore_outbox_tables(*tables: str, include_name: IncludeName | None = None) -> IncludeName:
    """An ``include_name`` hook for ``context.configure`` that hides the outbox tables
    (``"outbox"`` when none is named; ``"schema.table"`` for another schema) and their
    quarantine tables from autogenerate; every other name is left to ``include_name`` (if
    given) or included. Names compare case-insensitively."""
    from pyharvest.bindings.sql.quarantine import quarantine_table_name

    names = [parse_table_name(t) for t in (tables or ("outbox",))]
    hidden = {
        (n.schema.lower() if n.schema else None, n.name.lower())
        for t in names
        for n in (t, quarantine_table_name(t))
    }

    def hook(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
        if type_ == "table" and name is not None:
            schema = parent_names.get("schema_name")
            if ((schema.lower() if schema else None), name.lower()) in hidden:
                return False
        return include_name(name, type_, parent_names) if include_name is not None else True

    return hook
