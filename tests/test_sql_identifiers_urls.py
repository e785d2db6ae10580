"""Table names and data-source strings: pure functions, no database."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import mssql, mysql, oracle, postgresql, sqlite

from pyharvest.bindings.sql import TableName, libpq_to_url, mask_url, parse_table_name
from pyharvest.core.errors import ConfigError
from pyharvest.plugins.api import is_libpq_dsn


@pytest.mark.parametrize(
    "bad",
    ["", "outbox; DROP TABLE x", "a.b.c", "1outbox", "out box", 'out"box', "out`box", "o--x", "a.", ".a", None, 3],
)
def test_invalid_table_names_are_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(ConfigError) as e:
        parse_table_name(bad)
    assert e.value.field == "outboxTable"


def test_schema_qualified_and_reserved_names_are_quoted_per_dialect() -> None:
    name = parse_table_name("sales.order")
    assert name == TableName("order", "sales") and str(name) == "sales.order"
    assert name.quoted(postgresql.dialect().identifier_preparer) == 'sales."order"'
    assert name.quoted(mysql.dialect().identifier_preparer) == "sales.`order`"
    assert name.quoted(mssql.dialect().identifier_preparer) == "sales.[order]"
    assert name.quoted(sqlite.dialect().identifier_preparer) == 'sales."order"'
    assert parse_table_name("Outbox").quoted(oracle.dialect().identifier_preparer) == '"Outbox"'
    assert parse_table_name("outbox").quoted(postgresql.dialect().identifier_preparer) == "outbox"


def test_too_long_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="longer than 63"):
        parse_table_name("x" * 64)


GOHARVEST_DSN = "host=localhost port=5432 user=postgres password= dbname=postgres sslmode=disable"


def test_goharvest_default_dsn_converts() -> None:
    assert is_libpq_dsn(GOHARVEST_DSN)
    assert libpq_to_url(GOHARVEST_DSN) == "postgresql+psycopg://postgres@localhost:5432/postgres?sslmode=disable"


def test_dsn_quoting_and_special_characters() -> None:
    url = libpq_to_url(r"host=db.example user=app password='p w\'@/' dbname=my_db application_name=reaper")
    assert url == "postgresql+psycopg://app:p%20w%27%40%2F@db.example/my_db?application_name=reaper"
    assert libpq_to_url("host=/var/run/postgresql dbname=x") == "postgresql+psycopg:///x?host=%2Fvar%2Frun%2Fpostgresql"
    with pytest.raises(ValueError, match="unterminated"):
        libpq_to_url("password='abc")


def test_urls_are_not_dsns() -> None:
    assert not is_libpq_dsn("postgresql://u@h/d")
    assert not is_libpq_dsn("sqlite:///x.db")
    assert not is_libpq_dsn("")


@pytest.mark.parametrize(
    ("raw", "masked"),
    [
        ("postgresql+psycopg://app:s3cret@h:5432/db", "postgresql+psycopg://app:***@h:5432/db"),
        ("mysql+pymysql://root@h/db", "mysql+pymysql://root@h/db"),
        ("mssql+pymssql://h/db?user=u&password=s3cret", "mssql+pymssql://h/db?user=u&password=***"),
        ("host=h password=s3cret dbname=d", "host=h password=*** dbname=d"),
        ("host=h password='s 3c\\'ret' dbname=d", "host=h password=*** dbname=d"),
        (GOHARVEST_DSN, GOHARVEST_DSN),
    ],
)
def test_mask_url_hides_passwords(raw: str, masked: str) -> None:
    assert mask_url(raw) == masked
    assert "s3cret" not in mask_url(raw)
