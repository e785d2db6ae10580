"""Rows whose transactions commit late and out of id order are never skipped by the mark's
key-set cursor (pyharvest.bindings.sql.mark_cursor): 20 transactions, each holding one stashed
row, stay open while thousands of others are stashed, marked and purged, and commit in reverse
order. Every row is marked once, against the live databases."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import sqlalchemy as sa

from pyharvest.bindings.sql import create_binding, create_outbox_table
from pyharvest.core.outbox.records import OutboxRecord
from pyharvest.stasher import Stasher
from tests.helpers.outbox import outbox_count
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

HELD = 20
BETWEEN = 150  # rows stashed (and committed) by others between two of the held transactions' commits


def test_rows_committed_late_and_in_reverse_order_are_all_marked(dialect: str, database_url: str, table_name: str):
    if dialect == "sqlite":
        pytest.skip("SQLite has one writer at a time: its rows commit in id order")
    create_outbox_table(database_url, table_name)
    binding = create_binding(database_url, table_name, mark_lookback=0.2, late_row_scan_interval=0.3)
    engine = sa.create_engine(database_url, pool_size=HELD + 4)
    stasher = Stasher(table_name)
    marked: Counter[int] = Counter()
    written = [0]
    stop = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:  # another service's writes, committed one small batch at a time
        n = 0
        try:
            while not stop.is_set():
                with engine.begin() as tx:
                    stasher.stash_many(tx, [OutboxRecord("t", f"k{n + i}", b"v") for i in range(10)])
                n += 10
                written[0] = n
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failures.append(e)

    def harvest() -> None:  # the leader: mark, then purge what it marked
        try:
            while not stop.is_set():
                records = binding.mark("leader-1", 200)
                marked.update(r.id for r in records)
                binding.purge([r.id for r in records])
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failures.append(e)

    threads = [threading.Thread(target=write, daemon=True), threading.Thread(target=harvest, daemon=True)]
    held: list[tuple[sa.Connection, sa.Transaction, int]] = []
    try:
        for t in threads:
            t.start()
        for i in range(HELD):
            conn = engine.connect()
            tx = conn.begin()
            stasher.stash(conn, OutboxRecord("t", f"late-{i}", b"late"))
            row_id = conn.execute(sa.text(f"SELECT id FROM {table_name} WHERE kafka_key = :k"), {"k": f"late-{i}"}).scalar_one()
            held.append((conn, tx, row_id))
            since = written[0]
            wait_until(lambda since=since: written[0] >= since + BETWEEN or failures, 60, "others' rows to be written")
        for conn, tx, row_id in reversed(held):
            if dialect == "postgresql":
                # The marks have walked past the uncommitted row, and past the lookback: only the
                # late-row scan can find it. (MariaDB's locking read waits for the row instead.)
                assert binding.cursor is not None
                wait_until(lambda row_id=row_id: binding.cursor.position()[1] > row_id or failures, 60,
                           f"the marks to pass row {row_id}")
            since = written[0]
            wait_until(lambda since=since: written[0] >= since + BETWEEN or failures, 60, "others' rows to be written")
            tx.commit()
            conn.close()
        late = {row_id for _, _, row_id in held}
        held.clear()
        stop_writing = written[0]
        wait_until(lambda: written[0] > stop_writing, 30, "one more write")
        stop.set()
        for t in threads:
            t.join(30)
        assert not failures, failures
        # What the writer left: the last marks, until the outbox is empty.
        wait_until(lambda: not _drain(binding, marked) and outbox_count(database_url, table_name) == 0, 60,
                   lambda: f"the outbox to empty ({outbox_count(database_url, table_name)} rows left)")
        assert late <= set(marked), sorted(late - set(marked))
        assert all(count == 1 for count in marked.values()), [i for i, c in marked.items() if c > 1][:10]
        assert len(marked) == written[0] + HELD, (len(marked), written[0] + HELD)
        if dialect == "postgresql":
            assert binding.late_rows is not None and binding.late_rows.found >= 1
    finally:
        stop.set()
        for conn, tx, _ in held:
            tx.rollback()
            conn.close()
        binding.dispose()
        engine.dispose()


def _drain(binding, marked: Counter[int]) -> int:  # noqa: ANN001 - a SqlBinding
    records = binding.mark("leader-1", 1000)
    marked.update(r.id for r in records)
    binding.purge([r.id for r in records])
    return len(records)


def test_a_late_commit_keeps_its_keys_order_by_default(dialect: str, database_url: str, table_name: str):
    """With the defaults (no key-set cursor) every mark starts at the lowest id, so a record
    whose transaction commits seconds after its stash, while other rows are marked and purged,
    is marked before the records of its key stashed after that commit. (The cursor, opt-in,
    could pass it until the late-row scan: CI saw an inbox's transactions reordered that way.)"""
    if dialect == "sqlite":
        pytest.skip("SQLite has one writer at a time: its rows commit in id order")
    if dialect == "mysql":
        pytest.skip("InnoDB's locking read waits for the uncommitted row: a mark cannot pass it")
    create_outbox_table(database_url, table_name)
    binding = create_binding(database_url, table_name)
    engine = sa.create_engine(database_url)
    stasher = Stasher(table_name)
    order: list[bytes] = []
    try:
        with engine.connect() as late:
            tx = late.begin()
            stasher.stash(late, OutboxRecord("t", "k", b"k:0"))
            for n in range(5):  # others' rows, marked and purged while the late one waits
                with engine.begin() as other:
                    stasher.stash_many(other, [OutboxRecord("t", f"o{n}-{i}", b"o") for i in range(10)])
                records = binding.mark("leader-1", 200)
                binding.purge([r.id for r in records])
                assert all(r.key != "k" for r in records)
            tx.commit()
        with engine.begin() as after:
            stasher.stash(after, OutboxRecord("t", "k", b"k:1"))
        wait_until(lambda: order.extend(r.value for r in _marked_and_purged(binding) if r.key == "k") or len(order) >= 2,
                   30, "both of k's records to be marked")
        assert order == [b"k:0", b"k:1"]
    finally:
        binding.dispose()
        engine.dispose()


def _marked_and_purged(binding):  # noqa: ANN001, ANN202 - a SqlBinding; its records
    records = binding.mark("leader-1", 1000)
    binding.purge([r.id for r in records])
    return records
