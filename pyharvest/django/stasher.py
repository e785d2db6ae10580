"""Stash outbox records on Django's own connection, inside ``transaction.atomic()``.

The INSERT is the stasher's (``sa.insert(outbox.table)``), compiled once per (dialect, table)
with the pyharvest dialect's SQLAlchemy dialect in Django's ``%s`` placeholder style, and run with
Django's cursor: the record is in the transaction of the ``atomic()`` block around it, and
commits or rolls back with it. Parameters go through the column types' bind processors for
that dialect, so rows are stored exactly as :mod:`pyharvest.stasher` stores them.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from pyharvest import tracing
from pyharvest.core.errors import BindingError
from pyharvest.core.outbox.records import OutboxRecord, check_record
from pyharvest.django.databases import dialect_for_connection, outbox_table_name
from pyharvest.plugins.api import KEY_HASH_COLUMN, KEY_HASH_GUARD_SUFFIX, NATIVE, OutboxTable, TableName
from pyharvest.stasher.errors import OutboxTableChangedError
from pyharvest.stasher.typed import CloudEvents, Typing, ValueSerializer

__all__ = ["stash", "stash_many"]


@dataclass(frozen=True, slots=True)
class _Insert:
    """The compiled INSERT of one table for one dialect, and how to turn an encoded record
    into its positional parameters."""

    outbox: OutboxTable
    sql: str
    columns: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]

    def parameters(self, encoded: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(
            encoded[c] if p is None else p(encoded[c]) for c, p in zip(self.columns, self.processors, strict=True)
        )


_lock = threading.Lock()
_inserts: dict[tuple[str, TableName, bool], _Insert] = {}
# Django connection (one per alias and thread) → tables seen to exist on it, and whether each
# has the key hash column (tables migrated before it existed do not).
_checked: weakref.WeakKeyDictionary[Any, dict[TableName, bool]] = weakref.WeakKeyDictionary()


def _insert(connection: Any, table: TableName, key_hash: bool) -> _Insert:
    dialect = dialect_for_connection(connection)
    key = (dialect.name, table, key_hash)
    found = _inserts.get(key)
    if found is not None:
        return found
    outbox = OutboxTable.build(table, NATIVE, key_hash=key_hash)
    # Django's cursors take ``%s`` placeholders on every backend (and convert them for sqlite3
    # and Oracle): compile for the dialect's SQLAlchemy dialect in that paramstyle.
    dialect_class: Any = type(dialect.sqlalchemy_dialect())
    sa_dialect: sa.Dialect = dialect_class(paramstyle="format")
    # inline(): no RETURNING of the generated id, which Django's cursor would leave unread.
    compiled = sa.insert(outbox.table).inline().compile(dialect=sa_dialect, column_keys=list(outbox.stashed_columns))
    columns = tuple(compiled.positiontup or ())
    assert set(columns) == set(outbox.stashed_columns), (columns, outbox.stashed_columns)
    processors = tuple(compiled.binds[c].type.dialect_impl(sa_dialect).bind_processor(sa_dialect) for c in columns)
    found = _Insert(outbox, str(compiled), columns, processors)
    with _lock:
        _inserts[key] = found
    return found


def _check_table(connection: Any, name: TableName) -> bool:
    """Once per connection and table: a clear error when the table is missing, before the
    INSERT fails (on PostgreSQL that would also break the caller's transaction); and whether
    the table has the key hash column, which places rows in shards."""
    seen = _checked.get(connection)
    if seen is not None and name in seen:
        return seen[name]
    key_hash = True  # a schema-qualified table is taken as migrated by this version
    if name.schema is None:  # Django's introspection sees the tables of the current schema only
        with connection.cursor() as cursor:
            tables = {t.lower() for t in connection.introspection.table_names(cursor)}
            if name.name.lower() not in tables:
                raise BindingError(
                    f"outbox table {str(name)!r} does not exist in database {connection.alias!r}: run "
                    f"`python manage.py migrate pyharvest` (it creates the table named by PYHARVEST_OUTBOX_TABLE), "
                    f"or check that setting and the table= argument"
                )
            table = next(t for t in connection.introspection.table_names(cursor) if t.lower() == name.name.lower())
            columns = {c.name.lower() for c in connection.introspection.get_table_description(cursor, table)}
            key_hash = KEY_HASH_COLUMN in columns
    with _lock:
        _checked.setdefault(connection, {})[name] = key_hash
    return key_hash


def _traced(records: list[OutboxRecord]) -> list[OutboxRecord]:
    extra = tracing.trace_headers()
    if not extra:
        return records
    return [r if _has_traceparent(r) else dataclasses.replace(r, headers=[*r.headers, *extra]) for r in records]


def _has_traceparent(record: OutboxRecord) -> bool:
    return any(name.lower() == "traceparent" for name, _ in record.headers)


def _write(
    using: str, table: str | TableName | None, records: Sequence[OutboxRecord], propagate_trace: bool,
    typing: Typing | None = None,
) -> int:
    if typing is not None:
        records = [typing.apply(r) for r in records]  # serialised first: what is checked is what is stored
    # Every record, before touching the database; each value as the check left it (a non-ASCII
    # text encoded once, there). Tracing adds headers, not values.
    values = [check_record(r)[1] for r in records]
    validated = list(records)
    if propagate_trace:
        validated = _traced(validated)
    if not validated:
        return 0
    connection = connections[using]
    name = outbox_table_name(table)
    key_hash = _check_table(connection, name)  # before the block below: a missing table leaves the caller's usable
    insert = _insert(connection, name, key_hash)
    now = OutboxTable.now()
    encode, parameters = insert.outbox.encode, insert.parameters
    rows = [parameters(encode(r, now, v)) for r, v in zip(validated, values, strict=True)]
    # Inside the caller's atomic() block an error marks it for rollback, as Django's own writes
    # do (no savepoint: the record belongs to the block). Outside one, a single INSERT is
    # autocommitted, and many are written in a transaction of their own: all of them or none.
    try:
        if len(rows) == 1:
            with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
                cursor.execute(insert.sql, rows[0])
        else:
            with transaction.atomic(using=using, savepoint=False), connection.cursor() as cursor:
                cursor.executemany(insert.sql, rows)
    except DatabaseError as e:
        if key_hash or KEY_HASH_GUARD_SUFFIX not in str(e).lower():
            raise
        # `reaper init-db --shards` added the key hash since this connection looked: look again.
        with _lock:
            _checked.get(connection, {}).pop(name, None)
        raise OutboxTableChangedError(
            f"the outbox table {name} now refuses rows without a key hash (`reaper init-db --shards` made it "
            "ready for shards after this connection had read it): run the atomic block again; the stasher has "
            "reread the table and will store the hash"
        ) from e
    return len(rows)


def stash(
    record: OutboxRecord,
    *,
    using: str = DEFAULT_DB_ALIAS,
    table: str | TableName | None = None,
    propagate_trace: bool = False,
    value_serializer: ValueSerializer | None = None,
    cloud_events: CloudEvents | None = None,
) -> None:
    """Write ``record`` into the outbox table of database ``using``, in the transaction of
    the ``transaction.atomic()`` block around the call: it commits, and is published, only if
    the block commits.

    ``table`` defaults to the ``PYHARVEST_OUTBOX_TABLE`` setting (``outbox``). The record is
    validated first (:class:`~pyharvest.errors.InvalidRecordError`, nothing written). A missing table
    raises :class:`~pyharvest.errors.BindingError` naming ``migrate pyharvest``. ``propagate_trace``
    adds the current OpenTelemetry trace's headers, as the SQLAlchemy stasher's does;
    ``value_serializer`` and ``cloud_events`` serialise the value and add CloudEvents headers as
    the SQLAlchemy ``Stasher``'s do (docs/typed-messages.md).
    """
    _write(using, table, (record,), propagate_trace, _typing(value_serializer, cloud_events))


def stash_many(
    records: Iterable[OutboxRecord],
    *,
    using: str = DEFAULT_DB_ALIAS,
    table: str | TableName | None = None,
    propagate_trace: bool = False,
    value_serializer: ValueSerializer | None = None,
    cloud_events: CloudEvents | None = None,
) -> int:
    """Validate all of ``records``, then write them with one ``executemany``; return how many.
    One invalid record means none are written. Same transaction rules as :func:`stash`."""
    return _write(using, table, list(records), propagate_trace, _typing(value_serializer, cloud_events))


def _typing(value_serializer: ValueSerializer | None, cloud_events: CloudEvents | None) -> Typing | None:
    return Typing(value_serializer, cloud_events) if value_serializer is not None or cloud_events is not None else None
