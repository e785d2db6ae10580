"""Outbox tables on the live databases: stashing into them (concurrently, or all at once), how
many rows are left, and what at-least-once may repeat."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from pyharvest import OutboxRecord, stasher
from tests.helpers.waiting import wait_until


def _count(url: str, table: str, where: str = "") -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            quoted = ".".join(engine.dialect.identifier_preparer.quote(p) for p in table.split("."))
            return int(c.execute(sa.text(f"SELECT COUNT(*) FROM {quoted}{where}")).scalar_one())
    finally:
        engine.dispose()


def outbox_count(url: str, table: str) -> int:
    return _count(url, table)


def marked_count(url: str, table: str) -> int:
    """Rows a leader has marked and not yet purged: its window of records in flight."""
    return _count(url, table, " WHERE leader_id IS NOT NULL")


def collapse_one_off_duplicates(values: list) -> list:
    """R0 R1 R1 R2 -> R0 R1 R2: at-least-once allows a record to repeat immediately."""
    out: list = []
    for v in values:
        if not out or out[-1] != v:
            out.append(v)
    return out


def write_concurrently(url: str, table: str, topic: str, writers: int, per_writer: int, keys: int) -> dict[str, list[bytes]]:
    """Each writer owns its keys, so each key's records are causally ordered (one writer, serial)."""
    engine = sa.create_engine(url, pool_size=writers) if not url.startswith("sqlite") else sa.create_engine(
        url, connect_args={"timeout": 30}
    )
    expected: dict[str, list[bytes]] = {}
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            my_keys = [f"key-{k}" for k in range(keys) if k % writers == w]
            seq = dict.fromkeys(my_keys, 0)
            n = 0
            while n < per_writer:
                with engine.begin() as conn:
                    prepared = stasher.Stasher(table).prepare(conn)
                    for _ in range(min(25, per_writer - n)):
                        key = my_keys[n % len(my_keys)]
                        value = f"{key}:{seq[key]}".encode()
                        seq[key] += 1
                        prepared.stash(OutboxRecord(topic, key, value, headers=[("writer", str(w))]))
                        n += 1
            for key in my_keys:
                expected[key] = [f"{key}:{i}".encode() for i in range(seq[key])]
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.dispose()
    assert not errors, errors
    return expected


def wait_empty(url: str, table: str, timeout: float = 120.0) -> None:
    wait_until(lambda: outbox_count(url, table) == 0, timeout, f"the outbox {table!r} to empty", interval=0.2)



def stash_all(url: str, table: str, records: list[OutboxRecord]) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            stasher.Stasher(table).prepare(conn).stash_many(records)
    finally:
        engine.dispose()


class Writer:
    """One writer thread stashing round-robin over ``keys`` keys (so each key's records are
    causally ordered); ``expected`` is what it committed, in order, and ``committed_at`` when
    each value's transaction committed."""

    def __init__(self, url: str, table: str, topic: str, keys: int = 50, batch: int = 20, pause: float = 0.01) -> None:
        self.engine = sa.create_engine(url)
        self.table, self.topic, self.batch, self.pause = table, topic, batch, pause
        self.keys = [f"k{i}" for i in range(keys)]
        self.expected: list[tuple[str, bytes]] = []
        self.committed_at: dict[bytes, float] = {}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._seq = dict.fromkeys(self.keys, 0)
        self._i = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def write(self, n: int) -> None:
        with self.engine.begin() as conn:
            prepared = stasher.Stasher(self.table).prepare(conn)
            batch = []
            for _ in range(n):
                key = self.keys[self._i % len(self.keys)]
                self._i += 1
                batch.append((key, f"{key}:{self._seq[key]}".encode()))
                self._seq[key] += 1
            prepared.stash_many([OutboxRecord(self.topic, k, v) for k, v in batch])
        now = time.time()
        self.expected += batch
        self.committed_at.update((v, now) for _, v in batch)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.write(self.batch)
                self._stop.wait(self.pause)  # the writer's pace, cut short by stop()
        except BaseException as e:  # noqa: BLE001
            self.errors.append(e)

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self.engine.dispose()
        assert not self.errors, self.errors
