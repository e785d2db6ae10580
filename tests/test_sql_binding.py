"""The SQL binding against live databases: start-up checks, names, data sources, plans."""

from __future__ import annotations

import threading
import uuid

import pytest
import sqlalchemy as sa

from pyharvest.bindings.sql import create_binding, create_outbox_table
from pyharvest.core.errors import BindingError, ConfigError
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.core.ports.database import DatabaseBinding
from pyharvest.stasher import Stasher


def test_binding_satisfies_the_protocol(database_url: str, table_name: str) -> None:
    create_outbox_table(database_url, table_name)
    binding = create_binding(database_url, table_name)
    try:
        assert isinstance(binding, DatabaseBinding)
        assert binding.mark(str(uuid.uuid4()), 0) == []
    finally:
        binding.dispose()


def test_missing_table_names_it_and_says_how_to_create_it(database_url: str, table_name: str) -> None:
    with pytest.raises(BindingError) as e:
        create_binding(database_url, table_name)
    assert table_name in str(e.value) and "reaper init-db" in str(e.value)


def test_missing_columns_are_named(database_url: str, table_name: str) -> None:
    engine = sa.create_engine(database_url)
    with engine.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE {table_name} (id INTEGER PRIMARY KEY, kafka_topic VARCHAR(10))")
    engine.dispose()
    with pytest.raises(BindingError) as e:
        create_binding(database_url, table_name)
    msg = str(e.value)
    assert table_name in msg and "create_time" in msg and "kafka_headers" in msg and "leader_id" in msg


def test_create_outbox_table_is_idempotent(database_url: str, table_name: str) -> None:
    create_outbox_table(database_url, table_name)
    create_outbox_table(database_url, table_name)
    create_binding(database_url, table_name).dispose()


def test_injection_through_table_name_is_refused(database_url: str) -> None:
    with pytest.raises(ConfigError, match="outboxTable"):
        create_binding(database_url, "outbox; DROP TABLE x")
    with pytest.raises(ConfigError, match="outboxTable"):
        create_outbox_table(database_url, "x) --")


def test_reserved_word_table_name_works(database_url: str, table_name: str) -> None:
    # "order" is reserved everywhere; the table_name fixture drops tables by prefix, so
    # this one is cleaned up explicitly.
    engine = sa.create_engine(database_url)
    name = "order"
    quoted = engine.dialect.identifier_preparer.quote(name)
    with engine.begin() as c:
        c.exec_driver_sql(f"DROP TABLE IF EXISTS {quoted}")
    try:
        create_outbox_table(database_url, name)
        binding = create_binding(database_url, name)
        with engine.begin() as tx:
            Stasher(name).stash(tx, OutboxRecord("t", "k", b"v"))
        got = binding.mark(str(uuid.uuid4()), 5)
        assert [r.value for r in got] == [b"v"]
        assert binding.purge([got[0].id]) == 1  # type: ignore[list-item]
        binding.dispose()
    finally:
        with engine.begin() as c:
            c.exec_driver_sql(f"DROP TABLE IF EXISTS {quoted}")
        engine.dispose()


def test_schema_qualified_table(dialect: str, database_url: str, table_name: str) -> None:
    schema = {"postgresql": "pyh_schema", "mysql": "pyh_schema", "sqlite": "main"}.get(dialect)
    if schema is None:
        pytest.skip(f"no schema set up for {dialect}")
    engine = sa.create_engine(database_url)
    if dialect == "postgresql":
        with engine.begin() as c:
            c.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    elif dialect == "mysql":
        with engine.begin() as c:
            c.exec_driver_sql(f"CREATE DATABASE IF NOT EXISTS {schema}")
    qualified = f"{schema}.{table_name}"
    try:
        create_outbox_table(database_url, qualified)
        binding = create_binding(database_url, qualified)
        with engine.begin() as tx:
            Stasher(qualified).stash(tx, OutboxRecord("t", "k", b"q"))
        assert [r.value for r in binding.mark(str(uuid.uuid4()), 5)] == [b"q"]
        binding.dispose()
    finally:
        with engine.begin() as c:
            c.exec_driver_sql(f"DROP TABLE IF EXISTS {schema}.{table_name}")
        engine.dispose()


def test_repr_and_errors_hide_the_password() -> None:
    url = "postgresql+psycopg://postgres:topsecret@127.0.0.1:5432/test"
    with pytest.raises(BindingError) as e:
        create_binding(url, "no_such_table_" + uuid.uuid4().hex[:6])
    assert "topsecret" not in str(e.value)
    # trust authentication ignores the password, so the binding can be built
    name = "outbox_repr_" + uuid.uuid4().hex[:6]
    try:
        create_outbox_table(url, name)
    except BindingError as err:
        pytest.skip(f"postgresql unavailable: {err}")
    binding = create_binding(url, name)
    try:
        assert "topsecret" not in repr(binding) and "***" in repr(binding)
    finally:
        with binding.engine.begin() as c:
            c.exec_driver_sql(f"DROP TABLE {name}")
        binding.dispose()


@pytest.fixture
def pg_url(dialect: str, database_url: str) -> str:
    if dialect != "postgresql":
        pytest.skip("PostgreSQL only")
    return database_url


def test_libpq_dsn_data_source(pg_url: str, table_name: str) -> None:
    url = sa.make_url(pg_url)
    dsn = f"host={url.host} port={url.port or 5432} user={url.username} password= dbname={url.database} sslmode=disable"
    create_outbox_table(dsn, table_name)
    binding = create_binding(dsn, table_name)
    try:
        assert binding.dialect.name == "postgresql"
        assert binding.engine.url.drivername == "postgresql+psycopg"
    finally:
        binding.dispose()


def test_postgresql_mark_walks_the_primary_key(pg_url: str, table_name: str) -> None:
    """The mark must scan the primary key in order, not scan and sort the table."""
    create_outbox_table(pg_url, table_name)
    binding = create_binding(pg_url, table_name)
    try:
        with binding.engine.begin() as c:
            c.exec_driver_sql(
                f"INSERT INTO {table_name} (kafka_topic, kafka_key, kafka_value, leader_id) "
                "SELECT 't', 'k' || mod(g, 100), 'v', CASE WHEN mod(g, 2) = 0 THEN 'x' END FROM generate_series(1, 20000) g"
            )
            c.exec_driver_sql(f"ANALYZE {table_name}")
            stmt = binding.marker.statement(100)  # type: ignore[attr-defined]
            sql = str(stmt.compile(dialect=c.dialect, compile_kwargs={"render_postcompile": True}))
            plan = "\n".join(
                r[0] for r in c.exec_driver_sql("EXPLAIN " + sql, {"leader_id": str(uuid.uuid4()), "after": 10_000})
            )
        assert f"Index Scan using {table_name}_pkey" in plan, plan
        assert "Seq Scan" not in plan, plan
        # The key-set cursor's start bounds the index walk itself (it starts there), not a
        # filter over rows walked from the lowest id.
        assert any("Index Cond" in line and "id >" in line for line in plan.splitlines()), plan
        # The binding's connections never use server-side prepared statements.
        if binding.engine.dialect.driver == "psycopg":
            with binding.engine.connect() as c:
                assert c.connection.dbapi_connection.prepare_threshold is None  # type: ignore[union-attr]
    finally:
        binding.dispose()


def test_mark_and_purge_from_two_threads(database_url: str, table_name: str) -> None:
    create_outbox_table(database_url, table_name)
    binding = create_binding(database_url, table_name)
    engine = sa.create_engine(binding.engine.url)
    with engine.begin() as tx:
        Stasher(table_name).stash_many(tx, [OutboxRecord("t", f"k{i}", b"v") for i in range(300)])
    leader = str(uuid.uuid4())
    marked: list[int] = []
    purged = [0]
    lock = threading.Condition()
    done = threading.Event()

    def purger() -> None:
        while not (done.is_set() and not marked):
            with lock:
                lock.wait_for(lambda: marked or done.is_set(), timeout=1)
                batch, marked[:] = list(marked), []
            if batch:
                purged[0] += binding.purge(batch)

    t = threading.Thread(target=purger)
    t.start()
    while got := binding.mark(leader, 20):
        with lock:
            marked.extend(r.id for r in got)  # type: ignore[misc]
            lock.notify()
    done.set()
    with lock:
        lock.notify()
    t.join(30)
    binding.dispose()
    engine.dispose()
    assert purged[0] == 300


def test_reset_with_a_leader_id_leaves_rows_a_successor_marked(database_url: str, table_name: str) -> None:
    create_outbox_table(database_url, table_name)
    engine = sa.create_engine(database_url)
    with engine.begin() as tx:
        Stasher(table_name).prepare(tx).stash_many(OutboxRecord("t", f"k{i}", b"v") for i in range(4))
    engine.dispose()
    binding = create_binding(database_url, table_name)
    try:
        old, new = str(uuid.uuid4()), str(uuid.uuid4())
        ids = [r.id for r in binding.mark(old, 4)]
        assert len(binding.mark(new, 2)) == 2  # the successor took over the two oldest
        # The deposed leader's late reset touches only the rows it still holds.
        assert binding.reset(ids, old) == 2
        assert [r.id for r in binding.mark(new, 10)] == ids[2:]
    finally:
        binding.dispose()
