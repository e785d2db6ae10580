"""Stasher specifics beyond the conformance suite: batching, caching, argument checks."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from pyharvest import stasher as stasher_module
from pyharvest.bindings.sql import create_binding, create_outbox_table
from pyharvest.core.errors import ConfigError
from pyharvest.core.outbox.records import InvalidRecordError, OutboxRecord
from pyharvest.stasher import Stasher, stash
from tests.helpers.stash_counts import CountedText, counting


@pytest.fixture
def outbox(database_url: str, table_name: str):  # type: ignore[no-untyped-def]
    create_outbox_table(database_url, table_name)
    binding = create_binding(database_url, table_name)
    engine = sa.create_engine(binding.engine.url)
    yield binding, engine, table_name
    binding.dispose()
    engine.dispose()


def test_batch_flushes_every_n_and_at_the_end(outbox) -> None:  # type: ignore[no-untyped-def]
    binding, engine, table = outbox
    with engine.begin() as tx, Stasher(table).batch(tx, flush_every=3) as out:
        for i in range(7):
            out.stash(OutboxRecord("b", f"k{i}", str(i)))
    assert [r.value for r in binding.mark(str(uuid.uuid4()), 10)] == [str(i).encode() for i in range(7)]


def test_batch_discards_on_error_and_validates_early(outbox) -> None:  # type: ignore[no-untyped-def]
    binding, engine, table = outbox
    with pytest.raises(RuntimeError):
        with engine.begin() as tx, Stasher(table).batch(tx) as out:
            out.stash(OutboxRecord("b", "k", b"1"))
            raise RuntimeError("caller fails")
    with engine.begin() as tx, Stasher(table).batch(tx) as out:
        with pytest.raises(InvalidRecordError):
            out.stash(OutboxRecord("b", "", b"1"))
    assert binding.mark(str(uuid.uuid4()), 10) == []


def test_statements_are_cached_per_dialect_and_table(outbox) -> None:  # type: ignore[no-untyped-def]
    _, engine, table = outbox
    with engine.begin() as tx:
        a = Stasher(table).prepare(tx)
        b = Stasher(table).prepare(tx)
        stash(tx, OutboxRecord("c", "k", b"1"), table=table)
    assert a._insert is b._insert


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="outboxTable"):
        Stasher("x; DROP TABLE y")
    with pytest.raises(ValueError, match="layout"):
        Stasher("outbox", layout="other")
    with pytest.raises(TypeError, match="Connection or Session"):
        Stasher("outbox").prepare(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidRecordError):
        stash(object(), "not a record")  # type: ignore[arg-type]
    assert stasher_module.__all__


def test_stashed_columns_are_what_the_encoder_writes() -> None:
    from pyharvest.bindings.sql import GOHARVEST, NATIVE, OutboxTable, parse_table_name

    record = OutboxRecord("t", "k", b"v", (("h", "v"),))
    for layout in (NATIVE, GOHARVEST):
        table = OutboxTable.build(parse_table_name("outbox"), layout)
        assert set(table.encode(record, table.now(), record.value)) == set(table.stashed_columns)


def _records(n: int, key: str = "k") -> list[OutboxRecord]:
    return [OutboxRecord("bulk", f"{key}{i}", f"v{i}".encode(), (("h", str(i)),)) for i in range(n)]


@pytest.fixture
def pg_outbox(outbox, dialect: str):  # type: ignore[no-untyped-def]
    if dialect != "postgresql":
        pytest.skip("COPY is PostgreSQL's bulk writer")
    binding, engine, table = outbox
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda _c, _cur, stmt, *_: statements.append(stmt))
    return binding, engine, table, statements


def _inserts(statements: list[str]) -> int:
    return sum(1 for s in statements if s.lstrip().upper().startswith("INSERT"))


def test_postgresql_stashes_a_large_batch_with_copy_on_psycopg(pg_outbox) -> None:  # type: ignore[no-untyped-def]
    binding, engine, table, statements = pg_outbox
    copy = engine.dialect.driver == "psycopg"  # psycopg2 keeps executemany
    with engine.begin() as tx:
        Stasher(table).stash_many(tx, _records(100, "a"))
    assert _inserts(statements) == (0 if copy else 1)
    statements.clear()
    with engine.begin() as tx:
        Stasher(table, bulk=False).stash_many(tx, _records(100, "b"))  # opted out
        Stasher(table).stash_many(tx, _records(15, "c"))  # below COPY_MIN_ROWS
    assert _inserts(statements) == 2
    got = binding.mark(str(uuid.uuid4()), 300)
    assert [(r.key, r.value, tuple(r.headers)) for r in got] == [
        (r.key, r.value, tuple(r.headers)) for r in _records(100, "a") + _records(100, "b") + _records(15, "c")
    ]


def test_postgresql_uses_copy_once_a_missing_table_exists(pg_outbox) -> None:  # type: ignore[no-untyped-def]
    # A missing table is not remembered as missing, nor its bulk writer as absent: once the
    # table exists, COPY is used.
    from pyharvest.bindings.sql import NATIVE
    from pyharvest.errors import OutboxTableMissingError

    binding, engine, table, statements = pg_outbox
    if engine.dialect.driver != "psycopg":
        pytest.skip("COPY is psycopg 3's")
    with engine.begin() as tx:
        tx.exec_driver_sql(f"ALTER TABLE {table} RENAME TO {table}_away")
    with pytest.raises(OutboxTableMissingError, match="reaper init-db"), engine.begin() as tx:
        Stasher(table, layout=NATIVE).stash_many(tx, _records(30, "a"))
    with engine.begin() as tx:
        tx.exec_driver_sql(f"ALTER TABLE {table}_away RENAME TO {table}")
    statements.clear()
    with engine.begin() as tx:
        Stasher(table, layout=NATIVE).stash_many(tx, _records(30, "b"))
    assert _inserts(statements) == 0
    assert [r.key for r in binding.mark(str(uuid.uuid4()), 100)] == [f"b{i}" for i in range(30)]


def test_postgresql_keeps_insert_for_a_table_with_row_level_security(pg_outbox) -> None:  # type: ignore[no-untyped-def]
    binding, engine, table, statements = pg_outbox
    with engine.begin() as tx:
        tx.exec_driver_sql(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")  # COPY FROM refuses such tables
    with engine.begin() as tx:
        Stasher(table).stash_many(tx, _records(50))
    assert _inserts(statements) == 1
    assert len(binding.mark(str(uuid.uuid4()), 100)) == 50


def test_postgresql_copy_errors_are_sqlalchemy_errors_and_write_nothing(pg_outbox) -> None:  # type: ignore[no-untyped-def]
    binding, engine, table, _ = pg_outbox
    with engine.begin() as tx:  # a rule of the application's that only the database knows
        tx.exec_driver_sql(f"ALTER TABLE {table} ADD CONSTRAINT {table}_no_bad CHECK (kafka_key <> 'bad')")
    refused = [*_records(30), OutboxRecord("bulk", "bad", b"v")]
    with pytest.raises(sa.exc.IntegrityError, match="check constraint"), engine.begin() as tx:
        Stasher(table).stash_many(tx, refused)
    with engine.connect() as conn:  # the failed transaction was rolled back; the connection is usable
        Stasher(table).stash_many(conn, _records(20))
        conn.commit()
    assert [r.key for r in binding.mark(str(uuid.uuid4()), 100)] == [f"k{i}" for i in range(20)]


def test_postgresql_falls_back_to_insert_in_psycopg_pipeline_mode(pg_outbox) -> None:  # type: ignore[no-untyped-def]
    binding, engine, table, statements = pg_outbox
    if engine.dialect.driver != "psycopg":
        pytest.skip("pipeline mode is psycopg 3's")
    with engine.begin() as tx:  # outside pipeline mode: COPY (and the layout and writer are looked up, and cached)
        Stasher(table).stash_many(tx, _records(40, "a"))
    assert _inserts(statements) == 0
    with engine.connect() as conn:
        with conn.connection.driver_connection.pipeline():  # type: ignore[union-attr]
            Stasher(table).stash_many(conn, _records(40, "b"))
        conn.commit()
    assert _inserts(statements) == 1
    assert [r.key for r in binding.mark(str(uuid.uuid4()), 100)] == [f"{k}{i}" for k in "ab" for i in range(40)]


def count(tx: sa.Connection, table: str) -> int:
    return int(tx.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


def test_a_batch_is_written_when_the_transaction_commits_without_closing_it(outbox) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy.orm import Session

    binding, engine, table = outbox
    with engine.begin() as tx:
        out = Stasher(table).batch(tx, flush_every=1000)
        for i in range(50):
            out.stash(OutboxRecord("b", f"k{i}", b"conn"))
    with Session(engine) as session, session.begin():
        out = Stasher(table).batch(session, flush_every=1000)
        for i in range(50):
            out.stash(OutboxRecord("b", f"k{i}", b"session"))
    with engine.connect() as conn:  # commit as you go
        out = Stasher(table).batch(conn, flush_every=1000)
        out.stash(OutboxRecord("b", "k", b"commit-1"))
        conn.commit()
        out.stash(OutboxRecord("b", "k", b"commit-2"))
        conn.commit()
    values = [r.value for r in binding.mark(str(uuid.uuid4()), 200)]
    assert values == [b"conn"] * 50 + [b"session"] * 50 + [b"commit-1", b"commit-2"]


def test_a_batch_is_visible_to_the_transaction_and_follows_its_savepoints(outbox) -> None:  # type: ignore[no-untyped-def]
    binding, engine, table = outbox
    with engine.begin() as tx:
        out = Stasher(table).batch(tx, flush_every=1000)
        out.stash(OutboxRecord("b", "k", b"kept"))
        assert count(tx, table) == 1  # any statement sees what was stashed before it
        out.stash(OutboxRecord("b", "k", b"kept-too"))
        savepoint = tx.begin_nested()  # written before the savepoint, so its rollback keeps them
        out.stash(OutboxRecord("b", "k", b"rolled-back"))
        savepoint.rollback()
        out.stash(OutboxRecord("b", "k", b"after"))
    with engine.begin() as tx:
        out = Stasher(table).batch(tx, flush_every=1000)
        out.stash(OutboxRecord("b", "k", b"whole-transaction-rolled-back"))
        tx.rollback()
    assert [r.value for r in binding.mark(str(uuid.uuid4()), 10)] == [b"kept", b"kept-too", b"after"]


def test_a_closed_batch_refuses_records_and_leaves_the_connection_alone(outbox) -> None:  # type: ignore[no-untyped-def]
    _, engine, table = outbox
    with engine.begin() as tx:
        with Stasher(table).batch(tx) as out:
            out.stash(OutboxRecord("b", "k", b"1"))
        assert not any(sa.event.contains(tx, name, hook) for name, hook in out._hooks or ())
        assert out._hooks is None
        with pytest.raises(RuntimeError, match="closed"):
            out.stash(OutboxRecord("b", "k", b"2"))
        assert count(tx, table) == 1


def test_a_stash_checks_sizes_and_encodes_each_record_once(outbox, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    binding, engine, table = outbox
    calls = {"checks": 0, "limits": 0, "plans": 0}
    counting(monkeypatch, calls)
    out = Stasher(table)

    def record(i: int) -> OutboxRecord:
        return OutboxRecord("t", f"k{i}", CountedText("é" * 10), [("h", CountedText(f"ü{i}"))])

    ways = [  # (how many records, the way)
        (1, lambda tx: out.stash(tx, record(0))),
        (1, lambda tx: stash(tx, record(1), table=table)),  # the module's own Stasher
        (30, lambda tx: out.stash_many(tx, [record(i) for i in range(30)])),  # COPY-sized on PostgreSQL
        (2, lambda tx: out.prepare(tx).stash_many([record(0), record(1)])),
        (1, lambda tx: out.prepare(tx).stash(record(2))),
        (3, lambda tx: [out.batch(tx, flush_every=2).stash(record(i)) for i in range(3)]),
    ]
    stashed = 0
    for n, way in ways:
        before = dict(calls, encodings=CountedText.encodings)
        with engine.begin() as tx:
            way(tx)
        stashed += n
        assert calls["checks"] - before["checks"] == n, "each record checked (and sized) once"
        assert calls["limits"] - before["limits"] == n, "each record's limits checked once, on that size"
        assert CountedText.encodings - before["encodings"] == 2 * n, "its value and header encoded once each"
    assert calls["plans"] == 2, "one plan per stasher and engine: out's and the module's"
    got = binding.mark(str(uuid.uuid4()), 100)
    assert len(got) == stashed and {r.value for r in got} == {("é" * 10).encode()}
    assert {dict(r.headers)["h"] for r in got} == {f"ü{i}" for i in range(30)}


def test_a_stasher_keeps_a_plan_per_engine(outbox, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One Stasher on two databases whose tables differ (one made before the key hash column):
    each engine's rows go through that engine's statement."""
    import gc

    from pyharvest.core.outbox.keys import key_hash

    _, engine, table = outbox
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    create_outbox_table(other_url, table)
    other = sa.create_engine(other_url)
    with other.begin() as tx:
        tx.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN kafka_key_hash"))
    out = Stasher(table)
    try:
        for i in range(3):  # alternately, each way: the plans do not displace each other
            for e in (engine, other):
                with e.begin() as tx:
                    out.stash(tx, OutboxRecord("t", f"one-{i}", b"v"))
                    out.stash_many(tx, [OutboxRecord("t", f"many-{i}", b"v")] * 20)
        assert set(out._plans) == {engine, other}
        assert out._plans[engine].outbox.key_hash and not out._plans[other].outbox.key_hash
        with engine.connect() as c:
            hashes = c.execute(sa.text(f"SELECT kafka_key, kafka_key_hash FROM {table}")).all()
        assert len(hashes) == 63 and all(h == key_hash(k) for k, h in hashes)
        with other.connect() as c:
            assert c.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one() == 63
    finally:
        other.dispose()
    del other, e, tx, c
    gc.collect()
    assert set(out._plans) == {engine}, "a plan does not keep its engine alive"
