"""Bulk writers: a dialect's faster way than ``executemany`` to insert many rows.

The stasher (outbox records), the inbox (dedupe identities) and Spark ask the dialect plugin
once per engine and table (:func:`pyharvest.plugins.hookspecs.pyharvest_bulk_writer`). A
writer inserts rows inside the caller's transaction, exactly as the ``INSERT`` would: same
columns, same defaults, same triggers, and a failure raises SQLAlchemy's usual
:class:`~sqlalchemy.exc.DBAPIError` subclasses and leaves the transaction for the caller to
roll back. :class:`~pyharvest.bindings.sql.bulk_insert.BulkInsert` is the one call every caller makes
(exported for batch handlers as ``pyharvest.inbox.BulkInsert``): the writer where the dialect
has one and the batch is large enough, else ``executemany``.

PostgreSQL's is ``COPY … FROM STDIN`` (psycopg 3): a batch of 100 records costs the client
about a third of the CPU of an ``executemany`` and the server far less.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, Protocol, runtime_checkable

import sqlalchemy as sa
from sqlalchemy.engine.interfaces import DBAPICursor

__all__ = ["BulkWriter", "begin_if_needed", "raise_as_sqlalchemy_error"]


@runtime_checkable
class BulkWriter(Protocol):
    #: Below this many rows the stasher uses ``executemany``: a bulk protocol usually costs a
    #: round trip more, which only pays off for larger batches.
    min_rows: int

    def __call__(self, connection: sa.Connection, rows: Iterable[Sequence[Any]]) -> bool:
        """Insert ``rows`` (tuples in the order of the columns the writer was made for) in the
        connection's current transaction; False, having written nothing and read no row, to
        leave them to ``executemany`` (say, when the connection is in a mode the bulk protocol
        cannot use). ``rows`` may be an iterator: read it once, while writing."""
        ...


def begin_if_needed(connection: sa.Connection) -> None:
    """Begin SQLAlchemy's transaction if the caller has not: a writer that talks to the driver
    directly bypasses ``Connection.execute``'s autobegin, and without it ``conn.commit()``
    would commit nothing and the rows would be rolled back when the connection is returned."""
    if not connection.in_transaction():
        connection.begin()


def raise_as_sqlalchemy_error(
    connection: sa.Connection, error: BaseException, statement: str, cursor: DBAPICursor | None = None
) -> NoReturn:
    """Re-raise a driver error as SQLAlchemy would have from ``execute`` (an ``IntegrityError``,
    ``DataError``…), invalidating the connection when the error says it is gone."""
    dialect = connection.dialect
    dbapi = dialect.loaded_dbapi
    if not isinstance(error, dbapi.Error):
        raise error
    invalidated = False
    try:
        invalidated = bool(dialect.is_disconnect(error, connection.connection.dbapi_connection, cursor))
    except Exception:  # noqa: BLE001 - best effort: the original error is what matters
        invalidated = False
    if invalidated:
        connection.invalidate(error)
    raise sa.exc.DBAPIError.instance(
        statement, None, error, dbapi.Error, connection_invalidated=invalidated, dialect=dialect
    ) from error
