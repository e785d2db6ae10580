"""pyharvest.django on live databases: the migration makes init-db's table, stash() writes in
Django's transaction, and manage.py reaper gets its data source from DATABASES.

Tests taking ``django_db`` run once per database (they use the ``dialect`` fixture); the
data-source and command tests need no database.
"""

from __future__ import annotations

import contextlib
import json
import uuid

import pytest
import sqlalchemy as sa
import yaml

from pyharvest import OutboxRecord
from pyharvest.bindings.sql import check_table, create_binding, create_outbox_table
from pyharvest.core.outbox.headers import decode_headers
from pyharvest.errors import BindingError, InvalidRecordError
from pyharvest.plugins.api import load_dialect, parse_table_name
from tests.helpers.django import DjangoDatabase

pytest.importorskip("django")

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402
from django.test.utils import CaptureQueriesContext, override_settings  # noqa: E402

from pyharvest.django import data_source, stash, stash_many  # noqa: E402


def migrate(*args: str) -> None:
    call_command("migrate", *args, verbosity=0)


def rows(db: DjangoDatabase, table: str = "outbox") -> list[tuple]:
    engine = db.engine()
    try:
        with engine.connect() as c:
            return [
                tuple(r)
                for r in c.execute(
                    sa.text(f"SELECT kafka_topic, kafka_key, kafka_value, kafka_headers FROM {table} ORDER BY id")
                )
            ]
    finally:
        engine.dispose()


def columns(engine: sa.Engine, table: str) -> list[tuple]:
    return [
        (c["name"], str(c["type"]), c["nullable"], c.get("autoincrement"))
        for c in sa.inspect(engine).get_columns(table)
    ]


# ---------------------------------------------------------------------- the migration


def test_migrate_creates_the_table_init_db_makes_and_zero_drops_it(django_db: DjangoDatabase) -> None:
    migrate("pyharvest")
    url = data_source("default")
    engine = django_db.engine()
    try:
        dialect = load_dialect(django_db.dialect)
        assert check_table(engine, parse_table_name("outbox"), dialect) == "native"
        create_outbox_table(url, "outbox")  # reaper init-db: accepts the table as it is
        create_outbox_table(url, "outbox_by_init_db")
        assert columns(engine, "outbox") == columns(engine, "outbox_by_init_db")
        assert sa.inspect(engine).get_pk_constraint("outbox")["constrained_columns"] == ["id"]
    finally:
        engine.dispose()
    migrate("pyharvest", "zero")
    engine = django_db.engine()
    try:
        assert not sa.inspect(engine).has_table("outbox")
    finally:
        engine.dispose()


def test_sqlmigrate_shows_the_plugins_ddl(django_db: DjangoDatabase) -> None:
    from pyharvest.bindings.sql import schema_ddl

    shown = call_command("sqlmigrate", "pyharvest", "0001")
    expected = schema_ddl(django_db.dialect, "outbox").strip().rstrip(";")
    assert expected in shown


@override_settings(PYHARVEST_OUTBOX_TABLE="shop_outbox")
def test_the_setting_names_the_table(django_db: DjangoDatabase) -> None:
    migrate("pyharvest")
    with transaction.atomic():
        stash(OutboxRecord("t", "k", b"v"))
    assert rows(django_db, "shop_outbox") == [("t", "k", b"v", "[]")]


def test_create_outbox_table_operation_makes_a_second_outbox(django_db: DjangoDatabase) -> None:
    from pyharvest.django.operations import CreateOutboxTable

    with connection.schema_editor() as editor:
        CreateOutboxTable(table="audit_outbox").database_forwards("pyharvest", editor, None, None)
    stash(OutboxRecord("audit", "k", b"v"), table="audit_outbox")
    assert rows(django_db, "audit_outbox") == [("audit", "k", b"v", "[]")]
    with connection.schema_editor() as editor:
        CreateOutboxTable(table="audit_outbox").database_backwards("pyharvest", editor, None, None)
    engine = django_db.engine()
    try:
        assert not sa.inspect(engine).has_table("audit_outbox")
    finally:
        engine.dispose()


# ---------------------------------------------------------------------- stash


def test_stash_in_atomic_commits_and_the_harvester_marks_it(django_db: DjangoDatabase) -> None:
    migrate("pyharvest")
    record = OutboxRecord("orders", "ключ-1", b"\x00\xff binary", headers=[("h", "v"), ("b", b"\x01")])
    with transaction.atomic():
        stash(record)
        assert django_db.dialect == "sqlite" or django_db.count() == 0  # not visible before the commit
    assert django_db.count() == 1
    binding = create_binding(data_source("default"), "outbox")
    try:
        (marked,) = binding.mark(str(uuid.uuid4()), 10)
        assert (marked.topic, marked.key, marked.value, list(marked.headers)) == (
            "orders", "ключ-1", b"\x00\xff binary", [("h", "v"), ("b", b"\x01")],
        )
        assert marked.create_time is not None and marked.create_time.tzinfo is not None
        assert binding.purge([marked.id]) == 1
    finally:
        binding.dispose()


def test_a_record_stashed_in_a_rolled_back_block_is_never_in_the_table(django_db: DjangoDatabase) -> None:
    migrate("pyharvest")
    with pytest.raises(RuntimeError), transaction.atomic():
        stash(OutboxRecord("t", "rolled-back", b"x"))
        raise RuntimeError("the business change failed")
    with transaction.atomic():  # a savepoint rolled back inside a committed block
        stash(OutboxRecord("t", "outer", b"kept"))
        with pytest.raises(RuntimeError), transaction.atomic():
            stash_many([OutboxRecord("t", "inner", b"1"), OutboxRecord("t", "inner", b"2")])
            raise RuntimeError("inner")
    with transaction.atomic():
        stash(OutboxRecord("t", "marked-for-rollback", b"x"))
        transaction.set_rollback(True)
    assert rows(django_db) == [("t", "outer", b"kept", "[]")]


def test_the_documented_example_commits_and_rolls_back_with_the_order(django_db: DjangoDatabase) -> None:
    import json

    from shop.models import Order
    from shop.services import place_order

    migrate()  # every app: pyharvest's outbox and the example's orders
    order = place_order("alice", 1200)
    with pytest.raises(ValueError, match="must cost"):
        place_order("bob", 0)
    assert list(Order.objects.values_list("customer", flat=True)) == ["alice"]
    ((topic, key, value, _),) = rows(django_db)
    assert (topic, key) == ("orders", str(order.pk))
    assert json.loads(value) == {"order": order.pk, "customer": "alice", "total_cents": 1200}


def test_stash_many_writes_all_in_order(django_db: DjangoDatabase) -> None:
    migrate("pyharvest")
    records = [OutboxRecord("t", f"k{i % 3}", f"v{i}", headers=[("n", str(i))]) for i in range(25)]
    with transaction.atomic():
        assert stash_many(records) == 25
        assert stash_many([]) == 0
    got = rows(django_db)
    assert [(k, v) for _t, k, v, _h in got] == [(f"k{i % 3}", f"v{i}".encode()) for i in range(25)]
    assert list(decode_headers(got[3][3])) == [("n", "3")]


def test_stash_serialises_values_and_adds_cloudevents_headers(django_db: DjangoDatabase) -> None:
    # A serialiser of confluent-kafka's shape (the Schema Registry's are tested against a real
    # registry in tests/test_typed_messages.py): called with the record topic's context.
    from pyharvest.stasher import CloudEvents, SchemaMismatchError

    def serializer(value, ctx):
        if "id" not in value:
            raise ValueError("'id' is a required property")
        return f"{ctx.topic}:{json.dumps(value, sort_keys=True)}".encode()

    migrate("pyharvest")
    events = CloudEvents(source="/orders", type="order.created")
    with transaction.atomic():
        stash(OutboxRecord("orders", "k", {"id": 1}), value_serializer=serializer, cloud_events=events)
        assert stash_many([OutboxRecord("orders", "k", {"id": 2})], value_serializer=serializer) == 1
    with pytest.raises(SchemaMismatchError, match="'id' is a required property"), transaction.atomic():
        stash(OutboxRecord("orders", "k", {"no": "id"}), value_serializer=serializer)
    (first, second) = rows(django_db)
    assert (first[2], second[2]) == (b'orders:{"id": 1}', b'orders:{"id": 2}')
    headers = dict(decode_headers(first[3]))
    assert headers["ce_source"] == "/orders" and headers["ce_type"] == "order.created" and headers["ce_id"]
    assert headers["content-type"] == "application/octet-stream" and not list(decode_headers(second[3]))


def test_outside_atomic_each_call_is_its_own_transaction(django_db: DjangoDatabase) -> None:
    migrate("pyharvest")
    assert connection.get_autocommit()
    stash(OutboxRecord("t", "a", b"1"))
    assert stash_many([OutboxRecord("t", "b", b"2"), OutboxRecord("t", "c", b"3")]) == 2
    assert connection.get_autocommit() and not connection.in_atomic_block
    assert [k for _t, k, _v, _h in rows(django_db)] == ["a", "b", "c"]


def test_a_bad_record_is_refused_before_anything_is_written(django_db: DjangoDatabase) -> None:
    migrate("pyharvest")
    good = OutboxRecord("t", "k", b"v")
    with CaptureQueriesContext(connection) as queries:
        renamed = OutboxRecord("t", "k", b"v")
        renamed.topic = "bad topic!"  # after it was built: the stash checks again
        with pytest.raises(InvalidRecordError, match="topic"):
            stash(renamed)
        with pytest.raises(InvalidRecordError, match="key"):
            stash_many([good, good, OutboxRecord("t", None, b"v")])  # type: ignore[arg-type]
        with pytest.raises(InvalidRecordError):
            stash("not a record")  # type: ignore[arg-type]
    assert len(queries) == 0  # refused before touching the database
    with transaction.atomic():  # and a refusal leaves the caller's block usable
        with pytest.raises(InvalidRecordError):
            stash(OutboxRecord("t", "k", 42))  # type: ignore[arg-type]
        stash(good)
    assert rows(django_db) == [("t", "k", b"v", "[]")]


def test_an_unmigrated_table_is_a_clear_error(django_db: DjangoDatabase) -> None:
    with pytest.raises(BindingError, match=r"outbox table 'outbox' does not exist in database 'default'.*migrate pyharvest"):
        stash(OutboxRecord("t", "k", b"v"))
    with transaction.atomic():
        with pytest.raises(BindingError, match="does not exist"):
            stash_many([OutboxRecord("t", "k", b"v")], table="nowhere")
        with connection.cursor() as cursor:  # the caller's transaction is still usable
            cursor.execute("SELECT 1")
    migrate("pyharvest")
    stash(OutboxRecord("t", "k", b"v"))  # and once migrated, it works
    assert django_db.count() == 1


def test_the_compiled_insert_comes_from_the_plugin_and_is_cached(django_db: DjangoDatabase) -> None:
    from pyharvest.django import stasher as django_stasher

    migrate("pyharvest")
    stash(OutboxRecord("t", "k", b"v"))
    insert = django_stasher._insert(connection, parse_table_name("outbox"), True)
    assert insert is django_stasher._insert(connection, parse_table_name("outbox"), True)
    assert insert.sql.startswith(
        "INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_headers, kafka_key_hash)"
    )
    assert insert.sql.count("%s") == 6  # Django's placeholder style, whatever the driver's
    with CaptureQueriesContext(connection) as queries:
        stash(OutboxRecord("t", "k2", b"v"))
    # One statement: the table check happens once per connection, and autocommit needs no BEGIN/COMMIT.
    assert [q["sql"].split(" VALUES")[0] for q in queries] == [insert.sql.split(" VALUES")[0]]


# ---------------------------------------------------------------------- data source (no database)


@pytest.fixture
def alias(django_settings):
    """Add DATABASES aliases for the test; removed afterwards."""
    added: list[str] = []

    def add(**db) -> str:
        name = f"t{uuid.uuid4().hex[:8]}"
        connections.settings[name] = connections.configure_settings({"default": {}, name: db})[name]
        added.append(name)
        return name

    yield add
    for name in added:
        with contextlib.suppress(AttributeError):
            del connections[name]
        del connections.settings[name]


def test_data_source_from_databases_postgresql(alias) -> None:
    name = alias(
        ENGINE="django.db.backends.postgresql", NAME="app", USER="svc", PASSWORD="p@ss:w/rd", HOST="db.internal",
        PORT="6432", OPTIONS={"sslmode": "require", "isolation_level": 1, "server_side_binding": True},
    )
    url = sa.make_url(data_source(name))
    assert url.drivername in ("postgresql+psycopg", "postgresql+psycopg2")
    assert url.drivername.endswith(connections[name].Database.__name__)
    assert (url.username, url.password, url.host, url.port, url.database) == ("svc", "p@ss:w/rd", "db.internal", 6432, "app")
    assert dict(url.query) == {"sslmode": "require"}  # Django's own OPTIONS are left out


def test_data_source_from_databases_mysql_and_sqlite(alias, tmp_path) -> None:
    mysql = alias(ENGINE="django.db.backends.mysql", NAME="shop", USER="root", HOST="127.0.0.1", PORT=3306,
                  OPTIONS={"charset": "utf8mb4", "init_command": "SET sql_mode='STRICT_TRANS_TABLES'"})
    url = sa.make_url(data_source(mysql))
    # MySQLdb here is PyMySQL standing in for mysqlclient: the URL names the driver really loaded.
    assert url.drivername == f"mysql+{connections[mysql].Database.__name__.lower()}"
    assert (url.username, url.password, url.host, url.port, url.database) == ("root", None, "127.0.0.1", 3306, "shop")
    assert dict(url.query) == {"charset": "utf8mb4"}
    sqlite = alias(ENGINE="django.db.backends.sqlite3", NAME=tmp_path / "db.sqlite3")
    assert data_source(sqlite) == f"sqlite+pysqlite:///{tmp_path / 'db.sqlite3'}"


def test_data_source_refuses_what_a_url_cannot_carry(alias) -> None:
    from pyharvest.errors import ConfigError

    ssl = alias(ENGINE="django.db.backends.mysql", NAME="x", OPTIONS={"ssl": {"ca": "/ca.pem"}})
    with pytest.raises(ConfigError, match=r"OPTIONS'\]\['ssl'\] is a dict.*harvest.dataSource"):
        data_source(ssl)
    socket = alias(ENGINE="django.db.backends.postgresql", NAME="x", HOST="/var/run/postgresql")
    with pytest.raises(ConfigError, match="socket path"):
        data_source(socket)
    with pytest.raises(ConfigError, match="no database 'nowhere'"):
        data_source("nowhere")


# ---------------------------------------------------------------------- manage.py reaper (no database)


def printed_config(capsys, *args: str) -> dict:
    capsys.readouterr()
    call_command("reaper", "--print-config", *args)
    return yaml.safe_load(capsys.readouterr().out)


def test_reaper_command_takes_the_data_source_from_databases(alias, capsys, monkeypatch) -> None:
    from pyharvest.core.config.settings import mask_data_source

    name = alias(ENGINE="django.db.backends.postgresql", NAME="app", USER="svc", PASSWORD="secret", HOST="db", PORT=5432)
    monkeypatch.setenv("PYHARVEST_HARVEST__LIMITS__MAXINFLIGHTRECORDS", "77")
    with override_settings(PYHARVEST_OUTBOX_TABLE="app.events_outbox"):
        printed = printed_config(capsys, "--database", name)
    harvest = printed["harvest"]
    assert harvest["dataSource"] == mask_data_source(data_source(name))
    assert "secret" not in harvest["dataSource"] and "svc:***@db:5432/app" in harvest["dataSource"]
    assert harvest["outboxTable"] == "app.events_outbox"
    assert harvest["leaderGroupID"] == "shop"  # from settings.PYHARVEST (the example's)
    assert harvest["baseKafkaConfig"] == {"bootstrap.servers": "localhost:9092"}
    assert harvest["limits"]["maxInFlightRecords"] == 77  # environment overrides apply, as for reaper


def test_reaper_command_reads_a_file_whose_keys_win(alias, capsys, tmp_path) -> None:
    name = alias(ENGINE="django.db.backends.sqlite3", NAME=str(tmp_path / "db.sqlite3"))
    file = tmp_path / "reaper.yaml"
    file.write_text("harvest:\n  leaderGroupID: from-file\n  outboxTable: other\nlogging:\n  level: Debug\n")
    printed = printed_config(capsys, "-f", str(file), "--database", name)
    assert printed["harvest"]["leaderGroupID"] == "from-file"
    assert printed["harvest"]["outboxTable"] == "other"
    assert printed["harvest"]["dataSource"] == data_source(name)
    assert printed["logging"]["level"] == "Debug"
    file.write_text("harvest:\n  dataSource: postgresql+psycopg://elsewhere/db\n")
    assert printed_config(capsys, "-f", str(file), "--database", name)["harvest"]["dataSource"] == (
        "postgresql+psycopg://elsewhere/db"
    )


def test_reaper_command_reports_bad_configuration(alias, tmp_path) -> None:
    from django.core.management import CommandError

    file = tmp_path / "reaper.yaml"
    file.write_text("harvest:\n  leaderGroupId: typo\n")
    with pytest.raises(CommandError, match=r"invalid configuration: harvest\.leaderGroupId: unknown key") as e:
        call_command("reaper", "-f", str(file))
    assert e.value.returncode == 2
    with override_settings(PYHARVEST=["not", "a", "mapping"]), pytest.raises(CommandError, match="PYHARVEST"):
        call_command("reaper", "--print-config")


# ---------------------------------------------------------------------- docs/django.md


def python_blocks(path) -> list[str]:
    """The ```python blocks of a page that are not snippet includes (those are files the
    tests run on their own)."""
    import re

    blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(), re.DOTALL | re.MULTILINE)
    return [b for b in blocks if not b.lstrip().startswith("--8<--")]


def test_the_code_of_docs_django_md_runs_as_written(django_db: DjangoDatabase) -> None:
    from django.db.migrations.state import ProjectState

    from tests.helpers.django import EXAMPLE

    migrate("pyharvest")
    blocks = python_blocks(EXAMPLE.parent.parent / "django.md")
    assert len(blocks) == 2
    for code in blocks:
        namespace: dict = {"__name__": "docs_django_md"}
        exec(compile(code, "docs/django.md", "exec"), namespace)
        migration_class = namespace.get("Migration")
        if migration_class is not None:  # a migration: apply it as migrate would
            with connection.schema_editor() as editor:
                migration_class("0002_audit_outbox", "shop").apply(ProjectState(), editor)
    assert namespace["written"] == 2
    assert [k for _t, k, _v, _h in rows(django_db)] == ["42", "42", "42"]
    assert rows(django_db, "audit_outbox") == []  # the second outbox, created by the documented migration


def test_records_stashed_through_django_carry_their_key_hash(django_db: DjangoDatabase) -> None:
    # Shards place a row by its stored key hash: a Django writer must store it as the stasher does.
    from pyharvest.core.outbox.keys import key_hash

    migrate("pyharvest")
    stash_many([OutboxRecord("t", f"key-{i}", b"v") for i in range(5)])
    with connection.cursor() as cursor:
        cursor.execute("SELECT kafka_key, kafka_key_hash FROM outbox")
        rows = cursor.fetchall()
    assert sorted(rows) == sorted((f"key-{i}", key_hash(f"key-{i}")) for i in range(5))
