"""Finding and loading dialect plugins by name, from the ``pyharvest.dialects`` entry points.

Each dialect gets its own :class:`pluggy.PluginManager` holding just that plugin, so a
``firstresult`` hook answers for exactly one dialect and unimplemented hooks fall back to
the generic behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from pyharvest.core.errors import BindingError
from pyharvest.plugins import hookspecs

if TYPE_CHECKING:
    import sqlalchemy as sa

    from pyharvest.bindings.sql.bulk import BulkWriter
    from pyharvest.bindings.sql.marking import MarkStrategy
    from pyharvest.bindings.sql.outbox import OutboxTable

__all__ = ["ENTRY_POINT_GROUP", "Dialect", "dialect_for_backend", "installed_dialects", "load_dialect"]

ENTRY_POINT_GROUP = "pyharvest.dialects"


def installed_dialects() -> dict[str, EntryPoint]:
    """Entry points of the installed dialects by name (read afresh: plugins may be installed at run time)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


class Dialect:
    """A loaded dialect plugin, with typed access to its hooks."""

    def __init__(self, name: str, plugin: ModuleType | object) -> None:
        pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        pm.add_hookspecs(hookspecs)
        pm.register(plugin, name=name)
        pm.check_pending()  # a misspelt hook name fails here, not silently at run time
        self.name = name
        self.plugin = plugin
        self._hook = pm.hook
        declared = self._hook.pyharvest_dialect_name()
        if declared != name:
            raise BindingError(
                f"dialect plugin {getattr(plugin, '__name__', plugin)!r} is registered as {name!r} "
                f"but pyharvest_dialect_name() returns {declared!r}; they must match"
            )

    def __repr__(self) -> str:
        return f"Dialect({self.name!r}, {getattr(self.plugin, '__name__', self.plugin)!r})"

    def url_backends(self) -> Sequence[str]:
        return tuple(self._hook.pyharvest_url_backends() or (self.name,))

    def normalize_data_source(self, data_source: str) -> str | None:
        result: str | None = self._hook.pyharvest_normalize_data_source(data_source=data_source)
        return result

    def engine_options(self, url: sa.URL) -> dict[str, Any]:
        return dict(self._hook.pyharvest_engine_options(url=url) or {})

    def on_connect(self, dbapi_connection: Any, url: sa.URL) -> None:
        self._hook.pyharvest_on_connect(dbapi_connection=dbapi_connection, url=url)

    def configure_engine(self, engine: sa.Engine) -> None:
        self._hook.pyharvest_configure_engine(engine=engine)

    def table_layouts(self) -> Sequence[str]:
        return tuple(self._hook.pyharvest_table_layouts() or ("native",))

    def detect_layout(self, columns: Mapping[str, Any]) -> str | None:
        result: str | None = self._hook.pyharvest_detect_layout(columns=columns)
        return result

    def outbox_ddl(self, table: OutboxTable) -> list[str]:
        ddl = self._hook.pyharvest_outbox_ddl(table=table)
        if ddl is None:
            raise BindingError(f"dialect {self.name!r} cannot create an outbox table of layout {table.layout!r}")
        return list(ddl)

    def mark_strategy(self, table: OutboxTable) -> MarkStrategy:
        strategy: MarkStrategy | None = self._hook.pyharvest_mark_strategy(table=table)
        if strategy is None:
            from pyharvest.bindings.sql.marking import TransactionalMark

            strategy = TransactionalMark(table)
        return strategy

    def id_filter(self, id_column: sa.ColumnElement[int]) -> sa.ColumnElement[bool]:
        clause: sa.ColumnElement[bool] | None = self._hook.pyharvest_id_filter(id_column=id_column)
        if clause is None:
            import sqlalchemy as sa

            clause = id_column.in_(sa.bindparam("ids", expanding=True))
        return clause

    def bulk_writer(self, connection: sa.Connection, table: OutboxTable) -> BulkWriter | None:
        writer: BulkWriter | None = self._hook.pyharvest_bulk_writer(connection=connection, table=table)
        return writer


_loaded: dict[str, Dialect] = {}
_lock = threading.Lock()


def load_dialect(name: str) -> Dialect:
    """The installed dialect registered under ``name``; :class:`BindingError` listing the
    installed names when there is none."""
    with _lock:
        dialect = _loaded.get(name)
        if dialect is not None:
            return dialect
        installed = installed_dialects()
        ep = installed.get(name)
        if ep is None:
            raise BindingError(
                f"no pyharvest dialect named {name!r} is installed; installed dialects: "
                f"{', '.join(sorted(installed)) or '(none)'}. A plugin registers itself under the "
                f"{ENTRY_POINT_GROUP!r} entry-point group"
            )
        try:
            plugin = ep.load()
        except Exception as e:
            raise BindingError(f"dialect {name!r} ({ep.value}) failed to load: {e}") from e
        dialect = _loaded[name] = Dialect(name, plugin)
        return dialect


def dialect_for_backend(backend: str) -> str:
    """The dialect serving a SQLAlchemy backend name (``mariadb`` → ``mysql``)."""
    installed = installed_dialects()
    if backend in installed:
        return backend
    for name in sorted(installed):
        try:
            if backend in load_dialect(name).url_backends():
                return name
        except BindingError:
            continue  # a broken third-party plugin must not hide a working one
    raise BindingError(
        f"no installed pyharvest dialect serves SQLAlchemy backend {backend!r}; installed dialects: "
        f"{', '.join(sorted(installed)) or '(none)'}. Name one explicitly (binding / --binding)"
    )
