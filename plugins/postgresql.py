"""PostgreSQL (9.5+), through psycopg 3.

Mark: one ``UPDATE … WHERE id IN (SELECT id … ORDER BY id LIMIT n FOR UPDATE) RETURNING …``.
Harvests both the native layout and goharvest's own table (``TEXT[]`` headers, ``UUID``
leader id), recognised from the columns. Accepts goharvest's libpq ``key=value`` data
sources. The outer update matches ``id = ANY(ARRAY(SELECT …))`` so that it, too, probes the
primary key rather than hash-joining a full scan. Server-side prepared statements are off
(``prepare_threshold=None``) and the mark's ``LIMIT`` is a literal, so the planner always sees
the real limit and walks the primary key instead of settling on a generic plan that scans and
sorts the table. A filtered mark (a shard's, or one skipping quarantined keys) forbids sorts for
its transaction (``SET LOCAL enable_sort = off``), so that stale statistics cannot make it sort
a whole shard instead of walking the shard index.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from pyharvest.plugins.api import (
    GOHARVEST,
    NATIVE,
    BulkWriter,
    Capabilities,
    DialectOptions,
    ListenerFactory,
    MarkQuery,
    MarkStrategy,
    OutboxTable,
    ReturningMark,
    TableName,
    TableOptions,
    begin_if_needed,
    expression_index_ddl,
    hookimpl,
    libpq_to_url,
    raise_as_sqlalchemy_error,
)

# What the server's activity views say of the other sessions (a shared database's bad day), in
# a module of its own: imported here, these hooks are this plugin's (pluggy registers every
# hook implementation the module holds).
from pyharvest.plugins.postgresql_activity import (
    pyharvest_cleanup_horizon,
    pyharvest_lock_holders,
    pyharvest_lock_timeout_statements,
)

__all__ = ["pyharvest_cleanup_horizon", "pyharvest_lock_holders", "pyharvest_lock_timeout_statements"]

_preparer = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]  # SQLAlchemy's dialect __init__ is unannotated

# The primary key is the only index the mark needs: it walks ids in order. Half-empty pages let
# the mark's UPDATE stay on the page (a HOT update: no new index entry), which made a 500-row
# mark ~6x cheaper in measurement; rows are transient, so the space is cheap.
# Autovacuum unthrottled on this table: at 10,000 records/s the default cost delay (2 ms) made
# each vacuum of the outbox take ~30 s, the dead rows piled up ahead of the oldest live ones,
# and every other minute the marks read 45,000-90,000 pages instead of ~200 and the relay fell
# behind by 100,000 records (the 60-minute soak in docs/performance.md). The table holds
# little that is live, so an unthrottled vacuum of it is short.
_NATIVE_DDL = TableOptions(
    identity=sa.Identity(),
    table_kwargs={"postgresql_with": {"fillfactor": 50, "autovacuum_vacuum_cost_delay": 0}},
)

DIALECT = DialectOptions(
    name="postgresql",
    capabilities=Capabilities(
        aware_timestamps=True, transactional_ddl=True, list_limit=None, schema_usage=True, serial_sequences=True,
        privilege_errors=("42501",),
        lock_timeout_errors=("55P03",),  # lock_not_available: lock_timeout ran out
        driver_packages=(
            ("psycopg", "pyharvest[postgresql]"), ("psycopg2", "psycopg2-binary"), ("asyncpg", "asyncpg"),
            ("pg8000", "pg8000"),
        ),
    ),
    # goharvest's table as goharvest creates it: BIGSERIAL ids, header arrays, a UUID leader id.
    tables={NATIVE: _NATIVE_DDL, GOHARVEST: TableOptions()},
)


@hookimpl
def pyharvest_dialect() -> DialectOptions:
    return DIALECT


@hookimpl
def pyharvest_url_hint(backend: str) -> str | None:
    # libpq and Heroku-style URLs say postgres://; SQLAlchemy dropped that name in 1.4.
    if backend == "postgres":
        return (
            "write the URL as postgresql+psycopg://user:password@host:5432/database "
            "(SQLAlchemy has no 'postgres' scheme)"
        )
    return None


@hookimpl
def pyharvest_normalize_data_source(data_source: str) -> str:
    return libpq_to_url(data_source)


@hookimpl
def pyharvest_engine_options(url: sa.URL) -> Mapping[str, Any]:
    if url.get_dialect().driver == "psycopg":
        return {"connect_args": {"prepare_threshold": None}}
    return {}


@hookimpl
def pyharvest_on_connect(dbapi_connection: Any, url: sa.URL) -> None:
    # Timestamps come back aware either way; under the name "UTC" psycopg parses them on a fast
    # path, more than twice as fast as under "Etc/UTC" (the usual server default): a mark
    # returns a create_time per row. Only the harvester's own sessions are touched.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET TIME ZONE 'UTC'")
    finally:
        cursor.close()
    dbapi_connection.commit()


@hookimpl
def pyharvest_detect_layout(columns: Mapping[str, Any]) -> str | None:
    if "kafka_header_keys" in columns and "kafka_header_values" in columns:
        return GOHARVEST
    return None


def _id_in_array(id_column: sa.Column[Any], oldest: sa.Select[Any]) -> sa.ColumnElement[bool]:
    # ``id = ANY(ARRAY(SELECT …))``: the planner probes the primary key per id. With
    # ``id IN (SELECT …)`` it may choose a hash semi-join that scans the whole table.
    return id_column == sa.any_(sa.func.array(oldest.scalar_subquery()))


# A filtered mark (a shard's, or skipping quarantined keys) must walk an index in id order and
# stop at its limit. Statistics taken while the table was nearly empty (the usual state of an
# outbox) make the planner expect a few hundred rows and prefer a bitmap scan that sorts all of
# them: on a 200,000-row burst, a shard's mark sorted its 100,000 rows, 80 ms instead of 2.6 ms,
# for every 1,000 marked, until autovacuum's next ANALYZE. Forbidding the sort, for the mark's
# transaction only, leaves the shard index's ordered walk as the plan.
_NO_SORT = sa.text("SET LOCAL enable_sort = off")


@hookimpl
def pyharvest_mark_strategy(table: OutboxTable) -> MarkStrategy:
    return ReturningMark(MarkQuery(table, match_ids=_id_in_array), prelude=(_NO_SORT,) if table.filters else ())


class _IdArrayLiteral(sa.types.TypeDecorator[Sequence[int]]):
    """A list of ids sent as one ``'{1,2,3}'`` text parameter and cast to ``BIGINT[]`` by the
    server: the drivers' list adapters build the array element by element in Python, which
    was most of a purge's client-side cost."""

    # No type of its own: a typed string would be rendered ``%(ids)s::VARCHAR`` inside the cast.
    impl = sa.types.NullType
    cache_ok = True

    def process_bind_param(self, value: Sequence[int] | None, dialect: Any) -> str | None:
        if value is None:
            return None
        # int() per id: only digits and signs can reach the literal.
        return "{" + ",".join(map(str, map(int, value))) + "}"


@hookimpl
def pyharvest_list_filter(column: sa.ColumnElement[Any], name: str) -> sa.ColumnElement[bool]:
    # One array parameter: a single cached statement serves every list length.
    values: sa.ColumnElement[Any]
    if isinstance(column.type, sa.Integer):
        values = sa.cast(sa.bindparam(name, type_=_IdArrayLiteral()), postgresql.ARRAY(sa.BigInteger))
    else:
        values = sa.bindparam(name, type_=postgresql.ARRAY(column.type))
    return column == sa.any_(values)


# COPY costs a round trip more than an INSERT: measured, it overtakes executemany at about
# 15 rows and needs a third of its client CPU at 100.
COPY_MIN_ROWS = 16
# Plain and partitioned tables. COPY cannot write through a view, does not apply rules, and
# refuses tables with row-level security: those keep the INSERT.
_COPYABLE_KINDS = ("r", "p")
_COPYABLE = sa.text(
    "SELECT c.relkind, c.relrowsecurity, c.relhasrules FROM pg_catalog.pg_class c WHERE c.oid = to_regclass(:name)"
)


def _binary_type(column_type: sa.types.TypeEngine[Any]) -> str | None:
    """The PostgreSQL type name binary ``COPY`` sends for a column of this SQLAlchemy type, or
    None when there is no safe one (then the text format is used)."""
    if isinstance(column_type, sa.types.TypeDecorator):
        column_type = column_type.impl_instance
    if isinstance(column_type, sa.ARRAY):
        item = _binary_type(column_type.item_type)
        return None if item is None else item + "[]"
    for kind, name in _BINARY_TYPES:
        if isinstance(column_type, kind):
            if name == "timestamp" and getattr(column_type, "timezone", False):
                return "timestamptz"
            return name
    return None


# Most specific first: BigInteger is an Integer, Text a String.
_BINARY_TYPES: tuple[tuple[type[sa.types.TypeEngine[Any]], str], ...] = (
    (sa.BigInteger, "int8"),
    (sa.SmallInteger, "int2"),
    (sa.Integer, "int4"),
    (sa.Boolean, "bool"),
    (sa.String, "text"),
    (sa.LargeBinary, "bytea"),
    (sa.DateTime, "timestamp"),
    (sa.Uuid, "uuid"),
)


class CopyWriter:
    """Inserts a batch with ``COPY … FROM STDIN`` on the caller's psycopg connection, in the
    caller's transaction; in the binary format where the table's column types are exact."""

    min_rows = COPY_MIN_ROWS

    def __init__(self, table: sa.Table, columns: Sequence[str], exact_types: bool) -> None:
        name = _preparer.format_table(table)
        self.types: list[str] | None = None
        if exact_types:
            types = [_binary_type(table.c[c].type) for c in columns]
            if all(types):
                self.types = [t for t in types if t]
        fmt = " (FORMAT BINARY)" if self.types else ""
        self.statement = f"COPY {name} ({', '.join(_preparer.quote(c) for c in columns)}) FROM STDIN{fmt}"

    def __call__(self, connection: sa.Connection, rows: Iterable[Sequence[Any]]) -> bool:
        driver = connection.connection.driver_connection
        if driver is None or driver.pgconn.pipeline_status:
            return False  # psycopg refuses COPY in pipeline mode
        begin_if_needed(connection)
        cursor = driver.cursor()
        try:
            with cursor.copy(self.statement) as copy:
                if self.types:
                    copy.set_types(self.types)
                write = copy.write_row
                for row in rows:
                    write(row)
        except Exception as e:  # noqa: BLE001 - re-raised as SQLAlchemy would
            raise_as_sqlalchemy_error(connection, e, self.statement, cursor)
        finally:
            cursor.close()
        return True


@hookimpl
def pyharvest_bulk_writer(
    connection: sa.Connection, table: sa.Table, columns: Sequence[str], exact_types: bool
) -> BulkWriter | None:
    if connection.dialect.driver != "psycopg":
        return None  # COPY through psycopg 3 only; other drivers keep executemany
    found = connection.execute(_COPYABLE, {"name": _preparer.format_table(table)}).first()
    if found is None:
        return None  # no such table: let the INSERT raise its usual error
    kind, row_security, rules = found
    if kind not in _COPYABLE_KINDS or row_security or rules:
        return None
    return CopyWriter(table, columns, exact_types)


@hookimpl
def pyharvest_shard_ddl(table: OutboxTable, shards: int, index: str) -> Sequence[str]:
    # The expression is the default shard filter's, so the planner matches it to this index.
    return [expression_index_ddl(_preparer, table, shards, index, if_not_exists=True)]


@hookimpl
def pyharvest_key_hash_guard(table: OutboxTable, name: str) -> Sequence[str]:
    # NOT VALID: new rows are checked at once, existing ones are left for init-db to fill in.
    return [
        f"ALTER TABLE {table.name.quoted(_preparer)} ADD CONSTRAINT {_preparer.quote(name)} "
        "CHECK (kafka_key_hash IS NOT NULL) NOT VALID"
    ]


@hookimpl
def pyharvest_insert_new_keys(
    connection: sa.Connection, table: sa.Table, key_column: str, keys: Sequence[Any], values: Mapping[str, Any]
) -> Collection[Any] | None:
    # The keys go in with one COPY into a temporary table, then one INSERT … SELECT … ON
    # CONFLICT DO NOTHING: no look-up round trip, no array of keys built in Python.
    if connection.dialect.driver != "psycopg":
        return None  # COPY through psycopg 3 only; the generic look-up and insert otherwise
    key = table.c[key_column]
    key_type = _binary_type(key.type)
    if key_type is None or not key_type.isalnum():
        return None  # arrays and unmapped types: the generic way
    scratch = sa.Table(f"pyharvest_new_keys_{key_type}", sa.MetaData(), sa.Column("k", key.type))
    name = _preparer.format_table(scratch)
    # One round trip; the DELETE finds rows only after an earlier call in this transaction.
    connection.exec_driver_sql(
        f"CREATE TEMPORARY TABLE IF NOT EXISTS {name} (k {key_type}) ON COMMIT DELETE ROWS; DELETE FROM {name}"
    )
    if not CopyWriter(scratch, ["k"], exact_types=True)(connection, _OneColumn(keys)):
        return None  # pipeline mode: no COPY
    given = [sa.literal(v, table.c[c].type) for c, v in values.items()]
    primary = {c.name for c in table.primary_key.columns}
    scope = [table.c[c] == sa.literal(v, table.c[c].type) for c, v in values.items() if c in primary]
    # Rows inserted now carry exactly ``values``; those there before differ in a column
    # outside the key (the sink's time), so they can be found after the insert, and only when
    # some key was not inserted. Without such a column they are found before it.
    stamp = [table.c[c].is_distinct_from(sa.literal(v, table.c[c].type)) for c, v in values.items() if c not in primary]
    present_rows = sa.select(scratch.c.k).join(table, sa.and_(table.c[key_column] == scratch.c.k, *scope))
    present: set[Any] = set()
    if not stamp:
        present = set(connection.execute(present_rows).scalars())
    insert = postgresql.insert(table).from_select([key_column, *values], sa.select(scratch.c.k, *given))
    # preserve_rowcount: SQLAlchemy 2.0.28+ keeps an INSERT's row count only when asked.
    inserted = connection.execute(insert.on_conflict_do_nothing().execution_options(preserve_rowcount=True)).rowcount
    if stamp and inserted != len(keys):
        present = set(connection.execute(present_rows.where(sa.or_(*stamp))).scalars())
    return present


class _OneColumn(Sequence[tuple[Any]]):
    """``keys`` as one-column rows, made while COPY writes them (no list of tuples to build)."""

    __slots__ = ("_values",)

    def __init__(self, values: Sequence[Any]) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[tuple[Any]]:
        return ((v,) for v in self._values)

    @overload
    def __getitem__(self, index: int) -> tuple[Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[Any]]: ...
    def __getitem__(self, index: int | slice) -> tuple[Any] | Sequence[tuple[Any]]:
        if isinstance(index, slice):
            return [(v,) for v in self._values[index]]
        return (self._values[index],)


# --- Push wake-ups: LISTEN / NOTIFY ----------------------------------------------------------

#: Channel names are identifiers: at most 63 bytes (NAMEDATALEN - 1).
_CHANNEL_LENGTH = 63
_CHANNEL_PREFIX = "pyharvest_outbox."


def notify_channel(table: TableName) -> str:
    """The channel of an outbox's notifications. From the table's name alone, lower-cased, so
    that a writer naming ``app.outbox`` and a harvester naming ``outbox`` meet (same-named
    outboxes of other schemas share the channel: a spurious wake-up costs one empty mark). A
    name too long for a channel is cut and made unique again by a hash."""
    name = table.name.lower()
    channel = _CHANNEL_PREFIX + name
    if len(channel.encode()) <= _CHANNEL_LENGTH:
        return channel
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{_CHANNEL_PREFIX}{name[:32]}.{digest}"


@hookimpl
def pyharvest_notify_statement(table: TableName) -> sa.Executable:
    # pg_notify() takes the channel as a value: no quoting, and it matches the quoted LISTEN.
    return sa.text("SELECT pg_notify(:channel, '')").bindparams(channel=notify_channel(table))


class PsycopgListener:
    """A connection of the engine's, detached from its pool, in autocommit, listening on one
    channel (psycopg 3.2+: ``notifies(timeout=...)``)."""

    def __init__(self, engine: sa.Engine, channel: str) -> None:
        # The pool's creator makes it, so it gets the engine's connect arguments and session
        # settings; detached, it no longer counts against (or returns to) the pool.
        raw = engine.raw_connection()
        conn: Any = raw.driver_connection
        self._conn = conn
        raw.detach()
        try:
            self._conn.autocommit = True
            self._conn.execute(f"LISTEN {_preparer.quote_identifier(channel)}")
        except BaseException:
            self.close()
            raise

    def wait(self, timeout: float) -> bool:
        return any(True for _ in self._conn.notifies(timeout=timeout, stop_after=1))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # it may be dead already
            self._conn.close()


def _listens_with_timeout() -> bool:
    import psycopg

    return "timeout" in inspect.signature(psycopg.Connection.notifies).parameters


@hookimpl
def pyharvest_listener(engine: sa.Engine, table: TableName) -> ListenerFactory | None:
    if engine.dialect.driver != "psycopg" or not _listens_with_timeout():
        return None  # psycopg 3.2+ only; other drivers are polled
    channel = notify_channel(table)
    return lambda: PsycopgListener(engine, channel)


def _distinct_on(select: sa.Select[Any], columns: Sequence[sa.ColumnElement[Any]]) -> sa.Select[Any]:
    distinct_on = getattr(postgresql, "distinct_on", None)  # SQLAlchemy 2.1; 2.0 takes the columns in distinct()
    return select.ext(distinct_on(*columns)) if distinct_on is not None else select.distinct(*columns)


@hookimpl
def pyharvest_upsert_from_select(
    target: sa.Table, source: sa.Select[Any], keys: Sequence[str], order: Sequence[sa.ColumnElement[Any]]
) -> sa.Executable:
    # ON CONFLICT may not touch a row twice in one statement: keep each key's last row.
    key_columns = [source.selected_columns[k] for k in keys]
    latest = _distinct_on(source, key_columns).order_by(*key_columns, *(o.desc() for o in order))
    names = [c.name for c in source.selected_columns]
    insert = postgresql.insert(target).from_select(names, latest)
    others = [c for c in names if c not in keys]
    if not others:
        return insert.on_conflict_do_nothing(index_elements=list(keys))
    return insert.on_conflict_do_update(index_elements=list(keys), set_={c: insert.excluded[c] for c in others})


@hookimpl
def pyharvest_staging_table(table: sa.Table) -> sa.Table:
    # Unlogged: no WAL for rows that live seconds. No index: the move sorts in memory faster
    # than the index would be maintained while the tasks copy rows in.
    columns = [sa.Column(c.name, c.type, nullable=c.nullable, primary_key=c.primary_key) for c in table.columns]
    return sa.Table(table.name, sa.MetaData(), *columns, schema=table.schema, prefixes=["UNLOGGED"])


@hookimpl
def pyharvest_bulk_move_statements() -> Sequence[str]:
    return ["SET LOCAL work_mem = '256MB'"]  # the move's sort stays in memory
