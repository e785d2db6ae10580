"""Write outbox records inside the caller's own transaction.

>>> with engine.begin() as tx:                                   # doctest: +SKIP
...     tx.execute(orders.insert(), {...})
...     stash(tx, OutboxRecord("orders", key="order-42", value=b"..."))

The record commits or rolls back with the caller's other changes: that is the point of
the transactional outbox. ``tx`` is a SQLAlchemy :class:`~sqlalchemy.Connection` or ORM
:class:`~sqlalchemy.orm.Session`. Records are validated before anything is written.

For many records, prepare once and reuse the statement::

    writer = Stasher("outbox").prepare(tx)
    for r in records:
        writer.stash(r)          # or writer.stash_many(records): one executemany

``stash_many`` (and a :meth:`Stasher.batch` flush) of 16 records or more uses the dialect's
bulk writer where it has one: on PostgreSQL with psycopg 3, ``COPY … FROM STDIN`` into the
same transaction, several times cheaper than ``executemany``. ``COPY`` bypasses SQLAlchemy's
statement events (``before_cursor_execute``, ``echo``); ``Stasher(..., bulk=False)`` keeps
every write an ``INSERT``.

With asyncio, the same on an :class:`~sqlalchemy.ext.asyncio.AsyncConnection` or
:class:`~sqlalchemy.ext.asyncio.AsyncSession`::

    async with engine.begin() as tx:                  # engine = create_async_engine(...)
        await astash(tx, OutboxRecord("orders", key="order-42", value=b"..."))
        writer = await Stasher("outbox").aprepare(tx)
        await writer.stash_many(records)

``propagate_trace=True`` adds the current OpenTelemetry span's W3C ``traceparent`` (and
``tracestate``) headers to records that carry no ``traceparent`` (see :mod:`pyharvest.tracing`).

Statements are built once per (dialect, table, layout) and SQLAlchemy's compiled cache
keeps their compiled form. Where the database's dialect supports several layouts
(PostgreSQL: native and goharvest's), the dialect recognises the table's from its columns,
once per engine (``layout=`` forces one); the same look-up reads the key column's length.
A :class:`Stasher` keeps what it made of them per engine (one stasher may serve several), so
that a stash checks, sizes and encodes its record once and looks nothing up.

Before anything is written, an ill-formed record (:func:`validate_record`), a key longer than
the table's key column, a record over ``max_record_bytes`` and a missing table are refused:
:class:`~pyharvest.errors.InvalidRecordError`, :class:`~pyharvest.errors.KeyTooLongError`,
:class:`~pyharvest.errors.RecordTooLargeError`, :class:`~pyharvest.errors.OutboxTableMissingError`.
A table that ``reaper init-db --shards`` made ready for shards after this process read it
refuses the process's rows once (:class:`~pyharvest.errors.OutboxTableChangedError`): run the
transaction again, and the stasher stores each row's key hash from then on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Light (no SQLAlchemy): ``import pyharvest`` imports this package for its errors
# (pyharvest.errors). The stashers load on first use.
from pyharvest._public import publish
from pyharvest.core.outbox.records import validate_record
from pyharvest.stasher.errors import DEFAULT_MAX_RECORD_BYTES, KAFKA_MESSAGE_MAX_BYTES

if TYPE_CHECKING:
    from pyharvest.stasher.batch import BatchStasher
    from pyharvest.stasher.stashers import AsyncPreparedStasher, PreparedStasher, Stasher, astash, stash
    from pyharvest.stasher.typed import CloudEvents, SchemaMismatchError, SchemaRegistryError, registry_client

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "KAFKA_MESSAGE_MAX_BYTES",
    "AsyncPreparedStasher",
    "BatchStasher",
    "CloudEvents",
    "PreparedStasher",
    "SchemaMismatchError",
    "SchemaRegistryError",
    "Stasher",
    "astash",
    "registry_client",
    "stash",
    "validate_record",
]

_LAZY = {
    "AsyncPreparedStasher": "stashers", "PreparedStasher": "stashers", "Stasher": "stashers",
    "astash": "stashers", "stash": "stashers", "BatchStasher": "batch",
    "CloudEvents": "typed", "SchemaMismatchError": "typed", "SchemaRegistryError": "typed", "registry_client": "typed",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    loaded = import_module(f"{__name__}.{module}")
    names = [n for n, m in _LAZY.items() if m == module]
    publish(__name__, vars(loaded), names)
    globals().update((n, getattr(loaded, n)) for n in names)  # once loaded, ordinary attributes
    return globals()[name]


publish(__name__, globals(), ["validate_record"])
