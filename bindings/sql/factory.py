"""``create_binding``: a ready, checked SQL binding from a data source and a table name."""

from __future__ import annotations

from typing import Any

from pyharvest.bindings.sql.binding import MalformedRowHandler, SqlBinding
from pyharvest.bindings.sql.component_grants import check_grants, component_grants
from pyharvest.bindings.sql.connect import create_engine, resolve
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
    lock_timeout: float | None = None,
    init_db: str | None = None,
    mark_lookback: float = 0.0,
    late_row_scan_interval: float = 5.0,
) -> SqlBinding:
    """A :class:`SqlBinding` for ``table`` at ``data_source`` (a SQLAlchemy URL or, for
    PostgreSQL, a libpq ``key=value`` string).

    ``dialect`` names the dialect (default: the one serving the URL's backend). ``layout`` forces
    ``"native"`` or ``"goharvest"`` (default: recognised from the table's columns). Raises
    :class:`~pyharvest.core.errors.ConfigError` for a bad table name or data source and
    :class:`~pyharvest.core.errors.BindingError` when the table is missing or wrong, and
    :class:`~pyharvest.core.errors.MissingGrantError` naming a privilege the harvester needs
    (:mod:`pyharvest.bindings.sql.component_grants`) that the connecting role lacks.

    ``quarantine=True`` (``poisonPolicy: quarantine``) creates the quarantine table if it is
    missing and makes marks skip quarantined keys; otherwise the mark statement is the plain
    one (the binding still switches over if the engine ever quarantines a key).
    ``lock_timeout`` (seconds; ``limits.lockTimeout``) bounds how long the binding's statements
    wait for a lock another session holds: one that waits longer raises
    :class:`~pyharvest.core.errors.TableLockedError` naming the holders, and is retried.

    ``mark_lookback`` (seconds; ``limits.markLookback``) makes each mark start past the rows its
    leader id marked that long ago, and ``late_row_scan_interval`` (``limits.lateRowScanInterval``)
    is how often a thread looks below that for rows that committed late
    (:mod:`pyharvest.bindings.sql.mark_cursor`); 0: every mark from the lowest id.

    ``init_db`` is the ``reaper init-db`` command that creates the table from the configuration
    the harvester was given (``reaper init-db -f reaper.yaml``), which a missing or unsharded
    table's error advises, at start or mid-run; by default the data source is spelt out.
    """
    name = parse_table_name(table)
    url, chosen = resolve(data_source, dialect)  # the dialect ``dialect`` names, or the URL's
    engine = create_engine(url, chosen, lock_timeout=lock_timeout, **(engine_options or {}))
    try:
        found = check_table(engine, name, chosen, layout, init_db=init_db)
        outbox = OutboxTable.build(name, found, key_hash=found == NATIVE and has_key_hash(engine, name))
        q = None
        if quarantine:
            q = QuarantineTable.for_outbox(outbox)
            q.create(engine)
        check_grants(engine, chosen, component_grants("reaper", outbox, quarantine=q is not None), "reaper")
        return SqlBinding(
            engine,
            outbox,
            chosen,
            on_malformed=on_malformed,
            display_url=url.render_as_string(hide_password=True),
            quarantine=q,
            lock_timeout=lock_timeout,
            init_db=init_db,
            mark_lookback=mark_lookback,
            late_row_scan_interval=late_row_scan_interval,
        )
    except BaseException:
        engine.dispose()
        raise


