"""pyharvest.alembic: a real Alembic migration (the documented example, docs/examples/alembic)
creates the outbox with the dialect plugin's DDL on each database; reaper init-db accepts the
table as it is, and the stasher and the harvester use it; offline mode prints the same DDL;
autogenerate leaves the outbox alone."""

from __future__ import annotations

import io
import shutil
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from pyharvest import OutboxRecord
from pyharvest.bindings.sql import check_table, create_binding, create_outbox_table, schema_ddl
from pyharvest.plugins.api import load_dialect, parse_table_name
from pyharvest.stasher import Stasher

alembic = pytest.importorskip("alembic")

from alembic import command  # noqa: E402
from alembic.autogenerate import compare_metadata  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.migration import MigrationContext  # noqa: E402
from alembic.operations import Operations  # noqa: E402

from pyharvest.alembic import create_outbox_table as alembic_create_outbox_table  # noqa: E402
from pyharvest.alembic import drop_outbox_table, ignore_outbox_tables  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "alembic"


@pytest.fixture
def alembic_config(tmp_path):
    """The example's script directory (copied: Alembic compiles env.py beside itself), with
    ``sqlalchemy.url`` set by the test."""
    where = tmp_path / "migrations"
    shutil.copytree(EXAMPLE, where, ignore=shutil.ignore_patterns("__pycache__"))
    output = io.StringIO()

    def make(url: str) -> Config:
        cfg = Config(str(where / "alembic.ini"), output_buffer=output)
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
        return cfg

    make.output = output  # type: ignore[attr-defined]
    return make


def columns(engine: sa.Engine, table: str) -> list[tuple]:
    return [(c["name"], str(c["type"]), c["nullable"]) for c in sa.inspect(engine).get_columns(table)]


@pytest.fixture
def private_database(dialect: str, database_url: str):
    """A database of the test's own on the dialect's server, so that the example's fixed names
    (outbox, orders, alembic_version) meet nobody: SQLite, the test's file; PostgreSQL, a
    schema on ``search_path``; MySQL/MariaDB, a database."""
    if dialect not in ("sqlite", "postgresql", "mysql"):
        pytest.skip(f"no private database set-up for {dialect} here")
    if dialect == "sqlite":
        yield database_url
        return
    private = f"al_{uuid.uuid4().hex[:10]}"
    url = sa.make_url(database_url)
    admin = sa.create_engine(url)
    with admin.begin() as c:
        c.execute(sa.text(f"CREATE SCHEMA {private}" if dialect == "postgresql" else f"CREATE DATABASE {private}"))
    try:
        if dialect == "postgresql":
            yield url.update_query_dict({"options": f"-csearch_path={private}"}).render_as_string(hide_password=False)
        else:
            yield url.set(database=private).render_as_string(hide_password=False)
    finally:
        with admin.begin() as c:
            c.execute(sa.text(f"DROP SCHEMA {private} CASCADE" if dialect == "postgresql" else f"DROP DATABASE {private}"))
        admin.dispose()


def test_upgrade_creates_the_outbox_init_db_accepts_and_the_harvester_uses(
    alembic_config, private_database: str, dialect: str
) -> None:
    url = private_database
    engine = sa.create_engine(url)
    cfg = alembic_config(url)
    command.upgrade(cfg, "head")
    try:
        assert check_table(engine, parse_table_name("outbox"), load_dialect(dialect)) == "native"
        create_outbox_table(url, "outbox")  # reaper init-db: the table is accepted as it is
        create_outbox_table(url, "outbox_by_init_db")
        assert columns(engine, "outbox") == columns(engine, "outbox_by_init_db")

        with engine.begin() as tx:
            Stasher("outbox").stash_many(tx, [OutboxRecord("orders", "o-1", b"placed"), OutboxRecord("orders", "o-1", None)])
        binding = create_binding(url, "outbox")
        try:
            marked = binding.mark(str(uuid.uuid4()), 10)
            assert [(r.key, r.value) for r in marked] == [("o-1", b"placed"), ("o-1", None)]
            assert binding.purge([r.id for r in marked]) == 2
        finally:
            binding.dispose()

        # autogenerate: nothing to do, and in particular no drop of the outbox
        with engine.connect() as conn:
            from shop_schema import metadata  # the example's, importable once Alembic ran its env.py

            hooked = MigrationContext.configure(conn, opts={"include_name": ignore_outbox_tables("outbox", "outbox_by_init_db")})
            assert compare_metadata(hooked, metadata) == []
            unhooked = MigrationContext.configure(conn)
            dropped = {d[1].name for d in compare_metadata(unhooked, metadata) if d[0] == "remove_table"}
            assert "outbox" in dropped  # what the hook prevents
    finally:
        engine.dispose()
    command.downgrade(cfg, "base")
    engine = sa.create_engine(url)
    try:
        assert not sa.inspect(engine).has_table("outbox")
    finally:
        engine.dispose()


def test_operations_in_a_migration_context(database_url: str, table_name: str, dialect: str) -> None:
    """The helpers through MigrationContext + Operations, on a table name of the test's own."""
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            op = Operations(MigrationContext.configure(conn))
            alembic_create_outbox_table(op, table_name)
        assert check_table(engine, parse_table_name(table_name), load_dialect(dialect)) == "native"
        with engine.begin() as tx:
            Stasher(table_name).stash(tx, OutboxRecord("t", "k", b"v"))
        with engine.begin() as conn:
            drop_outbox_table(Operations(MigrationContext.configure(conn)), table_name)
        assert not sa.inspect(engine).has_table(table_name)
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("dialect_name", "url"),
    [
        ("postgresql", "postgresql+psycopg://"),
        ("sqlite", "sqlite://"),
        ("mysql", "mysql+pymysql://"),
        ("mssql", "mssql+pymssql://"),
        ("oracle", "oracle+oracledb://"),
    ],
)
def test_offline_sql_is_the_plugins_ddl(alembic_config, dialect_name: str, url: str) -> None:
    cfg = alembic_config(url)
    command.upgrade(cfg, "head", sql=True)
    printed = alembic_config.output.getvalue()
    for statement in schema_ddl(dialect_name, "outbox").split(";\n"):
        if statement.strip():
            assert statement.strip() in printed
    command.downgrade(cfg, "head:base", sql=True)
    assert "DROP TABLE outbox" in alembic_config.output.getvalue()


def test_offline_sql_with_a_schema() -> None:
    buffer = io.StringIO()
    context = MigrationContext.configure(dialect_name="postgresql", opts={"as_sql": True, "output_buffer": buffer})
    op = Operations(context)
    alembic_create_outbox_table(op, "events", schema="billing")
    drop_outbox_table(op, "events", schema="billing")
    assert schema_ddl("postgresql", "billing.events").strip().rstrip(";") in buffer.getvalue()
    assert "DROP TABLE billing.events" in buffer.getvalue()


def test_an_unknown_table_name_is_refused_before_any_sql() -> None:
    from pyharvest.errors import ConfigError

    buffer = io.StringIO()
    op = Operations(MigrationContext.configure(dialect_name="sqlite", opts={"as_sql": True, "output_buffer": buffer}))
    with pytest.raises(ConfigError, match="not a valid table name"):
        alembic_create_outbox_table(op, "outbox; DROP TABLE users")
    assert buffer.getvalue() == ""


def test_ignore_outbox_tables() -> None:
    default = ignore_outbox_tables()
    assert not default("outbox", "table", {"schema_name": None})
    assert not default("OUTBOX", "table", {"schema_name": None})
    assert not default("outbox_quarantine", "table", {"schema_name": None})
    assert default("orders", "table", {"schema_name": None})
    assert default("outbox", "column", {"table_name": "orders"})

    named = ignore_outbox_tables("billing.events", "outbox", include_name=lambda name, type_, parents: name != "legacy")
    assert not named("events", "table", {"schema_name": "billing"})
    assert named("events", "table", {"schema_name": None})  # another schema's table of that name
    assert not named("events_quarantine", "table", {"schema_name": "billing"})
    assert not named("outbox", "table", {"schema_name": None})
    assert not named("legacy", "table", {"schema_name": None})  # the chained hook's answer
    assert named("orders", "table", {"schema_name": None})


def test_the_code_of_docs_alembic_md_runs_as_written() -> None:
    import re

    page = (EXAMPLE.parent.parent / "alembic.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.DOTALL | re.MULTILINE)
    own = [b for b in blocks if not b.lstrip().startswith("--8<--")]  # includes are the example's files, run above
    assert own
    for code in own:
        exec(compile(code, "docs/alembic.md", "exec"), {})
    included = re.findall(r'^--8<-- "examples/alembic/(.*)"$', page, re.MULTILINE)
    assert sorted(included) == sorted(
        str(p.relative_to(EXAMPLE)) for p in EXAMPLE.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )


def test_revision_autogenerate_runs_in_the_example(alembic_config, tmp_path) -> None:
    """docs/alembic.md's `alembic revision --autogenerate` works in the example as shipped (its
    script.py.mako included): after the example's migration, with a table added to the
    application's metadata, the new revision creates that table and leaves the outbox alone."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    cfg = alembic_config(url)
    command.upgrade(cfg, "head")
    where = Path(cfg.config_file_name).parent
    schema = where / "shop_schema.py"
    schema.write_text(
        schema.read_text()
        + '\nsa.Table("refunds", metadata, sa.Column("id", sa.Integer, primary_key=True))\n'
    )
    import sys

    sys.modules.pop("shop_schema", None)  # env.py imports the application's schema afresh, as a new process would
    script = command.revision(cfg, message="refunds", autogenerate=True, rev_id="0002")
    written = Path(script.path).read_text()  # type: ignore[union-attr]
    assert 'down_revision = \'0001\'' in written
    assert "op.create_table('refunds'" in written
    assert "outbox" not in written  # neither dropped nor compared
    command.upgrade(cfg, "head")  # and the revision it wrote runs
    engine = sa.create_engine(url)
    try:
        assert {"orders", "refunds", "outbox"} <= set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
