"""What a database can do, declared by its dialect plugin (``DialectOptions.capabilities``).

Code outside ``plugins/`` asks these flags and the dialect's hooks, never the database's name:
a third-party dialect that declares them gets the same behaviour as a built-in one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Capabilities", "backend_capabilities", "find_capabilities_with"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Flags a dialect declares; the defaults are what any SQL database supports."""

    #: Timestamps keep their time zone (``timestamptz``): aware datetimes are bound unchanged.
    #: Otherwise they are bound as naive UTC (see :class:`~pyharvest.plugins.api.UTCDateTime`).
    aware_timestamps: bool = False
    #: ``CREATE`` / ``DROP TABLE`` may share a transaction with DML without committing it
    #: (MySQL commits implicitly before DDL).
    transactional_ddl: bool = False
    #: How many values one :meth:`~pyharvest.plugins.api.Dialect.list_filter` may bind;
    #: None when the dialect binds one array, whatever its length. Oracle's IN lists stop at
    #: 1,000 and SQL Server takes 2,100 parameters a statement.
    list_limit: int | None = 1000
    #: The SQLAlchemy drivers of this database (the ``+driver`` of a URL) and the pip
    #: requirement that installs each, the first the one pyharvest's extra installs: what a
    #: data source whose driver is missing is told to install.
    driver_packages: tuple[tuple[str, str], ...] = ()
    #: A generated id counts up only in a column declared exactly ``INTEGER PRIMARY KEY``
    #: (SQLite's rowid, 64 bits all the same): :class:`~pyharvest.plugins.api.GeneratedId`
    #: declares ``INTEGER`` there and ``BIGINT`` elsewhere.
    integer_ids: bool = False
    #: The database has roles and ``GRANT`` (SQLite has neither: the file's permissions decide).
    grants: bool = True
    #: ``GRANT`` names accounts, ``'user'@'host'``, or roles, both written as strings (MySQL,
    #: MariaDB); elsewhere a grantee is an identifier.
    account_grantees: bool = False
    #: A role needs ``USAGE`` on a schema to reach the tables in it (PostgreSQL).
    schema_usage: bool = False
    #: An id generated without ``IDENTITY`` draws from a sequence ``<table>_<column>_seq``, on
    #: which a role that inserts needs ``USAGE`` (PostgreSQL's serial columns).
    serial_sequences: bool = False
    #: How the driver reports a statement refused for want of a privilege: SQLSTATEs or error
    #: numbers (see :func:`~pyharvest.plugins.api.grants.is_privilege_error`).
    privilege_errors: tuple[str | int, ...] = ()
    #: How the driver reports a statement that waited for a lock longer than its session
    #: allows (``limits.lockTimeout``): SQLSTATEs or error numbers (see
    #: :func:`~pyharvest.plugins.api.locks.is_lock_timeout`).
    lock_timeout_errors: tuple[str | int, ...] = ()
    #: One writer at a time (SQLite): rows commit in the order of their ids, so none commits
    #: below an id a mark has already seen, and the binding runs no late-row scan
    #: (:mod:`pyharvest.bindings.sql.mark_cursor`).
    commits_in_id_order: bool = False


# How a SQLAlchemy backend's capabilities are found: installed by the dialect registry
# (:mod:`.dialect`) when it is imported. The column types (:mod:`.table`) ask through
# :func:`backend_capabilities`, so they need not import the registry, which describes its hooks
# with the table they belong to.
_finder: Callable[[str], Capabilities | None] | None = None


def find_capabilities_with(finder: Callable[[str], Capabilities | None]) -> None:
    """Make ``finder`` (backend name → its dialect's capabilities, None where no installed
    dialect serves it) the way :func:`backend_capabilities` looks them up."""
    global _finder
    _finder = finder
    _cached.cache_clear()


def backend_capabilities(backend: str) -> Capabilities:
    """The capabilities of the pyharvest dialect serving SQLAlchemy backend ``backend``; the
    defaults (what any SQL database supports) where no installed dialect serves it."""
    if _finder is None:
        raise RuntimeError("no dialect registry installed: import pyharvest.plugins.api")
    return _cached(backend)


@functools.cache
def _cached(backend: str) -> Capabilities:
    assert _finder is not None
    return _finder(backend) or Capabilities()
