"""``create_binding``: a ready, checked SQL binding from a data source and a table name."""

from __future__ import annotations

from typing import Any

from pyharvest.bindings.sql.binding import MalformedRowHandler, SqlBinding
from pyharvest.bindings.sql.connect import create_engine, resolve
from pyharvest.bindings.sql.grants import check_grants, component_grants
from pyharvest.bindings.sql.quarantine import QuarantineTable
from pyharvest.bindings.sql.schema import check_table, has_key_hash
from pyharvest.plugins.api import NATIVE, OutboxTable, TableName, parse_table_name

__all__ = ["create_binding"]


def create_binding(
    data_source: str,
    table: str | TableName = "outbox",
    dialect: str | None = None,
    *,
    layout: str | None = None,
    on_malformed: MalformedRowHandler | None = None,
    engine_options: dict[str, Any] | None = None,
    quarantine: bool = False,
) -> SqlBinding:
    """A :class:`SqlBinding` for ``table`` at ``data_source`` (a SQLAlchemy URL or, for
    PostgreSQL, a libpq ``key=value`` string).

    ``dialect`` names the plugin (default: from the URL's backend). ``layout`` forces
    ``"native"`` or ``"goharvest"`` (default: recognised from the table's columns). Raises
    :class:`~pyharvest.core.errors.ConfigError` for a bad table name or data source and
    :class:`~pyharvest.core.errors.BindingError` when the table is missing or wrong, and
    :class:`~pyharvest.core.errors.MissingGrantError` naming a privilege the harvester needs
    (:mod:`pyharvest.bindings.sql.grants`) that the connecting role lacks.

    ``quarantine=True`` (``poisonPolicy: quarantine``) creates the quarantine table if it is
    missing and makes marks skip quarantined keys; otherwise the mark statement is the plain
    one (the binding still switches over if the engine ever quarantines a key).
    """
    name = parse_table_name(table)
    url, plugin = resolve(data_source, dialect)
    engine = create_engine(url, plugin, **(engine_options or {}))
    try:
        found = check_table(engine, name, plugin, layout)
        outbox = OutboxTable.build(name, found, key_hash=found == NATIVE and has_key_hash(engine, name))
        q = None
        if quarantine:
            q = QuarantineTable.for_outbox(outbox)
            q.create(engine)
        check_grants(engine, plugin, component_grants("reaper", outbox, quarantine=q is not None), "reaper")
        return SqlBinding(
            engine,
            outbox,
            plugin,
            on_malformed=on_malformed,
            display_url=url.render_as_string(hide_password=True),
            quarantine=q,
        )
    except BaseException:
        engine.dispose()
        raise


