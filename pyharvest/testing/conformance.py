"""Conformance suite for dialect plugins: run it against a live database.

A dialect author subclasses :class:`DialectConformance` in a pytest module and supplies
the data source (and, unless the URL's backend selects the dialect, its name)::

    from pyharvest.testing.conformance import DialectConformance

    class TestMyDialect(DialectConformance):
        @pytest.fixture
        def conformance_data_source(self, tmp_path):
            return f"sqlite:///{tmp_path / 'outbox.db'}"

        @pytest.fixture
        def conformance_dialect(self):
            return "mydialect"

Every test creates its own outbox table (``create_outbox_table``) and drops it afterwards.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from pyharvest.bindings.sql import SqlBinding, TableName, create_binding, create_outbox_table, parse_table_name
from pyharvest.core.outbox.records import InvalidRecordError, OutboxRecord
from pyharvest.plugins.api import dialect_for_backend, load_dialect
from pyharvest.stasher import Stasher, stash

__all__ = ["ConformanceOutbox", "DialectConformance"]


@dataclass
class ConformanceOutbox:
    """What each test gets: the binding under test, and an application-side engine for stashing."""

    binding: SqlBinding
    engine: sa.Engine
    table: TableName

    @property
    def stasher(self) -> Stasher:
        return Stasher(self.table)

    def stash(self, *records: OutboxRecord) -> None:
        with self.engine.begin() as tx:
            self.stasher.stash_many(tx, records)

    def stash_numbered(self, n: int, key: str = "k") -> None:
        self.stash(*(OutboxRecord("conformance", f"{key}{i % 7}", f"v{i}".encode()) for i in range(n)))

    def leaders(self) -> dict[int, str | None]:
        t = self.binding.outbox.table
        with self.engine.connect() as c:
            return {int(i): lid for i, lid in c.execute(sa.select(t.c.id, t.c.leader_id))}

    def execute(self, statement: Any, params: Any = None) -> None:
        with self.engine.begin() as c:
            c.execute(statement, params)


def _leader() -> str:
    return str(uuid.uuid4())


def _ids(records: Iterable[OutboxRecord]) -> list[int]:
    """The ids of records read back from the outbox, which always carry one."""
    ids: list[int] = []
    for r in records:
        assert r.id is not None, f"{r!r} came back from the outbox without an id"
        ids.append(r.id)
    return ids


def _app_engine(url: sa.URL) -> sa.Engine:
    # The dialect's own engine options (SQLite's busy timeout), and room for the test's writers.
    dialect = load_dialect(dialect_for_backend(url.get_backend_name()))
    return sa.create_engine(url, pool_size=8, **dialect.engine_options(url))


class DialectConformance:
    """The behaviour every dialect must show. Provide ``conformance_data_source``."""

    @pytest.fixture
    def conformance_dialect(self) -> str | None:
        return None

    @pytest.fixture
    def conformance_table(self) -> str:
        return f"outbox_conf_{uuid.uuid4().hex[:10]}"

    @pytest.fixture
    def outbox(
        self, conformance_data_source: str, conformance_dialect: str | None, conformance_table: str
    ) -> Iterator[ConformanceOutbox]:
        create_outbox_table(conformance_data_source, conformance_table, conformance_dialect)
        binding = create_binding(conformance_data_source, conformance_table, conformance_dialect)
        engine = _app_engine(binding.engine.url)
        try:
            yield ConformanceOutbox(binding, engine, parse_table_name(conformance_table))
        finally:
            binding.dispose()
            try:
                binding.outbox.table.drop(engine, checkfirst=True)
            finally:
                engine.dispose()

    # --- mark ---------------------------------------------------------------------------

    def test_mark_returns_oldest_rows_up_to_limit_sorted(self, outbox: ConformanceOutbox) -> None:
        outbox.stash_numbered(10)
        leader = _leader()
        first = outbox.binding.mark(leader, 4)
        ids = _ids(first)
        assert len(first) == 4 and ids == sorted(ids)
        assert [r.value for r in first] == [b"v0", b"v1", b"v2", b"v3"]
        for r in first:
            assert r.leader_id == leader
            assert r.create_time is not None and r.create_time.tzinfo is not None
        second = outbox.binding.mark(leader, 4)
        assert [r.value for r in second] == [b"v4", b"v5", b"v6", b"v7"]
        assert min(_ids(second)) > max(ids)
        assert [r.value for r in outbox.binding.mark(leader, 100)] == [b"v8", b"v9"]
        assert outbox.binding.mark(leader, 100) == []
        assert set(outbox.leaders().values()) == {leader}

    def test_mark_takes_over_rows_of_another_leader(self, outbox: ConformanceOutbox) -> None:
        outbox.stash_numbered(6)
        old, new = _leader(), _leader()
        assert len(outbox.binding.mark(old, 3)) == 3
        taken = outbox.binding.mark(new, 100)
        assert [r.value for r in taken] == [f"v{i}".encode() for i in range(6)]
        assert {r.leader_id for r in taken} == {new}
        assert outbox.binding.mark(new, 100) == []
        assert len(outbox.binding.mark(old, 100)) == 6  # and back again

    def test_mark_skips_rows_of_another_leader_only_after_reset(self, outbox: ConformanceOutbox) -> None:
        outbox.stash_numbered(3)
        leader = _leader()
        ids = _ids(outbox.binding.mark(leader, 10))
        assert outbox.binding.reset(ids[1:2]) == 1
        again = outbox.binding.mark(leader, 10)
        assert [r.id for r in again] == ids[1:2]

    # --- purge and reset ----------------------------------------------------------------

    def test_purge_and_reset_return_counts_and_are_idempotent(self, outbox: ConformanceOutbox) -> None:
        outbox.stash_numbered(5)
        leader = _leader()
        ids = _ids(outbox.binding.mark(leader, 10))
        assert outbox.binding.reset(ids[:2]) == 2
        assert outbox.binding.reset(ids[:2]) == 2
        assert [r.id for r in outbox.binding.mark(leader, 10)] == ids[:2]
        assert outbox.binding.purge(ids) == 5
        assert outbox.binding.purge(ids) == 0
        assert outbox.binding.reset(ids) == 0
        assert outbox.binding.purge([]) == 0 and outbox.binding.reset([]) == 0
        assert outbox.leaders() == {}

    def test_purge_and_reset_more_ids_than_one_batch(self, outbox: ConformanceOutbox) -> None:
        n = 2300  # three statements at 1,000 ids each
        outbox.stash(*(OutboxRecord("conformance", f"k{i}", b"x") for i in range(n)))
        leader = _leader()
        ids = _ids(outbox.binding.mark(leader, n))
        assert len(ids) == n
        assert outbox.binding.reset([*ids, max(ids) + 10_000]) == n
        assert outbox.binding.purge(ids) == n
        assert outbox.leaders() == {}

    # --- round trips --------------------------------------------------------------------

    ROUND_TRIP: ClassVar[list[OutboxRecord]] = [
        OutboxRecord("rt", "plain", b"bytes value"),
        OutboxRecord("rt", "binary", bytes(range(256)) + b"\xff\xfe\x00\x80"),
        OutboxRecord("rt", "empty", b""),
        OutboxRecord("rt", "tombstone", None),
        OutboxRecord("rt.topic_with-chars", "ключ-🔑-キー", "str value ü".encode()),
        OutboxRecord(
            "rt",
            "headers",
            b"v",
            (
                ("text", "plain"),
                ("unicode", "ü-🎉-\u2028"),
                ("bytes", b"\x00\xff\xfe raw"),
                ("empty-bytes", b""),
                ("empty-text", ""),
                ("dup", "1"),
                ("dup", "2"),
                ("json-looking", '{"base64":"AA=="}'),
            ),
        ),
    ]

    def test_values_keys_and_headers_round_trip_exactly(self, outbox: ConformanceOutbox) -> None:
        outbox.stash(*self.ROUND_TRIP)
        got = outbox.binding.mark(_leader(), 100)
        assert [(r.topic, r.key, r.value, tuple(r.headers)) for r in got] == [
            (r.topic, r.key, r.value, tuple(r.headers)) for r in self.ROUND_TRIP
        ]
        for r in got:
            assert r.value is None or type(r.value) is bytes
            for _, v in r.headers:
                assert type(v) in (str, bytes)

    def test_a_large_batch_round_trips_exactly(self, outbox: ConformanceOutbox) -> None:
        # Large enough for a dialect's bulk writer (PostgreSQL: COPY): it must store what the INSERT would.
        records = self.ROUND_TRIP * 4
        outbox.stash(*records)
        got = outbox.binding.mark(_leader(), 100)
        assert [(r.topic, r.key, r.value, tuple(r.headers)) for r in got] == [
            (r.topic, r.key, r.value, tuple(r.headers)) for r in records
        ]

    def test_a_large_batch_commits_and_rolls_back_with_the_caller(self, outbox: ConformanceOutbox) -> None:
        def batch(name: str) -> list[OutboxRecord]:
            return [OutboxRecord("bulk", f"{name}{i}", b"v") for i in range(40)]

        with outbox.engine.connect() as conn:
            # No begin(): the stash begins the transaction (as execute would) and commit() ends it.
            assert outbox.stasher.stash_many(conn, batch("kept")) == 40
            conn.commit()
            outbox.stasher.stash_many(conn, batch("never-committed"))
        with outbox.engine.connect() as conn:
            outbox.stasher.stash_many(conn, batch("rolled-back"))
            conn.rollback()
        with outbox.engine.begin() as tx, outbox.stasher.batch(tx, flush_every=25) as out:
            for r in batch("batched"):
                out.stash(r)
        got = outbox.binding.mark(_leader(), 200)
        assert [r.key for r in got] == [f"kept{i}" for i in range(40)] + [f"batched{i}" for i in range(40)]

    def test_str_value_is_stored_as_utf8_bytes(self, outbox: ConformanceOutbox) -> None:
        outbox.stash(OutboxRecord("rt", "k", "naïve"))
        assert outbox.binding.mark(_leader(), 1)[0].value == "naïve".encode()

    def test_malformed_headers_row_is_refused_without_stalling(self, outbox: ConformanceOutbox) -> None:
        t = outbox.binding.outbox.table
        outbox.stash(OutboxRecord("m", "a", b"1"))
        outbox.execute(
            t.insert(),
            {
                "create_time": outbox.binding.outbox.now(),
                "kafka_topic": "m",
                "kafka_key": "b",
                "kafka_value": b"2",
                "kafka_headers": "not json",
            },
        )
        outbox.stash(OutboxRecord("m", "c", b"3"))
        seen: list[Exception] = []
        outbox.binding.on_malformed = seen.append
        leader = _leader()
        assert [r.key for r in outbox.binding.mark(leader, 10)] == ["a", "c"]
        assert len(seen) == 1 and outbox.binding.malformed_rows == 1
        assert outbox.binding.mark(leader, 10) == []  # left marked: no stall, no repeat

    # --- stasher ------------------------------------------------------------------------

    def test_stash_function_and_prepared_stasher(self, outbox: ConformanceOutbox) -> None:
        with outbox.engine.begin() as tx:
            stash(tx, OutboxRecord("s", "one", b"1"), table=str(outbox.table))
            prepared = Stasher(outbox.table).prepare(tx)
            prepared.stash(OutboxRecord("s", "two", b"2"))
            prepared.stash(OutboxRecord("s", "three", b"3"))
            assert prepared.stash_many([OutboxRecord("s", "four", b"4"), OutboxRecord("s", "five", b"5")]) == 2
            assert prepared.stash_many([]) == 0
        assert [r.key for r in outbox.binding.mark(_leader(), 10)] == ["one", "two", "three", "four", "five"]

    def test_stash_commits_and_rolls_back_with_the_caller(self, outbox: ConformanceOutbox) -> None:
        with outbox.engine.connect() as conn:
            with conn.begin():
                stash(conn, OutboxRecord("s", "kept", b"1"), table=str(outbox.table))
            tx = conn.begin()
            stash(conn, OutboxRecord("s", "rolled-back", b"2"), table=str(outbox.table))
            tx.rollback()
        with Session(outbox.engine) as session:
            stash(session, OutboxRecord("s", "orm-kept", b"3"), table=str(outbox.table))
            session.commit()
            stash(session, OutboxRecord("s", "orm-rolled-back", b"4"), table=str(outbox.table))
            session.rollback()
        assert [r.key for r in outbox.binding.mark(_leader(), 10)] == ["kept", "orm-kept"]

    def test_invalid_record_writes_nothing(self, outbox: ConformanceOutbox) -> None:
        with outbox.engine.begin() as tx:
            with pytest.raises(InvalidRecordError):
                Stasher(outbox.table).stash_many(tx, [OutboxRecord("s", "ok", b"1"), OutboxRecord("s", "", b"2")])
            with pytest.raises(InvalidRecordError):
                stash(tx, OutboxRecord("bad topic!", "k"), table=str(outbox.table))
        assert outbox.binding.mark(_leader(), 10) == []

    # --- concurrency --------------------------------------------------------------------

    def test_concurrent_markers_hand_each_row_to_one_marker_at_a_time(self, outbox: ConformanceOutbox) -> None:
        """Markers with distinct leader ids race over the same rows. Each row returned is
        marked by the pass that returned it; a row's final leader is the leader of the last
        pass that returned it; a row nobody returned is unmarked.

        A marker may legitimately take over a row another marker holds, after waiting for
        its lock: so two passes overlapping in wall-clock time may both return a row, one
        after the other. The check tolerates that only where the two passes overlapped; for
        passes strictly one after the other, the later one must own the row."""
        outbox.stash_numbered(150)
        markers, passes, limit = 4, 6, 40
        results: list[tuple[float, float, str, list[int]]] = []
        errors: list[BaseException] = []
        start = threading.Barrier(markers)
        lock = threading.Lock()

        def run(leader: str) -> None:
            try:
                start.wait()
                for _ in range(passes):
                    t0 = time.perf_counter()
                    got = outbox.binding.mark(leader, limit)
                    t1 = time.perf_counter()
                    assert all(r.leader_id == leader for r in got), "a returned row is not marked by its marker"
                    ids = _ids(got)
                    assert ids == sorted(set(ids)), "a pass returned duplicate or unsorted rows"
                    with lock:
                        results.append((t0, t1, leader, ids))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(_leader(),)) for _ in range(markers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[0]
        returned_by: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
        for t0, t1, leader, ids in results:
            for i in ids:
                returned_by[i].append((t0, t1, leader))
        final = outbox.leaders()
        for row_id, owner in final.items():
            passes_for_row = sorted(returned_by.get(row_id, []), key=lambda p: p[1])
            if not passes_for_row:
                assert owner is None, f"row {row_id} is marked by {owner} but no marker returned it"
                continue
            owners = {p[2] for p in passes_for_row}
            assert owner in owners, f"row {row_id} ends marked by {owner}, which never returned it"
            last = passes_for_row[-1]
            if owner != last[2]:
                owner_pass = max((p for p in passes_for_row if p[2] == owner), key=lambda p: p[1])
                overlapped = owner_pass[0] < last[1] and last[0] < owner_pass[1]
                assert overlapped, (
                    f"row {row_id} ends marked by {owner}, but a later, non-overlapping pass of {last[2]} returned it"
                )

    def test_concurrent_stashers_racing_a_marker_lose_no_row(self, outbox: ConformanceOutbox) -> None:
        writers, transactions, per_tx = 3, 30, 5
        done = threading.Event()
        errors: list[BaseException] = []
        seen: list[OutboxRecord] = []

        def write(w: int) -> None:
            try:
                stasher = Stasher(outbox.table)
                for t in range(transactions):
                    with outbox.engine.begin() as tx:
                        p = stasher.prepare(tx)
                        for i in range(per_tx):
                            p.stash(OutboxRecord("race", f"w{w}-k{i % 3}", f"{w}:{t * per_tx + i}".encode()))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def mark() -> None:
            leader = _leader()
            try:
                while True:
                    finished = done.is_set()
                    got = outbox.binding.mark(leader, 25)
                    seen.extend(got)
                    if got:
                        assert outbox.binding.purge(_ids(got)) == len(got)
                    elif finished:
                        return
                    else:
                        time.sleep(0.002)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        marker = threading.Thread(target=mark)
        marker.start()
        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        done.set()
        marker.join(60)
        assert not errors, errors[0]
        values = [r.value for r in seen]
        expected = {f"{w}:{n}".encode() for w in range(writers) for n in range(transactions * per_tx)}
        assert len(values) == len(expected) and set(values) == expected, "a stashed row was lost or repeated"
        by_key: dict[str, list[int]] = defaultdict(list)
        for r in seen:
            assert isinstance(r.value, bytes)
            by_key[r.key].append(int(r.value.split(b":")[1]))
        for key, order in by_key.items():
            assert order == sorted(order), f"key {key} was marked out of order"
        assert outbox.leaders() == {}
