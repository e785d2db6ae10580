"""Database access shared by the Spark writer and the exactly-once sink: engines and quoting.
What differs between databases (bulk writes, upserts, staging tables) is asked of the
dialect (:attr:`Database.dialect`), never decided from the database's name.

Everything here runs in Spark's Python workers as well as on the driver, so it keeps no
global state beyond a per-process engine cache (workers are reused across tasks).
"""

from __future__ import annotations

import threading
from typing import ClassVar

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from pyharvest.bindings.sql.connect import create_engine, resolve
from pyharvest.plugins.api import TableName, mask_url

__all__ = ["Database"]


class Database:
    """An engine for one data source, its dialect, and quoting for the SQL we generate.

    Connections are not pooled across tasks (``NullPool``): a Spark job opens one connection
    per task, and idle pooled connections in long-lived Python workers would only pin server
    sessions.
    """

    _cache: ClassVar[dict[tuple[str, str | None], Database]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str, binding: str | None = None) -> None:
        sa_url, dialect = resolve(url, binding)
        self.display_url = mask_url(url)
        self.dialect = dialect
        self.engine: sa.Engine = create_engine(sa_url, dialect, poolclass=NullPool)
        self.preparer = self.engine.dialect.identifier_preparer

    @classmethod
    def shared(cls, url: str, binding: str | None = None) -> Database:
        """One instance per (url, binding) per process."""
        key = (url, binding)
        with cls._lock:
            db = cls._cache.get(key)
            if db is None:
                db = cls._cache[key] = cls(url, binding)
            return db

    def q(self, identifier: str) -> str:
        return str(self.preparer.quote(identifier))

    def table(self, name: TableName) -> str:
        return name.quoted(self.preparer)

