"""The migration operation that creates the outbox table with its dialect plugin's DDL."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from django.db import router
from django.db.migrations.operations.base import Operation

from pyharvest.django.databases import dialect_for_connection, outbox_table_name
from pyharvest.plugins.api import NATIVE, OutboxTable

__all__ = ["CreateOutboxTable", "outbox_ddl"]


def outbox_ddl(connection: Any, table: str | None = None) -> list[str]:
    """The statements that create the outbox table on a Django connection's database: the
    dialect plugin's DDL, the same as ``reaper init-db`` runs and ``reaper schema`` prints."""
    dialect = dialect_for_connection(connection)
    return dialect.outbox_ddl(OutboxTable.build(outbox_table_name(table), NATIVE))


def _drop_ddl(connection: Any, table: str | None = None) -> str:
    dialect = dialect_for_connection(connection)
    outbox = OutboxTable.build(outbox_table_name(table), NATIVE)
    return str(sa.schema.DropTable(outbox.table).compile(dialect=dialect.sqlalchemy_dialect())).strip()


class CreateOutboxTable(Operation):  # type: ignore[misc]  # Django ships no type information
    """Create the outbox table (``table``, by default the ``PYHARVEST_OUTBOX_TABLE`` setting,
    read when the migration runs) with the DDL of the database's dialect plugin; reversed,
    drop it.

    ``pyharvest``'s own migration uses it; a project may use it in its own migrations for
    a second outbox (``CreateOutboxTable(table="audit_outbox")``). ``sqlmigrate`` shows the
    statements for the database at hand. Routers decide where it runs, as for ``RunSQL``
    (``allow_migrate(db, "pyharvest")`` for the app's migration).
    """

    reduces_to_sql = True
    reversible = True

    def __init__(self, table: str | None = None) -> None:
        self.table = table

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # a table, not a model: nothing in the migration state

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if router.allow_migrate(schema_editor.connection.alias, app_label):
            for statement in outbox_ddl(schema_editor.connection, self.table):
                schema_editor.execute(statement, params=None)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if router.allow_migrate(schema_editor.connection.alias, app_label):
            schema_editor.execute(_drop_ddl(schema_editor.connection, self.table), params=None)

    def describe(self) -> str:
        return f"Create the pyharvest outbox table {outbox_table_name(self.table)}"

    @property
    def migration_name_fragment(self) -> str:
        return "outbox"
