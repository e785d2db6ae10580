"""From a data-source string to a dialect and a SQLAlchemy engine."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from pyharvest.core.errors import BindingError, ConfigError
from pyharvest.plugins.api import LIBPQ_DIALECT, Dialect, dialect_for_backend, is_libpq_dsn, load_dialect, mask_url

__all__ = ["POOL_SIZE", "create_engine", "load_driver", "resolve"]

# The mark thread and the purge/reset thread each hold one connection at a time.
POOL_SIZE = 2


def resolve(data_source: str, dialect_name: str | None = None) -> tuple[sa.URL, Dialect]:
    """The SQLAlchemy URL and the dialect for a data source, ``dialect_name``'s if given.

    Without a dialect name, a libpq ``key=value`` string means PostgreSQL (as in goharvest)
    and a URL means the dialect serving its backend (``mariadb`` → ``mysql``).
    """
    if not isinstance(data_source, str) or not data_source.strip():
        raise ConfigError("dataSource", "expected a SQLAlchemy URL or a libpq key=value string")
    if dialect_name is None:
        if is_libpq_dsn(data_source):
            dialect_name = LIBPQ_DIALECT
        else:
            dialect_name = dialect_for_backend(_parse(data_source).get_backend_name())
    dialect = load_dialect(dialect_name)
    text = data_source
    if is_libpq_dsn(data_source):
        try:
            converted = dialect.normalize_data_source(data_source)
        except ValueError as e:
            raise ConfigError("dataSource", f"{e}: {mask_url(data_source)}") from None
        if converted is None:
            raise ConfigError(
                "dataSource",
                f"dialect {dialect.name!r} does not accept key=value data sources; give a SQLAlchemy URL "
                f"(got {mask_url(data_source)})",
            )
        text = converted
    return _parse(text), dialect


def _parse(text: str) -> sa.URL:
    try:
        return sa.make_url(text)
    except ArgumentError:
        raise ConfigError(
            "dataSource", f"{mask_url(text)!r} is neither a SQLAlchemy URL nor a libpq key=value string"
        ) from None


def load_driver(url: sa.URL, dialect: Dialect) -> None:
    """Import the data source's driver, as creating its engine does; a driver SQLAlchemy does
    not know is a :class:`ConfigError`, one not installed a :class:`BindingError` saying which
    package to install (from the dialect's ``driver_packages``)."""
    shown = url.render_as_string(hide_password=True)
    backend = url.get_backend_name()
    packages = dict(dialect.capabilities.driver_packages)
    try:
        dialect_cls = url.get_dialect()
    except NoSuchModuleError:
        known = f": use one of {', '.join(packages)} ({backend}+DRIVER://...)" if packages else ""
        raise ConfigError(
            "dataSource", f"SQLAlchemy has no driver {url.get_driver_name()!r} for {backend} in {shown}{known}"
        ) from None
    try:
        dialect_cls.import_dbapi()
    except ImportError as e:
        driver = dialect_cls.driver
        package = packages.get(driver)
        install = (
            f"pip install '{package}'" if package and not package.startswith("(")
            else f"install the package that provides the module {e.name!r}"
        )
        default = next(iter(packages.items()), None)
        alternative = (
            f", or use the driver pyharvest installs ({backend}+{default[0]}://: pip install '{default[1]}')"
            if default is not None and default[0] != driver else ""
        )
        raise BindingError(
            f"the {driver!r} driver of {shown} is not installed (no module named {e.name!r}): "
            f"{install}{alternative}"
        ) from None


def create_engine(url: sa.URL, dialect: Dialect, *, lock_timeout: float | None = None, **overrides: Any) -> sa.Engine:
    """An engine with the dialect's options and session hooks and a small pool; with
    ``lock_timeout`` (seconds, > 0), each of its sessions waits at most that long for a lock
    another session holds (the dialect's ``pyharvest_lock_timeout_statements``)."""
    load_driver(url, dialect)  # a missing driver says which package to install
    options: dict[str, Any] = {"pool_size": POOL_SIZE, "max_overflow": 2, "pool_recycle": 1800}
    options.update(dialect.engine_options(url))
    options.update(overrides)
    try:
        engine = sa.create_engine(url, **options)
    except TypeError:
        # Pools without a size (SQLite :memory: uses a singleton pool) refuse the pool options.
        for k in ("pool_size", "max_overflow"):
            options.pop(k, None)
        engine = sa.create_engine(url, **options)
    except (ArgumentError, ImportError) as e:
        raise BindingError(f"cannot create an engine for {url.render_as_string(hide_password=True)}: {e}") from e

    session = dialect.lock_timeout_statements(lock_timeout) if lock_timeout else []

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dialect.on_connect(dbapi_connection, url)
        if session:
            cursor = dbapi_connection.cursor()
            try:
                for statement in session:
                    cursor.execute(statement)
            finally:
                cursor.close()
            # Outside any transaction of the pool's (PostgreSQL's driver opened one for it).
            dbapi_connection.commit()

    dialect.configure_engine(engine)
    return engine
