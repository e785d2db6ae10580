"""The hooks a dialect plugin may implement.

Every hook is ``firstresult`` and optional except :func:`pyharvest_dialect_name`: a plugin
implements only what differs from the generic behaviour, which works on any SQLAlchemy
dialect that supports ``SELECT … FOR UPDATE`` (or serialises writers, like SQLite). Each
dialect is loaded into its own plugin manager, so hooks never mix between dialects.

Hook names carry the ``pyharvest_`` prefix so that a module can hold unrelated functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import sqlalchemy as sa

    from pyharvest.bindings.sql.bulk import BulkWriter
    from pyharvest.bindings.sql.marking import MarkStrategy
    from pyharvest.bindings.sql.outbox import OutboxTable

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

PROJECT_NAME = "pyharvest"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec(firstresult=True)
def pyharvest_dialect_name() -> str:  # type: ignore[empty-body]
    """The dialect's name: the same as its entry-point name. Required."""


@hookspec(firstresult=True)
def pyharvest_url_backends() -> Sequence[str] | None:
    """SQLAlchemy backend names (``make_url(...).get_backend_name()``) this dialect serves
    when no dialect is named explicitly; e.g. ``("mysql", "mariadb")``."""


@hookspec(firstresult=True)
def pyharvest_normalize_data_source(data_source: str) -> str | None:
    """Turn a non-URL data source (e.g. a libpq ``key=value`` DSN) into a SQLAlchemy URL;
    None when the string is not in a form this dialect understands."""


@hookspec(firstresult=True)
def pyharvest_engine_options(url: sa.URL) -> Mapping[str, Any] | None:
    """Extra keyword arguments for :func:`sqlalchemy.create_engine` (isolation level,
    ``connect_args``…). The binding adds its own pool settings afterwards."""


@hookspec
def pyharvest_on_connect(dbapi_connection: Any, url: sa.URL) -> None:
    """Called for every new DBAPI connection of the harvester's engine (session settings)."""


@hookspec
def pyharvest_configure_engine(engine: sa.Engine) -> None:
    """Called once for the harvester's engine: add event listeners (e.g. how to ``BEGIN``)."""


@hookspec(firstresult=True)
def pyharvest_outbox_ddl(table: OutboxTable) -> Sequence[str] | None:
    """The statements that create ``table`` (outbox table plus any index the mark needs),
    idempotent where the database allows (``IF NOT EXISTS``). ``table.layout`` says which
    layout to create; return None for a layout the dialect does not support."""


@hookspec(firstresult=True)
def pyharvest_detect_layout(columns: Mapping[str, Any]) -> str | None:
    """Name the layout of an existing table from its columns (lower-case name → SQLAlchemy
    reflected column dict), or None to let the binding assume ``"native"``."""


@hookspec(firstresult=True)
def pyharvest_table_layouts() -> Sequence[str] | None:
    """The layouts this dialect supports; default ``("native",)``."""


@hookspec(firstresult=True)
def pyharvest_mark_strategy(table: OutboxTable) -> MarkStrategy | None:
    """How to mark. None selects the generic transactional mark
    (:class:`pyharvest.bindings.sql.marking.TransactionalMark`)."""


@hookspec(firstresult=True)
def pyharvest_id_filter(id_column: sa.ColumnElement[int]) -> sa.ColumnElement[bool] | None:
    """A ``WHERE`` clause matching ``id_column`` against a list bound as parameter ``ids``,
    for purge and reset; default ``id_column IN (expanding :ids)``. PostgreSQL binds one
    array instead (``= ANY(:ids)``), keeping one cached statement for every batch size."""


@hookspec(firstresult=True)
def pyharvest_bulk_writer(connection: sa.Connection, table: OutboxTable) -> BulkWriter | None:
    """A faster way than ``executemany`` for the stasher to insert many records into
    ``table`` (PostgreSQL: ``COPY``), or None where the driver or the table does not allow it.
    Asked once per engine and table, on one of the application's connections inside its
    transaction (so any look-up must only read); the answer is cached. A None is asked again
    after an ``INSERT`` into the table fails: it may have come from a table not yet created."""
