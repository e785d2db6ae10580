"""The inbox's dedupe table through the dialect: look-ups by its list filter (chunked by its
list limit), identities written by its bulk writer (PostgreSQL: binary COPY) or executemany."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pyharvest.bindings.sql.inbox.dedupe import Dedupe
from pyharvest.bindings.sql.inbox.tables import InboxTables
from pyharvest.inbox import InboxMessage
from pyharvest.plugins.api import dialect_of


@pytest.fixture
def dedupe_engine(database_url: str, table_name: str) -> Iterator[tuple[sa.Engine, InboxTables]]:
    tables = InboxTables.build(f"{table_name}_cp", f"{table_name}_dd", f"{table_name}_dl")
    engine = sa.create_engine(database_url)
    tables.create(engine)
    try:
        yield engine, tables
    finally:
        engine.dispose()


def _rows(outbox: str, ids: range, partition: int = 0) -> list[InboxMessage]:
    """Applied messages of ``outbox``'s records ``ids``, at offsets 1000 + id."""
    return [InboxMessage("orders", partition, 1000 + i, None, None, source=(outbox, i)) for i in ids]


def test_remembered_identities_are_found_per_group_and_outbox(dedupe_engine: tuple[sa.Engine, InboxTables]) -> None:
    engine, tables = dedupe_engine
    dedupe = Dedupe(tables.dedupe, "g1")
    with engine.begin() as conn:
        dedupe.remember(conn, _rows("a/outbox", range(3)))  # below any bulk writer's threshold: executemany
        dedupe.remember(conn, _rows("a/outbox", range(100, 2600)))  # large: the bulk writer where there is one
        dedupe.remember(conn, _rows("b/outbox", range(5)))
        dedupe.remember(conn, [])
        dedupe.remember(conn, [InboxMessage("orders", 0, 7, None, None)])  # no identity: nothing to remember
    wanted = [("a/outbox", i) for i in range(3000)] + [("b/outbox", 4), ("b/outbox", 5), ("c/outbox", 1)]
    with engine.connect() as conn:
        found = dedupe.applied(conn, wanted)  # 3,000 ids of one outbox: chunked where the dialect has a limit
        other_group = Dedupe(tables.dedupe, "g2").applied(conn, wanted)
    expected = {("a/outbox", i) for i in [*range(3), *range(100, 2600)]} | {("b/outbox", 4)}
    assert found == expected
    assert other_group == set()
    with engine.connect() as conn:
        stored = conn.execute(
            sa.select(tables.dedupe).where(tables.dedupe.c.outbox == "a/outbox", tables.dedupe.c.record_id == 2000)
        ).one()
    assert tuple(stored) == ("g1", "a/outbox", 2000, "orders", 0, 3000)


def test_a_failed_transaction_remembers_nothing(dedupe_engine: tuple[sa.Engine, InboxTables]) -> None:
    engine, tables = dedupe_engine
    dedupe = Dedupe(tables.dedupe, "g")
    with engine.connect() as conn:
        transaction = conn.begin()
        dedupe.remember(conn, _rows("o", range(50)))
        transaction.rollback()  # the handler failed
    with engine.connect() as conn:
        assert dedupe.applied(conn, [("o", i) for i in range(50)]) == set()
    with engine.begin() as conn:  # a repeat of an identity is the database's primary-key error
        dedupe.remember(conn, _rows("o", range(20)))
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        dedupe.remember(conn, _rows("o", range(19, 40)))


def test_prune_drops_identities_below_the_offset(dedupe_engine: tuple[sa.Engine, InboxTables]) -> None:
    engine, tables = dedupe_engine
    dedupe = Dedupe(tables.dedupe, "g")
    with engine.begin() as conn:
        dedupe.remember(conn, _rows("o", range(40), partition=0) + _rows("o", range(40, 60), partition=1))
        assert dedupe.prune(conn, "orders", 0, 1030) == 30  # offsets 1000..1029
    with engine.connect() as conn:
        left = dedupe.applied(conn, [("o", i) for i in range(60)])
    assert left == {("o", i) for i in range(30, 60)}


def test_postgresql_copies_identities_in_binary_with_the_tables_types(
    dedupe_engine: tuple[sa.Engine, InboxTables],
) -> None:
    engine, tables = dedupe_engine
    dedupe = Dedupe(tables.dedupe, "g")
    with engine.connect() as conn:
        writer = dedupe._store._insert.writer(conn)
        dialect = dialect_of(conn)
    assert dialect is not None
    if dialect.name != "postgresql" or engine.dialect.driver != "psycopg":
        assert writer is None  # no bulk writer: executemany
        return
    assert writer is not None
    # What the inbox's own COPY sent before the dialect wrote it: text, text, int8, text, int4, int8.
    assert writer.types == ["text", "text", "int8", "text", "int4", "int8"]  # type: ignore[attr-defined]
    assert "FORMAT BINARY" in writer.statement  # type: ignore[attr-defined]
