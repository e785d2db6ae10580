"""MariaDB/MySQL through whichever driver the suite runs on (``PYHARVEST_TEST_MYSQL_DRIVER``:
mysqlclient in tox's ``mysql`` environment, PyMySQL in ``mysql-pymysql``): the plugin's
two-statement mark, and the driver's errors as the binding and SQLAlchemy must see them (a
lost connection, a lock wait timeout, a deadlock) and its sessions' isolation."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from pyharvest.bindings.sql import SqlBinding, create_binding, create_outbox_table
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.plugins.api import OutboxTable, load_dialect, parse_table_name
from pyharvest.stasher import Stasher
from tests.helpers.waiting import wait_until

# MySQL's error numbers (the same on MariaDB).
LOCK_WAIT_TIMEOUT, DEADLOCK = 1205, 1213


def error_number(error: sa.exc.DBAPIError) -> int | None:
    # mysqlclient and PyMySQL put the number first in args; the mariadb connector in errno.
    orig: Any = error.orig
    number = getattr(orig, "errno", None) or (orig.args[0] if orig.args else None)
    return number if isinstance(number, int) else None


@pytest.fixture
def mysql_url(dialect: str, database_url: str) -> str:
    if dialect != "mysql":
        pytest.skip("MariaDB/MySQL's driver and mark")
    return database_url


@pytest.fixture
def binding(mysql_url: str, table_name: str) -> Iterator[SqlBinding]:
    create_outbox_table(mysql_url, table_name)
    engine = sa.create_engine(mysql_url)
    with engine.begin() as tx:
        Stasher(table_name).stash_many(tx, [OutboxRecord("t", f"k{i % 3}", f"v{i}".encode()) for i in range(30)])
    engine.dispose()
    b = create_binding(mysql_url, table_name)
    yield b
    b.dispose()


def marked_by(b: SqlBinding, leader: str) -> list[int]:
    with b.engine.connect() as c:
        return list(c.execute(sa.select(b.outbox.id).where(b.outbox.leader_id == leader).order_by(b.outbox.id)).scalars())


def test_the_mark_is_one_locking_read_of_the_rows_and_one_range_update() -> None:
    dialect = load_dialect("mysql")
    read, update = dialect.mark_strategy(OutboxTable.build(parse_table_name("outbox"))).statements(10)
    target = dialect.sqlalchemy_dialect()
    assert " ".join(str(read.compile(dialect=target)).split()) == (  # type: ignore[attr-defined]
        "SELECT outbox.id, outbox.create_time, outbox.kafka_topic, outbox.kafka_key, outbox.kafka_value, "
        "outbox.kafka_headers, %s AS leader_id FROM outbox WHERE outbox.id > %s "
        "AND (outbox.leader_id IS NULL OR outbox.leader_id != %s) ORDER BY outbox.id LIMIT 10 FOR UPDATE"
    )
    assert " ".join(str(update.compile(dialect=target)).split()) == (  # type: ignore[attr-defined]
        "UPDATE outbox SET leader_id=%s WHERE outbox.id BETWEEN %s AND %s "
        "AND (outbox.leader_id IS NULL OR outbox.leader_id != %s)"
    )


def test_a_mark_returns_the_oldest_rows_with_its_leader_and_marks_exactly_those(binding: SqlBinding) -> None:
    first = binding.mark("leader-a", 10)
    assert [r.leader_id for r in first] == ["leader-a"] * 10
    assert [r.id for r in first] == marked_by(binding, "leader-a")
    assert [r.value for r in first] == [f"v{i}".encode() for i in range(10)]
    # Another leader takes the oldest rows again; the same leader takes the next ones.
    assert [r.id for r in binding.mark("leader-b", 5)] == [r.id for r in first[:5]]
    again = binding.mark("leader-a", 10)
    assert [r.id for r in again] == [r.id for r in first[:5]] + marked_by(binding, "leader-a")[10:15]
    assert marked_by(binding, "leader-a") == sorted(r.id for r in [*first[5:], *again])


def test_a_row_committed_inside_the_range_after_the_read_is_never_marked_unread(binding: SqlBinding) -> None:
    # Ids are handed out before commit: a row can appear below the read's last id after the
    # read passed its place. Made here by putting back a deleted row between the read and the
    # update: the range update would mark it without returning it, so the mark must redo.
    t = binding.outbox.table
    with binding.engine.begin() as c:
        ids = list(c.execute(sa.select(t.c.id).order_by(t.c.id)).scalars())
        gap = ids[4]
        c.execute(sa.delete(t).where(t.c.id == gap))
    other = sa.create_engine(binding.engine.url)
    reads: list[str] = []

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FOR UPDATE" in statement:
            reads.append(statement)
            if len(reads) == 1:  # a late row, moved into the gap (the stasher fills its key hash)
                with other.begin() as c:
                    Stasher(t.name).stash(c, OutboxRecord("t", "late", b"late"))
                    c.execute(sa.update(t).where(t.c.id == sa.select(sa.func.max(t.c.id)).scalar_subquery())
                              .values(id=gap))

    sa.event.listen(binding.engine, "after_cursor_execute", after)
    try:
        marked = binding.mark("leader", 10)
    finally:
        sa.event.remove(binding.engine, "after_cursor_execute", after)
        other.dispose()
    assert len(reads) == 2, "the mark did not read again after its range held a row it had not read"
    assert [r.id for r in marked] == marked_by(binding, "leader") == ids[:10]
    assert next(r for r in marked if r.id == gap).key == "late"


def test_a_killed_connection_is_seen_as_lost_and_the_next_mark_reconnects(binding: SqlBinding) -> None:
    binding.engine.dispose()  # the pool then holds one connection: the one killed
    with binding.engine.connect() as c:
        own = c.execute(sa.text("SELECT CONNECTION_ID()")).scalar_one()
    killer = sa.create_engine(binding.engine.url)
    try:
        with killer.connect() as k:
            k.execute(sa.text(f"KILL {int(own)}"))
    finally:
        killer.dispose()
    with pytest.raises(sa.exc.DBAPIError) as lost:
        binding.mark("leader", 1)
    assert lost.value.connection_invalidated, lost.value
    assert [r.leader_id for r in binding.mark("leader", 5)] == ["leader"] * 5


def test_a_lock_wait_timeout_and_a_deadlock_carry_their_error_numbers(binding: SqlBinding) -> None:
    t, rows = binding.outbox.table, [r.id for r in binding.mark("x", 2)]

    def lock(c: sa.Connection, row: int) -> None:
        c.execute(sa.update(t).where(t.c.id == row).values(leader_id="held"))

    with binding.engine.connect() as a, binding.engine.connect() as b:
        a.begin()
        lock(a, rows[0])
        b.execute(sa.text("SET SESSION innodb_lock_wait_timeout = 1"))
        b.commit()
        with pytest.raises(sa.exc.OperationalError) as timeout:
            with b.begin():
                lock(b, rows[0])
        assert error_number(timeout.value) == LOCK_WAIT_TIMEOUT
        assert not timeout.value.connection_invalidated
        a.rollback()

        b.execute(sa.text("SET SESSION innodb_lock_wait_timeout = 50"))
        b.commit()
        a.begin()
        b.begin()
        lock(a, rows[0])
        lock(b, rows[1])
        errors: list[sa.exc.DBAPIError] = []

        def a_waits() -> None:
            try:
                lock(a, rows[1])
            except sa.exc.DBAPIError as e:
                errors.append(e)

        waiter = threading.Thread(target=a_waits)
        waiter.start()
        with binding.engine.connect() as watch:
            wait_until(lambda: watch.execute(sa.text(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
            )).scalar_one() >= 1, what="the first transaction waiting for the second's row")
        try:
            lock(b, rows[0])
        except sa.exc.DBAPIError as e:
            errors.append(e)
        waiter.join(60)
        assert [error_number(e) for e in errors] == [DEADLOCK], errors
        assert isinstance(errors[0], sa.exc.OperationalError) and not errors[0].connection_invalidated
        a.rollback()
        b.rollback()


def test_sessions_run_at_read_committed(binding: SqlBinding) -> None:
    # Under InnoDB's default REPEATABLE READ the mark's locking read would take gap locks that
    # block writers' inserts until it commits.
    with binding.engine.connect() as c:
        assert c.get_isolation_level() == "READ COMMITTED"


def test_the_mark_benchmark_runs_every_way(mysql_url: str) -> None:
    # benchmarks/mysql_mark.py at toy sizes, with a writer beside it: correctness, not timing.
    import subprocess
    from pathlib import Path

    from benchmarks.children import python_module

    proc = subprocess.run(
        [*python_module("benchmarks.mysql_mark"), "--database", mysql_url, "--batch", "20", "--marks", "4",
         "--rounds", "1", "--writers", "200"],
        cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=240, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    for way in ("generic", "read_range", "read_ids", "update_limit"):
        assert f"{way}: mark p50" in proc.stdout, proc.stdout
    assert "in autocommit, one round trip" in proc.stdout, proc.stdout
