"""Django, configured once per session from the documented example project
(docs/examples/django), with ``default`` pointed at a fresh database per test.

Each test gets its own Django database on the dialect's server, so ``migrate`` (and its
``django_migrations`` table) starts from nothing and the default table name ``outbox`` is
free: SQLite, a file of its own; PostgreSQL, a schema of its own (on ``search_path`` through
``OPTIONS``, which the harvester's URL carries); MySQL/MariaDB, a database of its own.
"""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers.django import ENGINES, EXAMPLE, DjangoDatabase


@pytest.fixture(scope="session")
def django_settings() -> Any:
    pytest.importorskip("django")
    import django
    from django.conf import settings

    try:  # Django's MySQL backend needs MySQLdb: mysqlclient's where installed (tox's mysql environment)
        import MySQLdb  # noqa: F401
    except ImportError:
        try:  # else PyMySQL stands in for it
            import pymysql

            pymysql.install_as_MySQLdb()
        except ImportError:
            pass
    if not settings.configured:
        if str(EXAMPLE) not in sys.path:
            sys.path.insert(0, str(EXAMPLE))
        example = importlib.import_module("mysite.settings")
        values = {k: getattr(example, k) for k in dir(example) if k.isupper()}
        values["DATABASES"] = {"default": {"ENGINE": ENGINES["sqlite"], "NAME": ":memory:"}}
        settings.configure(**values)
        django.setup()
    return settings


def swap_default(db: dict[str, Any] | None) -> None:
    """Point Django's ``default`` alias at ``db`` (closing the current connection)."""
    from django.db import connections

    try:
        connections["default"].close()
        del connections["default"]
    except AttributeError:
        pass
    if db is not None:
        connections.settings["default"] = connections.configure_settings({"default": db})["default"]



@pytest.fixture
def django_db(django_settings: Any, dialect: str, database_url: str) -> Iterator[DjangoDatabase]:
    """Django's ``default`` database: a fresh one on the dialect's server (see the module)."""
    if dialect not in ENGINES:
        pytest.skip(f"the Django tests cover {', '.join(ENGINES)}; Django's {dialect} backend is not set up here")
    url = sa.make_url(database_url)
    server = {
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
    }
    private = f"dj_{uuid.uuid4().hex[:10]}"
    admin = None if dialect == "sqlite" else sa.create_engine(url)
    if dialect == "sqlite":
        db: dict[str, Any] = {"ENGINE": ENGINES[dialect], "NAME": url.database}
    elif dialect == "postgresql":
        assert admin is not None
        with admin.begin() as c:
            c.execute(sa.text(f"CREATE SCHEMA {private}"))
        db = {"ENGINE": ENGINES[dialect], "NAME": url.database, **server,
              "OPTIONS": {"options": f"-c search_path={private}"}}
    else:
        assert admin is not None
        with admin.begin() as c:
            c.execute(sa.text(f"CREATE DATABASE {private} CHARACTER SET utf8mb4"))
        db = {"ENGINE": ENGINES[dialect], "NAME": private, **server}
    swap_default(db)
    try:
        yield DjangoDatabase(dialect, db)
    finally:
        swap_default(None)
        if admin is not None:
            with admin.begin() as c:
                if dialect == "postgresql":
                    c.execute(sa.text(f"DROP SCHEMA {private} CASCADE"))
                else:
                    c.execute(sa.text(f"DROP DATABASE {private}"))
            admin.dispose()
