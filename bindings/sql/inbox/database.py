"""The inbox's database through SQLAlchemy: an :class:`~pyharvest.core.inbox.ports.InboxDatabase`."""

from __future__ import annotations

from contextlib import AbstractContextManager

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

__all__ = ["SqlInboxDatabase", "SqlTransaction"]


class SqlTransaction:
    """A connection of the engine's pool in a transaction of its own."""

    __slots__ = ("_txn", "connection")

    def __init__(self, engine: sa.Engine) -> None:
        connection = engine.connect()
        try:
            self._txn = connection.begin()
        except BaseException:
            connection.close()
            raise
        self.connection = connection

    def commit(self) -> None:
        self._txn.commit()

    def rollback(self) -> None:
        self._txn.rollback()

    def close(self) -> None:
        self.connection.close()


class SqlInboxDatabase:
    """Transactions on ``engine``; SQLAlchemy's errors are the database failing."""

    failures: tuple[type[BaseException], ...] = (SQLAlchemyError,)

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def begin(self) -> SqlTransaction:
        return SqlTransaction(self.engine)

    def connect(self) -> AbstractContextManager[sa.Connection]:
        return self.engine.connect()

    def savepoint(self, tx: sa.Connection) -> sa.NestedTransaction:
        return tx.begin_nested()

    def connection_lost(self, error: BaseException) -> bool:
        """A handler error that is really the database going away: retried, never dead-lettered."""
        return isinstance(error, DBAPIError) and bool(error.connection_invalidated)
