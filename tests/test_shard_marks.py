"""The data side of sharded harvesting, on every live database: the key hash the stasher
stores, the shard index ``init-db --shards`` creates, and marks that take one shard's rows."""

from __future__ import annotations

import uuid
from collections import defaultdict

import pytest
import sqlalchemy as sa

from pyharvest.bindings.sql import create_binding, create_outbox_table
from pyharvest.bindings.sql.schema import has_key_hash, has_shard_index, shard_index_name
from pyharvest.core.outbox.keys import key_hash, shard_of
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.plugins.api import MarkQuery, parse_table_name
from pyharvest.stasher import Stasher

SHARDS = 4


def stash(url: str, table: str, records: list[OutboxRecord]) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as tx:
            Stasher(table).stash_many(tx, records)
    finally:
        engine.dispose()


def records(n: int, keys: int) -> list[OutboxRecord]:
    return [OutboxRecord("t", f"key-{i % keys}", f"v{i}".encode()) for i in range(n)]


def test_new_tables_have_the_key_hash_and_the_stasher_fills_it(database_url: str, table_name: str) -> None:
    create_outbox_table(database_url, table_name)
    engine = sa.create_engine(database_url)
    try:
        assert has_key_hash(engine, parse_table_name(table_name))
        stash(database_url, table_name, records(50, 13))
        t = sa.table(table_name, sa.column("kafka_key"), sa.column("kafka_key_hash"))
        with engine.connect() as c:
            rows = c.execute(sa.select(t.c.kafka_key, t.c.kafka_key_hash)).all()
        assert len(rows) == 50
        assert all(h == key_hash(k) for k, h in rows)
    finally:
        engine.dispose()


def test_each_shards_mark_takes_exactly_its_keys_in_id_order(database_url: str, table_name: str) -> None:
    create_outbox_table(database_url, table_name, shards=SHARDS)
    stash(database_url, table_name, records(400, 37))
    binding = create_binding(database_url, table_name)
    try:
        seen: dict[int, list[OutboxRecord]] = {}
        for shard in range(SHARDS):
            part = binding.for_shard(SHARDS, shard)
            seen[shard] = part.mark(str(uuid.uuid4()), 1000)
            part.dispose()  # leaves the shared engine open
        assert sum(len(v) for v in seen.values()) == 400
        by_key: dict[str, list[int]] = defaultdict(list)
        for shard, marked in seen.items():
            assert {shard_of(r.key, SHARDS) for r in marked} <= {shard}
            for r in marked:
                by_key[r.key].append(r.id)  # type: ignore[arg-type]
        assert len([s for s in seen.values() if s]) == SHARDS  # 37 keys spread over every shard
        assert all(ids == sorted(ids) for ids in by_key.values())
        assert binding.count() == 400
    finally:
        binding.dispose()


def index_exists(engine: sa.Engine, dialect: str, name: str, shards: int) -> bool:
    if dialect == "sqlite":  # SQLAlchemy does not reflect SQLite's expression indexes
        with engine.connect() as c:
            found = c.exec_driver_sql(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (shard_index_name(parse_table_name(name), shards),)
            ).first()
        return found is not None
    return has_shard_index(engine, parse_table_name(name), shards)


def test_init_db_adds_the_column_fills_old_rows_and_is_idempotent(database_url: str, dialect: str, table_name: str) -> None:
    create_outbox_table(database_url, table_name)
    engine = sa.create_engine(database_url)
    try:
        t = sa.table(
            table_name,
            sa.column("create_time"), sa.column("kafka_topic"), sa.column("kafka_key"), sa.column("kafka_headers"),
            sa.column("kafka_key_hash"),
        )
        from datetime import UTC, datetime

        with engine.begin() as c:  # a writer that predates the column leaves it NULL
            c.execute(sa.insert(t), [
                {"create_time": datetime.now(UTC).replace(tzinfo=None), "kafka_topic": "t", "kafka_key": f"old-{i}",
                 "kafka_headers": "[]"} for i in range(5)
            ])
        assert not index_exists(engine, dialect, table_name, SHARDS)
        create_outbox_table(database_url, table_name, shards=SHARDS)
        create_outbox_table(database_url, table_name, shards=SHARDS)  # twice: nothing to do
        assert index_exists(engine, dialect, table_name, SHARDS)
        with engine.connect() as c:
            filled = c.execute(sa.select(t.c.kafka_key, t.c.kafka_key_hash)).all()
        assert sorted(filled) == sorted((f"old-{i}", key_hash(f"old-{i}")) for i in range(5))
    finally:
        engine.dispose()


def test_a_table_without_the_key_hash_refuses_shards_with_the_fix(database_url: str, table_name: str) -> None:
    create_outbox_table(database_url, table_name)
    engine = sa.create_engine(database_url)
    try:
        binding = create_binding(database_url, table_name)
        object.__setattr__(binding.outbox, "key_hash", False)  # as a table made before the column existed
        # The command runs as printed: the data source included.
        with pytest.raises(Exception, match=r"init-db --data-source '.+' --table .* --shards 4`"):
            binding.for_shard(4, 0)
        binding.dispose()
    finally:
        engine.dispose()


def test_a_shards_row_choice_can_use_the_shard_index(database_url: str, dialect: str, table_name: str) -> None:
    if dialect not in ("postgresql", "mysql"):
        pytest.skip("the plan is checked where the planner can be asked to prefer indexes")
    create_outbox_table(database_url, table_name, shards=SHARDS)
    binding = create_binding(database_url, table_name)
    try:
        oldest = MarkQuery(binding.for_shard(SHARDS, 2).outbox).oldest(100).params(leader_id="x")
        sql = str(oldest.compile(binding.engine, compile_kwargs={"literal_binds": True}))
        with binding.engine.connect() as c:
            if dialect == "postgresql":  # a tiny table is cheaper to scan: ask whether the index CAN serve
                c.exec_driver_sql("SET enable_seqscan = off")
                c.exec_driver_sql("SET enable_bitmapscan = off")
            plan = "\n".join(str(r) for r in c.exec_driver_sql("EXPLAIN " + sql))
        assert shard_index_name(parse_table_name(table_name), SHARDS) in plan, plan
    finally:
        binding.dispose()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("postgresql", "coalesce(outbox.kafka_key_hash, 0) %% 4 = 3"),
        ("sqlite", "coalesce(outbox.kafka_key_hash, 0) % 4 = 3"),
        ("mysql", "kafka_shard_4 = 3"),
        ("mssql", "kafka_shard_4 = 3"),
        ("oracle", "mod(coalesce(outbox.kafka_key_hash, 0), 4) = 3"),
    ],
)
def test_every_dialects_mark_chooses_rows_of_its_shard_only(name: str, expected: str) -> None:
    # Compiled: SQL Server and Oracle cannot run here; the filter must sit in the row choice,
    # next to the ORDER BY id that the shard index serves.
    import functools

    from pyharvest.plugins.api import OutboxTable, load_dialect
    from pyharvest.testing.compiled import MarkSql

    dialect = load_dialect(name)
    outbox = OutboxTable.build(parse_table_name("outbox"), key_hash=True)
    marked = outbox.where(functools.partial(dialect.shard_filter, shards=4, shard=3))
    target = dialect.sqlalchemy_dialect()
    compiled = [" ".join(str(s.compile(dialect=target)).split()) for s in dialect.mark_strategy(marked).statements(10)]
    assert expected in MarkSql(compiled).row_choice()


def test_goharvests_layout_is_refused_for_shards(database_url: str, dialect: str, table_name: str) -> None:
    if dialect != "postgresql":
        pytest.skip("the goharvest layout is PostgreSQL's")
    create_outbox_table(database_url, table_name, layout="goharvest")
    with pytest.raises(Exception, match="shards need the native layout"):
        create_outbox_table(database_url, table_name, layout="goharvest", shards=4)


def test_a_shards_mark_walks_its_index_when_the_statistics_say_the_table_is_empty(
    database_url: str, dialect: str, table_name: str
) -> None:
    # The usual outbox: analysed while nearly empty, then a burst arrives. A mark that sorted
    # its whole shard per batch would make the drain quadratic in the backlog.
    if dialect != "postgresql":
        pytest.skip("PostgreSQL's planner trusts stale statistics; the others' marks have no choice to make")
    from pyharvest.plugins.api import OutboxTable, load_dialect

    create_outbox_table(database_url, table_name, shards=SHARDS)
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as c:
            c.execute(sa.text(f"ANALYZE {table_name}"))
        stash(database_url, table_name, records(20_000, 1000))
        postgresql = load_dialect("postgresql")
        outbox = OutboxTable.build(parse_table_name(table_name), key_hash=True)
        marked = outbox.where(lambda source: postgresql.shard_filter(source, shards=SHARDS, shard=1))
        *prelude, mark = postgresql.mark_strategy(marked).statements(100)
        sql = str(mark.compile(dialect=engine.dialect))  # type: ignore[attr-defined]
        with engine.connect() as c, c.begin():
            for setting in prelude:
                c.execute(setting)
            plan = "\n".join(c.exec_driver_sql("EXPLAIN " + sql, {"leader_id": "x", "after": 0}).scalars())
        assert "Sort" not in plan and shard_index_name(parse_table_name(table_name), SHARDS) in plan, plan
    finally:
        engine.dispose()
