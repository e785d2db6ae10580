"""The hooks a dialect plugin may implement: this module is the plugin API's reference.

One hook is required, :func:`pyharvest_dialect`: the plugin's declarations as data
(:class:`~pyharvest.plugins.api.DialectOptions`: its name and backends, its capabilities, how
its outbox table is created, how it marks, where it keeps a row's shard, how it spells an
upsert). Every other hook is optional: a plugin implements only what its database does in
code of its own, beyond what it declares; the generic behaviour works on any SQLAlchemy
dialect that supports ``SELECT … FOR UPDATE`` (or serialises writers, like SQLite). Hooks
that answer a question are ``firstresult`` (the plugin's answer, or None for the default);
the two that act on an engine or a connection (:func:`pyharvest_on_connect`,
:func:`pyharvest_configure_engine`) are plain hooks, called for their effect. Each dialect is
loaded into its own plugin manager, so hooks never mix between dialects.

What the hooks take and return (the outbox table, the mark builder, bulk writers,
capabilities) lives in :mod:`pyharvest.plugins.api`, the one module a plugin imports.
Hook names carry the ``pyharvest_`` prefix so that a module can hold unrelated functions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import sqlalchemy as sa

    from pyharvest.plugins.api.bulk import BulkWriter
    from pyharvest.plugins.api.horizon import CleanupHorizon
    from pyharvest.plugins.api.identifiers import TableName
    from pyharvest.plugins.api.locks import LockHolder
    from pyharvest.plugins.api.marking import MarkStrategy
    from pyharvest.plugins.api.notify import ListenerFactory
    from pyharvest.plugins.api.options import DialectOptions
    from pyharvest.plugins.api.table import OutboxTable

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

PROJECT_NAME = "pyharvest"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec(firstresult=True)
def pyharvest_dialect() -> DialectOptions:  # type: ignore[empty-body]
    """The dialect's declarations (:class:`~pyharvest.plugins.api.DialectOptions`), its name
    the same as its entry-point name. Required."""


@hookspec(firstresult=True)
def pyharvest_url_hint(backend: str) -> str | None:
    """What to write instead of a URL scheme no dialect serves, when ``backend`` (its SQLAlchemy
    backend name) is a common misspelling of this dialect's: e.g. PostgreSQL's answer for
    ``postgres``. None when ``backend`` means nothing to this dialect."""


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


# --- A shared database's bad day: the clean-up horizon (pyharvest.plugins.api.horizon) and ------
# --- locks other sessions hold (pyharvest.plugins.api.locks) ---------------------------------------


@hookspec(firstresult=True)
def pyharvest_cleanup_horizon(connection: sa.Connection) -> CleanupHorizon | None:
    """The oldest snapshot for which the database keeps the outbox's dead rows, and who holds
    it (a ``CleanupHorizon`` with no holder when nothing old is held); read every
    ``metrics.ageInterval``, so one cheap query. None: the database does not say."""


@hookspec(firstresult=True)
def pyharvest_lock_timeout_statements(seconds: float) -> Sequence[str] | None:
    """Session statements, run on every connection of the harvester's engine, after which any
    of its statements waits at most ``seconds`` for a lock another session holds, then fails
    with one of ``Capabilities.lock_timeout_errors``; PostgreSQL: ``SET lock_timeout``. None:
    the database cannot bound the wait (its own timeout, if any, applies)."""


@hookspec(firstresult=True)
def pyharvest_lock_holders(
    connection: sa.Connection, table: TableName, older_than: float
) -> Sequence[LockHolder] | None:
    """The other sessions that hold locks on ``table`` (or, where the database cannot tell
    locks by table, whose transactions have been open at least ``older_than`` seconds), most
    suspect first: what the error of a statement that waited too long names. None: the
    database does not say."""


@hookspec(firstresult=True)
def pyharvest_outbox_ddl(table: OutboxTable) -> Sequence[str] | None:
    """The statements that create ``table`` (outbox table plus any index the mark needs),
    idempotent where the database allows (``IF NOT EXISTS``), for a dialect whose table the
    declared ``DialectOptions.tables`` cannot describe. ``table.layout`` says which layout to
    create; None: the declared options' ``CREATE TABLE`` for it, if any."""


@hookspec(firstresult=True)
def pyharvest_detect_layout(columns: Mapping[str, Any]) -> str | None:
    """Name the layout of an existing table from its columns (lower-case name → SQLAlchemy
    reflected column dict), or None to let the binding assume ``"native"``."""


@hookspec(firstresult=True)
def pyharvest_mark_strategy(table: OutboxTable) -> MarkStrategy | None:
    """How to mark: a strategy of :mod:`pyharvest.plugins.api` built on
    :class:`~pyharvest.plugins.api.MarkQuery`, which applies every row filter of ``table``
    (the quarantine's, and any added later) and the order by id. None: the strategy the
    declared ``DialectOptions.mark`` describes (by default the generic
    :class:`~pyharvest.plugins.api.TransactionalMark`). The conformance kit compiles what the
    strategy runs and checks the row choice."""


@hookspec(firstresult=True)
def pyharvest_list_filter(column: sa.ColumnElement[Any], name: str) -> sa.ColumnElement[bool] | None:
    """A ``WHERE`` clause: ``column`` equals one of a list bound as parameter ``name``. Used
    by purge and reset (``ids``), and by the inbox's and Spark's look-ups. Default
    ``column IN (expanding :name)``, given at most ``Capabilities.list_limit`` values.
    PostgreSQL binds one array instead (``= ANY(:name)``), keeping one cached statement for
    every list length."""


@hookspec(firstresult=True)
def pyharvest_bulk_writer(
    connection: sa.Connection, table: sa.Table, columns: Sequence[str], exact_types: bool
) -> BulkWriter | None:
    """A faster way than ``executemany`` to insert many rows of ``columns`` into ``table``
    (PostgreSQL: ``COPY``), or None where the driver or the table does not allow it. Used by
    the stasher (the outbox), the inbox (dedupe identities) and Spark. ``exact_types``: the
    database's columns have exactly ``table``'s types (pyharvest created the table), so a
    binary protocol may be used. Asked once per engine and table, on one of the
    application's connections inside its transaction (so any look-up must only read); the
    caller caches the answer. A None is asked again after an ``INSERT`` into the table
    fails: it may have come from a table not yet created."""


@hookspec(firstresult=True)
def pyharvest_shard_filter(source: sa.FromClause, shards: int, shard: int) -> sa.ColumnElement[bool] | None:
    """The rows of ``source`` (the outbox, or the alias a mark selects from) in ``shard`` of
    ``shards``: by the stored key hash, ``COALESCE(kafka_key_hash, 0) % shards = shard`` by
    default (a row without a hash is in shard 0), or the generated column's value where the
    dialect declares ``DialectOptions.shard_column``. It must match what
    :func:`pyharvest_shard_ddl` indexes, so that a shard's mark reads only its own rows."""


@hookspec(firstresult=True)
def pyharvest_shard_ddl(table: OutboxTable, shards: int, index: str) -> Sequence[str] | None:
    """The statements that let :func:`pyharvest_shard_filter` read one shard's rows in id
    order through an index named ``index`` (an expression index, or a generated column and an
    index on it). Run once, by ``reaper init-db --shards N``, when no index of that name exists.
    Default: ``CREATE INDEX index ON table ((COALESCE(kafka_key_hash, 0) % shards), id)``."""

@hookspec(firstresult=True)
def pyharvest_key_hash_guard(table: OutboxTable, name: str) -> Sequence[str] | None:
    """The statements that make the database refuse, from now on, a new row of ``table``
    without a ``kafka_key_hash``, leaving the rows already there unchecked (``reaper init-db
    --shards N`` fills them in next). ``name`` names the constraint or trigger, and the
    refusal's message must contain it: that is how a stasher recognises the refusal (and
    rereads the table). Why: a writer that read the table before it had the column would go
    on writing rows without a hash, which the shard filter puts in shard 0 while the key's
    other rows sit in their own shard, published by another leader. Run by ``init-db --shards``
    when a probe shows such a row is still accepted. Default: ``ALTER TABLE … ADD CONSTRAINT
    name CHECK (kafka_key_hash IS NOT NULL)`` (most databases check existing rows too; it is
    retried after filling them in)."""


@hookspec(firstresult=True)
def pyharvest_index_names(connection: sa.Connection, table: TableName) -> Collection[str] | None:
    """The names of ``table``'s indexes, where SQLAlchemy's reflection misses some (SQLite's
    expression indexes); None: reflection sees them all. Tells whether the shard index exists."""


# --- Push wake-ups: an idle harvester woken by the writer's commit ---------------------------


@hookspec(firstresult=True)
def pyharvest_notify_statement(table: TableName) -> sa.Executable | None:
    """A statement that, run in a writer's transaction, wakes the harvesters listening on
    ``table`` (:func:`pyharvest_listener`) when that transaction commits, and not at all if it
    rolls back; PostgreSQL: ``SELECT pg_notify(channel, '')``. The stasher runs it at most once
    per transaction, and not on every one (see :mod:`pyharvest.stasher.notify`). None: the database
    cannot; the harvester finds the rows by polling (``maxMarkBackoff``)."""


@hookspec(firstresult=True)
def pyharvest_listener(engine: sa.Engine, table: TableName) -> ListenerFactory | None:
    """How to open a dedicated connection of ``engine`` that listens for
    :func:`pyharvest_notify_statement`'s notifications on ``table``: a function the binding
    calls to connect, and again to reconnect after a failure. It must open a connection of
    its own (not one the pool hands to marks), and must answer without connecting. The same
    ``table`` must give the same channel whether or not it is schema-qualified, as the stasher
    and the harvester may name it differently. None: the database or driver cannot listen."""


# --- Writing many rows: the inbox's and Spark's database differences ----------------------


@hookspec(firstresult=True)
def pyharvest_insert_new_keys(
    connection: sa.Connection, table: sa.Table, key_column: str, keys: Sequence[Any], values: Mapping[str, Any]
) -> Collection[Any] | None:
    """Remember ``keys``: in the caller's transaction, insert the row ``{key_column: k,
    **values}`` for each of ``keys`` (distinct) whose primary key ``table`` does not hold yet,
    and return the keys it did not insert, those already there (usually none, so the answer
    stays small). ``table``'s primary key is ``key_column`` plus columns of ``values`` (the
    exactly-once sink's: the sink's name and the identity). The other columns of ``values``
    must differ from every earlier call's, so that a dialect may tell the rows it inserted
    from those already there after the insert, a look-up less; a caller that makes several
    calls with the same ``values`` passes no key twice. The sink's time is the batch's plus the
    task attempt's id in microseconds; a task's later calls pass only identities new to its
    partition.
    None: the generic way, which every dialect gets: look the keys up with
    :func:`pyharvest_list_filter`, then insert the others with the bulk writer. PostgreSQL
    copies the keys into a temporary table and inserts with ``ON CONFLICT DO NOTHING``: one
    ``COPY`` and one statement, whatever the number of keys."""


@hookspec(firstresult=True)
def pyharvest_upsert_from_select(
    target: sa.Table, source: sa.Select[Any], keys: Sequence[str], order: Sequence[sa.ColumnElement[Any]]
) -> sa.Executable | None:
    """An upsert: insert the rows of ``source`` into ``target``, except that a row whose
    ``keys`` match a row of ``target`` updates that row's other columns instead. ``source``
    selects exactly ``target``'s columns, in order and by name, without an ``ORDER BY``;
    several of its rows may share keys, and then the last in ``order`` wins (the Spark writer's
    rows mode: ``target_key_columns``). Build it with SQLAlchemy constructs where they exist
    (``sqlalchemy.dialects.postgresql.insert(...).on_conflict_do_update``, MySQL's
    ``on_duplicate_key_update``); a ``MERGE`` must first keep each key's last row (``ROW_NUMBER()``),
    since it may not touch a target row twice. None: a ``MERGE`` where the dialect declares
    ``DialectOptions.merge``, else the database has no upsert (the caller says so)."""


@hookspec(firstresult=True)
def pyharvest_staging_table(table: sa.Table) -> sa.Table | None:
    """The table to create in place of ``table`` for rows that live only until a job commits
    (the Spark writer's per-job staging tables): same name, columns and types, with whatever
    makes writing them cheaper, e.g. ``prefixes=["UNLOGGED"]`` (no write-ahead log; a crash
    empties the table, which the job's commit notices). ``table``'s indexes only serve reading
    the rows back in order: a dialect that sorts faster than it maintains an index may leave
    them out. None: create ``table`` as it is."""


@hookspec(firstresult=True)
def pyharvest_bulk_move_statements() -> Sequence[str] | None:
    """Statements run first in a transaction that copies many rows from table to table in
    order (the Spark writer's commit, ``INSERT … SELECT … ORDER BY`` out of its staging
    tables), to tune that transaction alone (PostgreSQL: ``SET LOCAL work_mem``, so that the
    sort stays in memory). Their effect must end with the transaction or the connection
    (the caller does not reuse it). None: nothing to run."""
