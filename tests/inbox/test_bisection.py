"""Finding the message a batch handler fails on, in savepoints of a live database's
transaction: the database's own error (a duplicate primary key) is what fails, so a
transaction the error aborted (PostgreSQL) must be restored by the savepoint's rollback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from pyharvest.bindings.sql.inbox.database import SqlInboxDatabase
from pyharvest.core.inbox.bisection import first_failure
from pyharvest.inbox import InboxMessage

TAKEN = 999  # an id already in the table: inserting it again fails


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    e = sa.create_engine(database_url)
    yield e
    e.dispose()


@pytest.fixture
def rows(engine: sa.Engine, table_name: str) -> sa.Table:
    t = sa.Table(
        f"{table_name}_rows",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    )
    t.create(engine)
    with engine.begin() as c:
        c.execute(sa.insert(t), {"id": TAKEN})
    return t


def messages(*ids: int) -> list[InboxMessage]:
    return [InboxMessage("t", 0, offset, None, str(i).encode()) for offset, i in enumerate(ids)]


class Inserter:
    """A batch handler: one row per message (``executemany``); records each call's size."""

    def __init__(self, table: sa.Table) -> None:
        self.insert = sa.insert(table)
        self.calls: list[int] = []

    def __call__(self, tx: sa.Connection, batch: list[InboxMessage]) -> None:
        self.calls.append(len(batch))
        tx.execute(self.insert, [{"id": int(m.value or b"")} for m in batch])


def stored(engine: sa.Engine, table: sa.Table) -> list[int]:
    with engine.connect() as c:
        return [r[0] for r in c.execute(sa.select(table.c.id).where(table.c.id != TAKEN).order_by(table.c.id))]


def in_transaction(engine: sa.Engine, table: sa.Table, work, commit: bool = True):
    """Run ``work(conn)`` in a transaction begun by a write, as the inbox begins its own."""
    with engine.connect() as conn:
        txn = conn.begin()
        conn.execute(sa.update(table).where(table.c.id == -1).values(id=-1))
        result = work(conn)
        txn.commit() if commit else txn.rollback()
    return result


def test_a_list_that_applies_costs_one_call(engine, rows):
    handler = Inserter(rows)
    assert in_transaction(engine, rows, lambda c: first_failure(SqlInboxDatabase(engine), c, handler, messages(*range(10)))) is None
    assert handler.calls == [10]
    assert stored(engine, rows) == list(range(10))


@pytest.mark.parametrize("at", [0, 5, 12])
def test_the_failing_message_is_found_with_those_before_it_applied(engine, rows, at):
    ids = list(range(13))
    ids[at] = TAKEN
    handler = Inserter(rows)
    found = in_transaction(engine, rows, lambda c: first_failure(SqlInboxDatabase(engine), c, handler, messages(*ids)))
    assert found is not None
    index, error = found
    assert index == at
    assert isinstance(error, sa.exc.IntegrityError)
    assert stored(engine, rows) == ids[:at], "everything before it applied, nothing after"
    assert len(handler.calls) <= 2 * 4 + 1, "halving: about 2·log2(n) calls"
    assert sum(handler.calls) <= 3 * len(ids)


def test_the_first_of_two_failing_messages_is_found(engine, rows):
    handler = Inserter(rows)
    found = in_transaction(engine, rows, lambda c: first_failure(SqlInboxDatabase(engine), c, handler, messages(0, 1, TAKEN, 3, TAKEN, 5)))
    assert found is not None and found[0] == 2
    assert stored(engine, rows) == [0, 1]


def test_known_to_fail_starts_with_the_halves(engine, rows):
    handler = Inserter(rows)
    found = in_transaction(
        engine, rows, lambda c: first_failure(SqlInboxDatabase(engine), c, handler, messages(0, 1, 2, TAKEN), known_to_fail=True)
    )
    assert found is not None and found[0] == 3
    assert handler.calls[0] == 2, "the whole list is not tried again"
    single = Inserter(rows)
    found = in_transaction(engine, rows, lambda c: first_failure(SqlInboxDatabase(engine), c, single, messages(TAKEN), known_to_fail=True))
    assert found is not None and found[0] == 0 and single.calls == [1]


def test_a_failure_that_does_not_come_back_applies_everything_once(engine, rows):
    inserter = Inserter(rows)
    failed = []

    def flaky(tx: sa.Connection, batch: list[InboxMessage]) -> None:
        inserter(tx, batch)
        if not failed:
            failed.append(len(batch))
            raise RuntimeError("a passing failure")

    assert in_transaction(engine, rows, lambda c: first_failure(SqlInboxDatabase(engine), c, flaky, messages(*range(8)))) is None
    assert stored(engine, rows) == list(range(8)), "each message applied once: the failed attempt rolled back"


def test_everything_rolls_back_with_the_transaction(engine, rows):
    handler = Inserter(rows)
    found = in_transaction(engine, rows, lambda c: first_failure(SqlInboxDatabase(engine), c, handler, messages(0, 1, TAKEN, 3)), commit=False)
    assert found is not None
    assert stored(engine, rows) == [], "savepoints released inside the transaction commit nothing by themselves"


def test_a_lost_connection_is_raised_not_located(engine, rows):
    lost = DBAPIError("SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True)

    def handler(tx: sa.Connection, batch: list[InboxMessage]) -> None:
        raise lost

    with pytest.raises(DBAPIError):
        in_transaction(engine, rows, lambda c: first_failure(SqlInboxDatabase(engine), c, handler, messages(0, 1)), commit=False)


def test_an_empty_list_calls_nothing(engine, rows):
    handler = Inserter(rows)
    assert in_transaction(engine, rows, lambda c: first_failure(SqlInboxDatabase(engine), c, handler, [])) is None
    assert handler.calls == []
