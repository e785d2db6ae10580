"""The hooks behind the inbox's and Spark's database differences, and the shared bulk insert.

Compiled checks run for every built-in dialect (SQL Server's and Oracle's ``MERGE`` included,
with no server); live checks run each hook on the databases of the test run. A dialect that
implements none of these hooks gets the generic answers, or a clear "not supported".
"""

from __future__ import annotations

import types
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from pyharvest.bindings.sql.bulk_insert import BulkInsert
from pyharvest.plugins import hookspecs
from pyharvest.plugins.api import Dialect, DialectOptions, UTCDateTime, hookimpl, load_dialect

BUILTIN = ["postgresql", "mysql", "sqlite", "mssql", "oracle"]
NEW_HOOKS = [
    "pyharvest_insert_new_keys",
    "pyharvest_upsert_from_select",
    "pyharvest_staging_table",
    "pyharvest_bulk_move_statements",
    "pyharvest_key_hash_guard",
    "pyharvest_index_names",
]


def _bare_dialect() -> Dialect:
    plugin = types.ModuleType("bare_dialect")

    @hookimpl
    def pyharvest_dialect() -> DialectOptions:
        return DialectOptions(name="bare")

    plugin.pyharvest_dialect = pyharvest_dialect  # type: ignore[attr-defined]
    return Dialect("bare", plugin)


def _move_tables() -> tuple[sa.Table, sa.Table, sa.Select[Any]]:
    md = sa.MetaData()
    target = sa.Table("accounts", md, sa.Column("id"), sa.Column("owner"), sa.Column("balance"))
    staging = sa.Table(
        "accounts_spark_x", md, sa.Column("id"), sa.Column("owner"), sa.Column("balance"), sa.Column("seq")
    )
    source = sa.select(staging.c.id, staging.c.owner, staging.c.balance).where(sa.text("(seq >= 0)"))
    return target, staging, source


def _compiled(dialect: Dialect, statement: sa.Executable) -> str:
    return " ".join(str(statement.compile(dialect=dialect.sqlalchemy_dialect())).split())  # type: ignore[attr-defined]


# --- the specs and the generic answers ---------------------------------------------------


@pytest.mark.parametrize("name", NEW_HOOKS)
def test_new_hooks_are_specified_first_result(name: str) -> None:
    spec = getattr(hookspecs, name)
    assert spec.__doc__ and len(spec.__doc__) > 100, f"{name} needs its documentation"
    opts = getattr(spec, f"{hookspecs.PROJECT_NAME}_spec")
    assert opts["firstresult"] is True


def test_a_dialect_without_the_hooks_gets_the_generic_answers() -> None:
    bare = _bare_dialect()
    target, staging, source = _move_tables()
    assert bare.upsert_from_select(target, source, ["id"], [staging.c.seq]) is None  # the caller says "not supported"
    assert bare.staging_table(target) is target
    assert bare.bulk_move_statements() == []
    from pyharvest.plugins.api import OutboxTable, parse_table_name

    # The generic guard: a CHECK constraint, quoted as the SQL standard does without a backend named.
    (guard,) = bare.key_hash_guard(OutboxTable.build(parse_table_name("outbox")), "outbox_key_hash_required")
    assert guard == "ALTER TABLE outbox ADD CONSTRAINT outbox_key_hash_required CHECK (kafka_key_hash IS NOT NULL)"
    engine = sa.create_engine("sqlite://")
    with engine.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE t (a INTEGER)")
        conn.exec_driver_sql("CREATE INDEX t_a ON t (a)")
        assert bare.index_names(conn, parse_table_name("t")) == {"t_a"}  # the generic answer: reflection
        assert bare.insert_new_keys(conn, target, "id", [1], {}) is None  # the generic look-up and insert
        assert bare.bulk_writer(conn, target, ["id"]) is None
    engine.dispose()


# --- compiled: every built-in dialect ----------------------------------------------------


UPSERT_SQL = {
    "postgresql": (
        "INSERT INTO accounts (id, owner, balance) SELECT DISTINCT ON (accounts_spark_x.id) accounts_spark_x.id, "
        "accounts_spark_x.owner, accounts_spark_x.balance FROM accounts_spark_x WHERE (seq >= 0) "
        "ORDER BY accounts_spark_x.id, accounts_spark_x.seq DESC "
        "ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, balance = excluded.balance"
    ),
    "mysql": (
        "INSERT INTO accounts (id, owner, balance) SELECT accounts_spark_x.id, accounts_spark_x.owner, "
        "accounts_spark_x.balance FROM accounts_spark_x WHERE (seq >= 0) ORDER BY accounts_spark_x.seq "
        "ON DUPLICATE KEY UPDATE owner = accounts_spark_x.owner, balance = accounts_spark_x.balance"
    ),
    "sqlite": (
        "INSERT INTO accounts (id, owner, balance) SELECT accounts_spark_x.id, accounts_spark_x.owner, "
        "accounts_spark_x.balance FROM accounts_spark_x WHERE (seq >= 0) ORDER BY accounts_spark_x.seq "
        "ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, balance = excluded.balance"
    ),
    "mssql": (
        "MERGE INTO accounts WITH (HOLDLOCK) AS tgt USING (SELECT ranked.id, ranked.owner, ranked.balance FROM "
        "(SELECT accounts_spark_x.id AS id, accounts_spark_x.owner AS owner, accounts_spark_x.balance AS balance, "
        "row_number() OVER (PARTITION BY accounts_spark_x.id ORDER BY accounts_spark_x.seq DESC) AS pyharvest_rank "
        "FROM accounts_spark_x WHERE (seq >= 0)) AS ranked WHERE ranked.pyharvest_rank = 1) AS src "
        "ON tgt.id = src.id WHEN MATCHED THEN UPDATE SET owner = src.owner, balance = src.balance "
        "WHEN NOT MATCHED BY TARGET THEN INSERT (id, owner, balance) VALUES (src.id, src.owner, src.balance);"
    ),
    "oracle": (
        "MERGE INTO accounts tgt USING (SELECT ranked.id, ranked.owner, ranked.balance FROM "
        "(SELECT accounts_spark_x.id AS id, accounts_spark_x.owner AS owner, accounts_spark_x.balance AS balance, "
        "row_number() OVER (PARTITION BY accounts_spark_x.id ORDER BY accounts_spark_x.seq DESC) AS pyharvest_rank "
        "FROM accounts_spark_x WHERE (seq >= 0)) ranked WHERE ranked.pyharvest_rank = 1) src "
        "ON (tgt.id = src.id) WHEN MATCHED THEN UPDATE SET tgt.owner = src.owner, tgt.balance = src.balance "
        "WHEN NOT MATCHED THEN INSERT (tgt.id, tgt.owner, tgt.balance) VALUES (src.id, src.owner, src.balance)"
    ),
}


@pytest.mark.parametrize("name", BUILTIN)
def test_upsert_compiles_to_the_databases_own_form(name: str) -> None:
    dialect = load_dialect(name)
    target, staging, source = _move_tables()
    statement = dialect.upsert_from_select(target, source, ["id"], [staging.c.seq])
    assert statement is not None
    assert _compiled(dialect, statement) == UPSERT_SQL[name]


@pytest.mark.parametrize("name", BUILTIN)
def test_upsert_of_keys_only_inserts_the_missing(name: str) -> None:
    dialect = load_dialect(name)
    target, staging, _ = _move_tables()
    statement = dialect.upsert_from_select(target, sa.select(staging.c.id), ["id"], [staging.c.seq])
    assert statement is not None
    sql = _compiled(dialect, statement)
    assert "owner" not in sql and "balance" not in sql
    if name in ("postgresql", "sqlite"):
        assert sql.endswith("ON CONFLICT (id) DO NOTHING")
    elif name == "mysql":
        assert sql.endswith("ON DUPLICATE KEY UPDATE id = accounts_spark_x.id")  # a no-op update
    else:
        assert "WHEN MATCHED" not in sql


def test_merge_escapes_colons_of_literal_values() -> None:
    # The MERGE is a text construct: a colon in the source must not read as a bind parameter.
    for name in ("mssql", "oracle"):
        dialect = load_dialect(name)
        target, staging, _ = _move_tables()
        source = sa.select(staging.c.id, staging.c.owner, staging.c.balance).where(staging.c.owner != "a:b")
        statement = dialect.upsert_from_select(target, source, ["id"], [staging.c.seq])
        assert statement is not None
        assert "'a:b'" in _compiled(dialect, statement)


def test_postgresql_stages_unlogged_without_indexes() -> None:
    md = sa.MetaData()
    table = sa.Table("t_spark_x", md, sa.Column("seq", sa.BigInteger, nullable=False), sa.Column("v", sa.Text),
                     schema="s")
    sa.Index("ix_t_spark_x", table.c.seq)
    staged = load_dialect("postgresql").staging_table(table)
    assert staged is not table and not staged.indexes
    assert [(c.name, type(c.type), c.nullable) for c in staged.columns] == [
        ("seq", sa.BigInteger, False), ("v", sa.Text, True)
    ]
    ddl = str(sa.schema.CreateTable(staged).compile(dialect=load_dialect("postgresql").sqlalchemy_dialect()))
    assert ddl.strip().startswith("CREATE UNLOGGED TABLE s.t_spark_x")
    for name in ("mysql", "sqlite", "mssql", "oracle"):
        assert load_dialect(name).staging_table(table) is table  # with its index


def test_only_postgresql_tunes_the_move() -> None:
    assert load_dialect("postgresql").bulk_move_statements() == ["SET LOCAL work_mem = '256MB'"]
    for name in ("mysql", "sqlite", "mssql", "oracle"):
        assert load_dialect(name).bulk_move_statements() == []


# --- live: the databases of this run ----------------------------------------------------


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    e = sa.create_engine(database_url)
    yield e
    e.dispose()


def _dialect_of(engine: sa.Engine) -> Dialect:
    from pyharvest.plugins.api import dialect_of

    found = dialect_of(engine)
    assert found is not None
    return found


def test_upsert_runs_and_the_last_row_of_a_key_wins(engine: sa.Engine, table_name: str) -> None:
    md = sa.MetaData()
    target = sa.Table(
        f"{table_name}_t", md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("owner", sa.String(20), nullable=False),
    )
    staging = sa.Table(
        f"{table_name}_s", md,
        sa.Column("id", sa.BigInteger), sa.Column("owner", sa.String(20)), sa.Column("seq", sa.BigInteger),
    )
    md.create_all(engine)
    dialect = _dialect_of(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(target), [{"id": 1, "owner": "old"}, {"id": 2, "owner": "old"}])
        conn.execute(sa.insert(staging), [
            {"id": 2, "owner": "first", "seq": 1}, {"id": 3, "owner": "new", "seq": 2},
            {"id": 2, "owner": "last", "seq": 3}, {"id": 2, "owner": "skip", "seq": 4},
        ])
        source = sa.select(staging.c.id, staging.c.owner).where(staging.c.seq < 4)
        statement = dialect.upsert_from_select(target, source, ["id"], [staging.c.seq])
        assert statement is not None
        conn.execute(statement)
        keys_only = dialect.upsert_from_select(target, sa.select(staging.c.id), ["id"], [staging.c.seq])
        assert keys_only is not None
    with engine.connect() as conn:
        assert sorted(conn.execute(sa.select(target.c.id, target.c.owner))) == [(1, "old"), (2, "last"), (3, "new")]


def _seen_table(name: str) -> sa.Table:
    return sa.Table(
        name, sa.MetaData(),
        sa.Column("sink", sa.String(100), primary_key=True),
        sa.Column("identity", sa.String(255), primary_key=True),
        sa.Column("applied_at", UTCDateTime, nullable=False),
    )


def test_insert_new_keys_returns_the_keys_already_there(engine: sa.Engine, table_name: str) -> None:
    seen = _seen_table(f"{table_name}_seen")
    seen.create(engine)
    dialect = _dialect_of(engine)
    first, second, third = (datetime(2024, 1, d, tzinfo=UTC) for d in (1, 2, 3))
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda conn, cursor, sql, *a: statements.append(sql))
    with engine.begin() as conn:
        present = dialect.insert_new_keys(conn, seen, "identity", ["a", "b"], {"sink": "s", "applied_at": first})
        if present is None:  # no way of its own: the caller's generic path (tested with the Spark sink)
            assert dialect.name != "postgresql" or engine.dialect.driver != "psycopg"
            return
        assert set(present) == set()
        # Every key was new: no look-up after the insert (the insert's row count said so).
        assert not [s for s in statements if "JOIN" in s.upper()], statements
        # Twice in one transaction: the keys of the first call are not mistaken for this one's.
        present = dialect.insert_new_keys(conn, seen, "identity", ["b", "c"], {"sink": "s", "applied_at": second})
        assert set(present) == {"b"}
    with engine.begin() as conn:
        many = [f"k{i}" for i in range(3000)]
        # Each call's values differ from every earlier call's (the sink's: the batch's time).
        present = dialect.insert_new_keys(conn, seen, "identity", ["c", *many], {"sink": "s", "applied_at": third})
        assert set(present or ()) == {"c"}
        present = dialect.insert_new_keys(conn, seen, "identity", ["c", "d"], {"sink": "other", "applied_at": first})
        assert set(present or ()) == set()  # another sink's keys are not this one's
    with engine.connect() as conn:
        rows = {(s, i): t for s, i, t in conn.execute(sa.select(seen))}
    assert len(rows) == 3005
    assert rows[("s", "a")] == first and rows[("s", "b")] == first and rows[("s", "c")] == second


def test_postgresql_inserts_new_keys_without_a_distinguishing_column(engine: sa.Engine, table_name: str) -> None:
    keys = sa.Table(
        f"{table_name}_keys", sa.MetaData(),
        sa.Column("scope", sa.String(10), primary_key=True),
        sa.Column("k", sa.BigInteger, primary_key=True, autoincrement=False),
    )
    keys.create(engine)
    dialect = _dialect_of(engine)
    with engine.begin() as conn:
        present = dialect.insert_new_keys(conn, keys, "k", [1, 2, 3], {"scope": "x"})
        if present is None:
            pytest.skip(f"{dialect.name} has no way of its own (the generic path runs)")
        assert set(present) == set()
        assert set(dialect.insert_new_keys(conn, keys, "k", [3, 4], {"scope": "x"}) or ()) == {3}
    with engine.connect() as conn:
        assert sorted(conn.execute(sa.select(keys.c.k)).scalars()) == [1, 2, 3, 4]


# --- BulkInsert: the shared helper -----------------------------------------------------


class _FakeWriter:
    min_rows = 3

    def __init__(self, accept: bool) -> None:
        self.accept = accept
        self.calls: list[list[Sequence[Any]]] = []

    def __call__(self, connection: sa.Connection, rows: Sequence[Sequence[Any]]) -> bool:
        if not self.accept:
            self.calls.append([])  # declines before reading, as the protocol asks
            return False
        read = list(rows)  # once: an iterator's rows are streamed
        self.calls.append(read)
        connection.execute(sa.text(f"INSERT INTO {self.table} (sink, identity, applied_at) VALUES (:s, :i, :t)"),
                           [{"s": s, "i": i, "t": t} for s, i, t in read])
        return True

    table = ""


def test_bulk_insert_uses_the_writer_for_large_batches_only(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'b.db'}")
    seen = _seen_table("seen")
    seen.create(engine)
    writer = _FakeWriter(accept=True)
    writer.table = "seen"
    monkeypatch.setattr(Dialect, "bulk_writer", lambda self, *a, **k: writer)
    insert = BulkInsert(seen, ["sink", "identity", "applied_at"], exact_types=True)
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    with engine.begin() as conn:
        assert insert(conn, [("s", "a", now), ("s", "b", now)]) == 2  # below min_rows: executemany
        assert writer.calls == []
        assert insert(conn, [("s", f"w{i}", now) for i in range(5)]) == 5
        assert insert(conn, (("s", f"g{i}", now) for i in range(4))) == 4  # an iterator: streamed, one call
    assert len(writer.calls) == 2
    # The column's TypeDecorator ran before the writer, as before an INSERT (naive UTC on SQLite).
    assert writer.calls[0][0] == ("s", "w0", datetime(2024, 5, 1, 12, 0))
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(seen)).scalar() == 11
    engine.dispose()


def test_bulk_insert_falls_back_when_the_writer_declines(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'b.db'}")
    seen = _seen_table("seen")
    seen.create(engine)
    writer = _FakeWriter(accept=False)
    monkeypatch.setattr(Dialect, "bulk_writer", lambda self, *a, **k: writer)
    insert = BulkInsert(seen, ["sink", "identity", "applied_at"], chunk_rows=4)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        assert insert(conn, [("s", f"x{i}", now) for i in range(10)]) == 10
    assert len(writer.calls) == 1
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(seen)).scalar() == 10
    engine.dispose()


def test_bulk_insert_asks_again_after_an_insert_failed(engine: sa.Engine, table_name: str) -> None:
    """A dialect may have declined for want of the table: once the table exists it is asked again."""
    table = _seen_table(f"{table_name}_late")
    insert = BulkInsert(table, exact_types=True)
    rows = [("s", f"i{i}", datetime.now(UTC)) for i in range(40)]
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        insert(conn, rows)
    assert engine not in insert._writers._writers  # the None answer forgotten
    table.create(engine)
    with engine.begin() as conn:
        assert insert(conn, rows) == 40
        writer = insert.writer(conn)
    if engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg":
        assert writer is not None and writer.types == ["text", "text", "timestamptz"]  # type: ignore[attr-defined]
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 40


def test_bulk_insert_pickles_without_its_caches(tmp_path: Any) -> None:
    import pickle

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'b.db'}")
    table = _seen_table("seen")
    table.create(engine)
    insert = BulkInsert(table)
    with engine.begin() as conn:
        insert(conn, [("s", "a", datetime.now(UTC))])
    copy = pickle.loads(pickle.dumps(insert))
    assert copy.columns == insert.columns and not copy._writers._writers  # no engine asked yet
    with engine.begin() as conn:
        assert copy(conn, [("s", "b", datetime.now(UTC))]) == 1
    engine.dispose()


def test_rows_are_made_on_demand_each_pass() -> None:
    from pyharvest.bindings.sql.bulk_insert import Rows

    made: list[int] = []

    def make() -> Iterator[tuple[int, str]]:
        for i in range(5):
            made.append(i)
            yield (i, f"v{i}")

    rows = Rows(5, make)
    assert len(rows) == 5 and made == []  # nothing made until iterated
    assert list(rows) == list(rows) == [(i, f"v{i}") for i in range(5)]
    assert rows[1:3] == [(1, "v1"), (2, "v2")] and rows[-1] == (4, "v4")
    with pytest.raises(IndexError):
        rows[5]
    assert not Rows(0, lambda: iter(()))


def test_bulk_insert_writes_lazy_rows_after_a_declining_writer(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyharvest.bindings.sql.bulk_insert import Rows

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'b.db'}")
    seen = _seen_table("seen")
    seen.create(engine)
    writer = _FakeWriter(accept=False)
    monkeypatch.setattr(Dialect, "bulk_writer", lambda self, *a, **k: writer)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        rows = Rows(7, lambda: (("s", f"r{i}", now) for i in range(7)))
        assert BulkInsert(seen, chunk_rows=3)(conn, rows) == 7
    assert len(writer.calls) == 1  # asked, declined
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(seen)).scalar() == 7
    engine.dispose()


def test_bulk_insert_streams_an_iterator_to_the_writer_once(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'b.db'}")
    seen = _seen_table("seen")
    seen.create(engine)

    class ReadsTwice:
        min_rows = 2

        def __call__(self, connection: sa.Connection, rows: Sequence[Sequence[Any]]) -> bool:
            list(rows)
            list(rows)
            return True

    monkeypatch.setattr(Dialect, "bulk_writer", lambda self, *a, **k: ReadsTwice())
    now = datetime.now(UTC)
    with engine.begin() as conn:
        assert BulkInsert(seen)(conn, [("s", "a", now), ("s", "b", now)]) == 2  # a list may be read twice
        with pytest.raises(RuntimeError, match="read once"):  # an iterator is not silently lost
            BulkInsert(seen)(conn, (("s", f"i{i}", now) for i in range(3)))
    engine.dispose()


def test_the_upsert_construct_runs_its_standard_merge_on_a_live_database(database_url: str, dialect: str) -> None:
    """``UpsertFromSelect`` compiles to the SQL standard's ``MERGE`` where no dialect registered
    a form of its own: run for real where the database has ``MERGE`` (PostgreSQL 15+), so the
    construct that SQL Server's and Oracle's forms share is proven to execute, keys' last rows won."""
    from pyharvest.plugins.api import UpsertFromSelect

    if dialect != "postgresql":
        pytest.skip("PostgreSQL 15 runs the standard MERGE; its plugin upserts with ON CONFLICT")
    engine = sa.create_engine(database_url)
    suffix = uuid.uuid4().hex[:8]
    md = sa.MetaData()
    target = sa.Table(f"merge_t_{suffix}", md, sa.Column("id", sa.Integer, primary_key=True), sa.Column("v", sa.Text))
    staging = sa.Table(f"merge_s_{suffix}", md, sa.Column("id", sa.Integer), sa.Column("v", sa.Text),
                       sa.Column("seq", sa.Integer))
    md.create_all(engine)
    try:
        with engine.begin() as tx:
            tx.execute(target.insert(), [{"id": 1, "v": "old"}, {"id": 2, "v": "kept"}])
            tx.execute(staging.insert(), [{"id": 1, "v": "a", "seq": 1}, {"id": 1, "v": "b:c", "seq": 2},
                                          {"id": 3, "v": "new", "seq": 3}])
            source = sa.select(staging.c.id, staging.c.v).where(staging.c.seq > 0)
            tx.execute(UpsertFromSelect(target, source, ["id"], [staging.c.seq]))
        with engine.connect() as c:
            assert dict(c.execute(sa.select(target.c.id, target.c.v)).all()) == {1: "b:c", 2: "kept", 3: "new"}
    finally:
        md.drop_all(engine)
        engine.dispose()
