"""Finding and loading dialect plugins by name, from the ``pyharvest.dialects`` entry points.

Each dialect gets its own :class:`pluggy.PluginManager` holding just that plugin, so a
``firstresult`` hook answers for exactly one dialect and unimplemented hooks fall back to
the generic behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from pyharvest.core.errors import BindingError
from pyharvest.plugins import hookspecs
from pyharvest.plugins.api.capabilities import Capabilities, find_capabilities_with
from pyharvest.plugins.api.ddl import create_table_ddl
from pyharvest.plugins.api.marking import MarkStrategy
from pyharvest.plugins.api.options import DialectOptions
from pyharvest.plugins.api.shards import expression_index_ddl, shard_column_filter
from pyharvest.plugins.api.table import NATIVE, OutboxTable
from pyharvest.plugins.api.upsert import UpsertFromSelect, compile_merges_as

if TYPE_CHECKING:
    import sqlalchemy as sa

    from pyharvest.plugins.api.bulk import BulkWriter
    from pyharvest.plugins.api.horizon import CleanupHorizon
    from pyharvest.plugins.api.identifiers import TableName
    from pyharvest.plugins.api.locks import LockHolder
    from pyharvest.plugins.api.notify import ListenerFactory

__all__ = ["ENTRY_POINT_GROUP", "Dialect", "dialect_for_backend", "dialect_of", "installed_dialects", "load_dialect"]

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
        options = self._hook.pyharvest_dialect()
        if not isinstance(options, DialectOptions):
            raise BindingError(
                f"dialect plugin {getattr(plugin, '__name__', plugin)!r}: pyharvest_dialect() returned "
                f"{type(options).__name__}, expected pyharvest.plugins.api.DialectOptions"
            )
        if options.name != name:
            raise BindingError(
                f"dialect plugin {getattr(plugin, '__name__', plugin)!r} is registered as {name!r} "
                f"but pyharvest_dialect() names {options.name!r}; they must match"
            )
        if not isinstance(options.capabilities, Capabilities):
            raise BindingError(
                f"dialect {name!r}: DialectOptions.capabilities is {type(options.capabilities).__name__}, "
                "expected pyharvest.plugins.api.Capabilities"
            )
        #: What the plugin declares (:class:`~pyharvest.plugins.api.DialectOptions`).
        self.options = options
        #: What the database can do; asked instead of its name.
        self.capabilities: Capabilities = options.capabilities
        if options.merge is not None:
            compile_merges_as(self.sqlalchemy_dialect().name, options.merge)

    def __repr__(self) -> str:
        return f"Dialect({self.name!r}, {getattr(self.plugin, '__name__', self.plugin)!r})"

    def url_backends(self) -> Sequence[str]:
        return self.options.backends()

    def sqlalchemy_dialect(self) -> sa.Dialect:
        """An SQLAlchemy dialect of this database, with no connection: to compile statements
        for review (``reaper schema --statements``) and the conformance kit's compiled checks."""
        import sqlalchemy as sa

        for backend in self.options.backends():
            try:
                return sa.make_url(f"{backend}://").get_dialect()()
            except sa.exc.NoSuchModuleError:
                continue
        raise BindingError(
            f"dialect {self.name!r} names no SQLAlchemy backend (DialectOptions.url_backends) "
            "to compile its statements with"
        )

    def url_hint(self, backend: str) -> str | None:
        hint: str | None = self._hook.pyharvest_url_hint(backend=backend)
        return hint

    def normalize_data_source(self, data_source: str) -> str | None:
        result: str | None = self._hook.pyharvest_normalize_data_source(data_source=data_source)
        return result

    def engine_options(self, url: sa.URL) -> dict[str, Any]:
        return dict(self._hook.pyharvest_engine_options(url=url) or {})

    def on_connect(self, dbapi_connection: Any, url: sa.URL) -> None:
        self._hook.pyharvest_on_connect(dbapi_connection=dbapi_connection, url=url)

    def configure_engine(self, engine: sa.Engine) -> None:
        self._hook.pyharvest_configure_engine(engine=engine)

    def cleanup_horizon(self, connection: sa.Connection) -> CleanupHorizon | None:
        """Who holds the database's clean-up back, and for how long; None where it does not say."""
        horizon: CleanupHorizon | None = self._hook.pyharvest_cleanup_horizon(connection=connection)
        return horizon

    def lock_timeout_statements(self, seconds: float) -> list[str]:
        """What bounds a session's wait for locks to ``seconds``; [] where nothing can."""
        return list(self._hook.pyharvest_lock_timeout_statements(seconds=seconds) or ())

    def lock_holders(self, connection: sa.Connection, table: TableName, older_than: float) -> list[LockHolder]:
        """The sessions that hold locks on ``table``, most suspect first; [] where the
        database does not say."""
        return list(self._hook.pyharvest_lock_holders(connection=connection, table=table, older_than=older_than) or ())

    def table_layouts(self) -> Sequence[str]:
        """The table layouts the dialect harvests: those it describes, by default ``native``."""
        return tuple(self.options.tables) or (NATIVE,)

    def detect_layout(self, columns: Mapping[str, Any]) -> str | None:
        result: str | None = self._hook.pyharvest_detect_layout(columns=columns)
        return result

    def outbox_ddl(self, table: OutboxTable) -> list[str]:
        """The statements that create ``table``: the dialect's own, or its ``CREATE TABLE``
        compiled from the table's description and the options it declares for the layout."""
        ddl = self._hook.pyharvest_outbox_ddl(table=table)
        if ddl is None:
            options = self.options.tables.get(table.layout)
            if options is None:
                raise BindingError(f"dialect {self.name!r} cannot create an outbox table of layout {table.layout!r}")
            ddl = [create_table_ddl(table, self.sqlalchemy_dialect(), options)]
        return list(ddl)

    def mark_strategy(self, table: OutboxTable) -> MarkStrategy:
        strategy: MarkStrategy | None = self._hook.pyharvest_mark_strategy(table=table)
        if strategy is None:
            strategy = self.options.mark.strategy(table)
        if not isinstance(strategy, MarkStrategy):
            raise BindingError(
                f"dialect {self.name!r}: pyharvest_mark_strategy() returned {type(strategy).__name__}, which lacks "
                "mark(connection, leader_id, limit) or statements(limit)"
            )
        return strategy

    def list_filter(self, column: sa.ColumnElement[Any], name: str = "ids") -> sa.ColumnElement[bool]:
        """``column`` equals one of a list bound as ``name``; bind at most
        ``capabilities.list_limit`` values per execution."""
        clause: sa.ColumnElement[bool] | None = self._hook.pyharvest_list_filter(column=column, name=name)
        if clause is None:
            import sqlalchemy as sa

            clause = column.in_(sa.bindparam(name, expanding=True))
        return clause

    def bulk_writer(
        self, connection: sa.Connection, table: sa.Table, columns: Sequence[str], *, exact_types: bool = False
    ) -> BulkWriter | None:
        writer: BulkWriter | None = self._hook.pyharvest_bulk_writer(
            connection=connection, table=table, columns=columns, exact_types=exact_types
        )
        return writer

    def shard_filter(self, source: sa.FromClause, shards: int, shard: int) -> sa.ColumnElement[bool]:
        """The rows of ``source`` in ``shard`` of ``shards``."""
        clause: sa.ColumnElement[bool] | None = self._hook.pyharvest_shard_filter(
            source=source, shards=shards, shard=shard
        )
        if clause is None:
            if self.options.shard_column:
                clause = shard_column_filter(shards, shard)
            else:
                clause = shard_expression(source, shards) == _literal(shard)
        return clause

    def shard_ddl(self, table: OutboxTable, shards: int, index: str) -> list[str]:
        """What the shard filter needs to read one shard through an index."""
        ddl = self._hook.pyharvest_shard_ddl(table=table, shards=shards, index=index)
        if ddl is None:
            ddl = [expression_index_ddl(self.sqlalchemy_dialect().identifier_preparer, table, shards, index)]
        return list(ddl)

    def key_hash_guard(self, table: OutboxTable, name: str) -> list[str]:
        """What makes the database refuse new rows without a key hash (constraint or trigger ``name``)."""
        ddl = self._hook.pyharvest_key_hash_guard(table=table, name=name)
        if ddl is None:
            try:
                preparer = self.sqlalchemy_dialect().identifier_preparer
            except BindingError:  # no SQLAlchemy backend named: the SQL standard's quoting
                from sqlalchemy.engine.default import DefaultDialect

                preparer = DefaultDialect().identifier_preparer
            ddl = [
                f"ALTER TABLE {table.name.quoted(preparer)} ADD CONSTRAINT {preparer.quote(name)} "
                "CHECK (kafka_key_hash IS NOT NULL)"
            ]
        return list(ddl)

    def index_names(self, connection: sa.Connection, table: TableName) -> set[str]:
        """The lower-cased names of ``table``'s indexes."""
        names: Collection[str] | None = self._hook.pyharvest_index_names(connection=connection, table=table)
        if names is None:
            import warnings

            import sqlalchemy as sa

            with warnings.catch_warnings():
                # Expression indexes some backends cannot reflect (their plugin names them instead).
                warnings.simplefilter("ignore", sa.exc.SAWarning)
                indexes = sa.inspect(connection).get_indexes(table.name, schema=table.schema)
            names = [ix.get("name") or "" for ix in indexes]
        return {n.lower() for n in names}

    def insert_new_keys(
        self,
        connection: sa.Connection,
        table: sa.Table,
        key_column: str,
        keys: Sequence[Any],
        values: Mapping[str, Any],
    ) -> Collection[Any] | None:
        """Insert the rows of the ``keys`` ``table`` does not hold yet and return the keys that
        were there already; None where the dialect has no way of its own (then look the keys up
        with :meth:`list_filter` and bulk-insert the others)."""
        present: Collection[Any] | None = self._hook.pyharvest_insert_new_keys(
            connection=connection, table=table, key_column=key_column, keys=keys, values=values
        )
        return present

    def upsert_from_select(
        self, target: sa.Table, source: sa.Select[Any], keys: Sequence[str], order: Sequence[sa.ColumnElement[Any]]
    ) -> sa.Executable | None:
        """Insert ``source``'s rows into ``target``, updating those whose ``keys`` exist (the
        last in ``order`` wins among rows sharing keys); None when the database has no upsert."""
        statement: sa.Executable | None = self._hook.pyharvest_upsert_from_select(
            target=target, source=source, keys=keys, order=order
        )
        if statement is None and self.options.merge is not None:
            statement = UpsertFromSelect(target, source, keys, order)
        return statement

    def staging_table(self, table: sa.Table) -> sa.Table:
        """The table to create for rows that live until a job commits: the dialect's variant
        of ``table`` (e.g. unlogged), or ``table`` itself."""
        staged: sa.Table | None = self._hook.pyharvest_staging_table(table=table)
        return table if staged is None else staged

    def bulk_move_statements(self) -> list[str]:
        """Statements that tune one transaction copying many rows in order (may be none)."""
        return list(self._hook.pyharvest_bulk_move_statements() or ())

    def notify_statement(self, table: TableName) -> sa.Executable | None:
        """What a writer runs in its transaction to wake the harvesters of ``table`` on commit;
        None where the database cannot."""
        statement: sa.Executable | None = self._hook.pyharvest_notify_statement(table=table)
        return statement

    def listener(self, engine: sa.Engine, table: TableName) -> ListenerFactory | None:
        """Opens a connection listening for ``table``'s notifications; None where the database
        or driver cannot."""
        factory: ListenerFactory | None = self._hook.pyharvest_listener(engine=engine, table=table)
        return factory


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
        try:
            dialect = Dialect(name, plugin)
        except pluggy.PluginValidationError as e:  # a hook this version does not know
            raise BindingError(f"dialect {name!r} ({ep.value}) is not a plugin this pyharvest can load: {e}") from e
        _loaded[name] = dialect
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
    for name in sorted(installed):
        try:
            hint = load_dialect(name).url_hint(backend)
        except BindingError:
            continue
        if hint:
            raise BindingError(f"no installed pyharvest dialect serves SQLAlchemy backend {backend!r}: {hint}")
    raise BindingError(
        f"no installed pyharvest dialect serves SQLAlchemy backend {backend!r}; installed dialects: "
        f"{', '.join(sorted(installed)) or '(none)'}. Name one explicitly (binding / --binding)"
    )


_by_backend: dict[str, Dialect | None] = {}


def _capabilities_of(backend: str) -> Capabilities | None:
    try:
        return load_dialect(dialect_for_backend(backend)).capabilities
    except BindingError:
        return None  # no installed dialect serves it: the defaults (naive UTC is always safe)


find_capabilities_with(_capabilities_of)


def dialect_of(database: sa.Connection | sa.Engine | sa.Dialect) -> Dialect | None:
    """The installed dialect serving a SQLAlchemy connection's, engine's or dialect's database,
    or None. Remembered per backend: callers ask on every statement they prepare."""
    sa_dialect: sa.Dialect = database if not hasattr(database, "dialect") else database.dialect
    backend: str = sa_dialect.name
    try:
        return _by_backend[backend]
    except KeyError:
        pass
    try:
        found: Dialect | None = load_dialect(dialect_for_backend(backend))
    except BindingError:
        found = None
    _by_backend[backend] = found
    return found


def _literal(n: int) -> sa.ColumnElement[int]:
    import sqlalchemy as sa

    # int(): only a number reaches the SQL; a literal, so an expression index can match it.
    return sa.literal_column(str(int(n)), sa.Integer)


def shard_expression(source: sa.FromClause, shards: int) -> sa.ColumnElement[int]:
    """``COALESCE(kafka_key_hash, 0) % shards`` on ``source``: the default shard of a row."""
    import sqlalchemy as sa

    return sa.func.coalesce(source.c.kafka_key_hash, _literal(0)) % _literal(shards)
