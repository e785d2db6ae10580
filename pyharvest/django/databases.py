"""What pyharvest needs to know about a Django database: its dialect, the outbox
table's name, and a SQLAlchemy URL for the harvester.

Django names a database by its backend's ``vendor`` (``postgresql``, ``mysql`` for MySQL and
MariaDB, ``sqlite``, ``oracle``, ``microsoft`` for mssql-django); pyharvest's dialect registry
maps SQLAlchemy backend names to dialects (:func:`~pyharvest.plugins.api.dialect_for_backend`).
The two vocabularies agree, and a dialect serving a vendor that SQLAlchemy names otherwise
lists the vendor among its backends (SQL Server's plugin: ``microsoft``); the URL is then
built with the dialect's first backend name.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

from pyharvest.core.errors import ConfigError
from pyharvest.plugins.api import Dialect, TableName, dialect_for_backend, load_dialect, parse_table_name

__all__ = [
    "DEFAULT_OUTBOX_TABLE",
    "data_source",
    "dialect_for_connection",
    "outbox_table_name",
]

#: The outbox table when ``settings.PYHARVEST_OUTBOX_TABLE`` is not set.
DEFAULT_OUTBOX_TABLE = "outbox"

# OPTIONS keys Django consumes itself (not connection arguments of the driver), and the
# session set-up the application's connections want but the harvester's do not.
_NOT_CONNECT_ARGS = frozenset(
    {"isolation_level", "server_side_binding", "pool", "assume_role", "transaction_mode", "init_command"}
)

_lock = threading.Lock()
_dialects: dict[str, Dialect] = {}


def outbox_table_name(table: str | TableName | None = None) -> TableName:
    """``table``, or the ``PYHARVEST_OUTBOX_TABLE`` setting (default ``outbox``), validated."""
    if table is None:
        table = getattr(settings, "PYHARVEST_OUTBOX_TABLE", DEFAULT_OUTBOX_TABLE)
    return parse_table_name(table)


def dialect_for_connection(connection: Any) -> Dialect:
    """The pyharvest dialect serving a Django connection (``connections[alias]``, or a
    migration's ``schema_editor.connection``); :class:`~pyharvest.errors.BindingError` when no
    installed dialect serves its vendor."""
    vendor: str = connection.vendor
    found = _dialects.get(vendor)
    if found is None:
        found = load_dialect(dialect_for_backend(vendor))
        with _lock:
            _dialects[vendor] = found
    return found


def _option_value(alias: str, key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ConfigError(
        "dataSource",
        f"DATABASES[{alias!r}]['OPTIONS'][{key!r}] is a {type(value).__name__}, which a URL cannot carry; "
        "set harvest.dataSource (in PYHARVEST or the -f file) to the harvester's SQLAlchemy URL",
    )


def data_source(using: str = DEFAULT_DB_ALIAS) -> str:
    """The SQLAlchemy URL of Django's database ``using``, password included, for the
    harvester's ``dataSource``.

    Built from ``DATABASES[using]``: the backend from the connection's vendor, the driver from
    the DB-API module Django itself loaded (``psycopg``, ``psycopg2``, ``MySQLdb`` or PyMySQL
    installed as it, ``sqlite3``...), then ``NAME``, ``USER``, ``PASSWORD``, ``HOST``, ``PORT``.
    Scalar ``OPTIONS`` become URL query parameters, i.e. driver connection arguments
    (``sslmode``, ``options``, ``charset``...), except Django's own keys (``isolation_level``,
    ``server_side_binding``, ``pool``, ``assume_role``, ``transaction_mode``) and
    ``init_command``. Anything a URL cannot express (a dict option, a socket path in ``HOST``)
    raises :class:`~pyharvest.errors.ConfigError`: give ``harvest.dataSource`` instead.
    """
    if using not in connections.settings:
        raise ConfigError("dataSource", f"no database {using!r} in DATABASES; expected one of {sorted(connections)}")
    connection = connections[using]
    db: Mapping[str, Any] = connection.settings_dict
    backend = dialect_for_connection(connection).url_backends()[0]
    module = getattr(getattr(connection, "Database", None), "__name__", "").partition(".")[0]  # sqlite3.dbapi2
    drivername = backend
    if module:
        # The driver Django loaded, if SQLAlchemy knows it by its module's name; else SQLAlchemy's
        # default driver for the backend, named (sqlite3 is SQLAlchemy's pysqlite).
        for candidate in (f"{backend}+{module.lower()}", backend):
            try:
                driver = sa.make_url(f"{candidate}://").get_dialect().driver
            except (sa.exc.NoSuchModuleError, sa.exc.ArgumentError):
                continue
            drivername = f"{backend}+{driver}"
            break
    host = str(db.get("HOST") or "") or None
    if host is not None and host.startswith("/"):
        raise ConfigError(
            "dataSource",
            f"DATABASES[{using!r}]['HOST'] is a socket path ({host!r}), which the URL's host cannot hold; "
            "set harvest.dataSource to the harvester's SQLAlchemy URL",
        )
    port = db.get("PORT")
    query = {
        str(k): _option_value(using, str(k), v)
        for k, v in (db.get("OPTIONS") or {}).items()
        if k not in _NOT_CONNECT_ARGS and v is not None
    }
    url = sa.URL.create(
        drivername,
        username=str(db.get("USER") or "") or None,
        password=str(db.get("PASSWORD") or "") or None,
        host=host,
        port=int(port) if port not in (None, "") else None,
        database=str(db.get("NAME") or "") or None,
        query=query,
    )
    return url.render_as_string(hide_password=False)
