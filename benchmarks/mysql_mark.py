"""The mark and the purge on MariaDB/MySQL, statement by statement, for each way of marking.

    python -m benchmarks.mysql_mark --database mysql+pymysql://root@127.0.0.1:3306/bench
    python -m benchmarks.mysql_mark --database mysql+mysqldb://root@127.0.0.1:3306/bench --writers 5000

Ways (``--ways``):

* ``generic``: :class:`~pyharvest.plugins.api.TransactionalMark`, the mark before issue 50:
  ``SELECT id … FOR UPDATE``, ``UPDATE … WHERE id IN (ids)``, ``SELECT <rows> WHERE id IN
  (ids)``, commit;
* ``read_ids``: the locking read returns the rows, then ``UPDATE … WHERE id IN (ids)``, commit;
* ``read_range``: the locking read returns the rows, then ``UPDATE … WHERE id BETWEEN first
  AND last AND <unmarked>``, commit (the MySQL plugin's mark since issue 50);
* ``update_limit``: ``UPDATE … ORDER BY id LIMIT n``, commit, and nothing read: not a mark
  (it cannot tell the rows it marked from this leader's earlier marks), the floor that one
  statement would give, for comparison.

Every way marks ``--batch`` rows ``--marks`` times per round from a backlog, each mark followed
by the purge of what it marked, so each way starts from the same table; rounds rotate the ways'
order. The purge alternates mark by mark between the binding's (``DELETE … WHERE id IN (ids)``,
commit) and the same ``DELETE`` in autocommit (one round trip: no commit, no rollback when the
connection goes back to the pool), the fewest a purge can be. ``--writers N`` adds a
writer process inserting N records/s (100 per transaction) beside the marks: load, as the
harvester sees it. Printed: per way, the mark's and the purge's p50/p99 (ms, through the
binding, decoding included), the time of each statement at p50, the round trips per mark
(statements and commits the driver sent), CPU per marked record, and each way's ratio to the
first way's p50.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
import uuid
from collections import defaultdict
from typing import Any

import sqlalchemy as sa

WAYS = ("generic", "read_range", "read_ids", "update_limit")


class _UpdateLimit:
    """``UPDATE … ORDER BY id LIMIT n``, commit: the one-statement floor (returns no rows)."""

    def __init__(self, outbox: Any) -> None:
        self.outbox = outbox

    def statements(self, limit: int) -> list[sa.Executable]:
        return [
            sa.text(
                f"UPDATE {self.outbox.table.name} SET leader_id = :leader_id "
                f"WHERE leader_id IS NULL OR leader_id != :leader_id ORDER BY id LIMIT {int(limit)}"
            )
        ]

    def mark(self, connection: sa.Connection, leader_id: str, limit: int) -> list[Any]:
        with connection.begin():
            connection.execute(self.statements(limit)[0], {"leader_id": leader_id})
        return []


def strategy(way: str, outbox: Any) -> Any:
    from pyharvest.plugins.api import MarkQuery, TransactionalMark
    from pyharvest.plugins.mysql import LockingReadMark

    if way == "generic":
        return TransactionalMark(MarkQuery(outbox))
    if way == "read_range":
        return LockingReadMark(MarkQuery(outbox))
    if way == "read_ids":
        return LockingReadMark(MarkQuery(outbox), by_range=False)
    if way == "update_limit":
        return _UpdateLimit(outbox)
    raise SystemExit(f"unknown way {way!r}; known: {', '.join(WAYS)}")


def fill(engine: sa.Engine, table: str, n: int) -> None:
    rows = [{"kafka_topic": "t", "kafka_key": f"k{i % 1000}", "kafka_value": b"v" * 100, "kafka_headers": "[]"} for i in range(n)]
    t = sa.table(table, sa.column("kafka_topic"), sa.column("kafka_key"), sa.column("kafka_value"), sa.column("kafka_headers"))
    with engine.begin() as c:
        for start in range(0, n, 5000):
            c.execute(sa.insert(t), rows[start : start + 5000])


def writer(url: str, table: str, rate: float, stop: Any) -> None:
    engine = sa.create_engine(url)
    t = sa.table(table, sa.column("kafka_topic"), sa.column("kafka_key"), sa.column("kafka_value"), sa.column("kafka_headers"))
    batch = [{"kafka_topic": "t", "kafka_key": f"w{i}", "kafka_value": b"w" * 100, "kafka_headers": "[]"} for i in range(100)]
    next_at = time.monotonic()
    while not stop.is_set():
        with engine.begin() as c:
            c.execute(sa.insert(t), batch)
        next_at += 100 / rate
        time.sleep(max(0.0, next_at - time.monotonic()))
    engine.dispose()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", default="mysql+pymysql://root@127.0.0.1:3306/test")
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--marks", type=int, default=60, help="marks per way and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--writers", type=float, default=0, help="records/s a writer process inserts meanwhile")
    args = p.parse_args(argv)

    from pyharvest.bindings.sql import create_binding, create_outbox_table

    ways = args.ways.split(",")
    table = f"mark_{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table)
    binding = create_binding(args.database, table)
    engine = binding.engine
    # The purge without its commit's round trip: autocommit, and no rollback when the
    # connection goes back to the pool (what a one-round-trip purge would need).
    autocommit = sa.create_engine(args.database, isolation_level="AUTOCOMMIT", pool_reset_on_return=None)
    purge_statement = binding.dialect.list_filter(binding.outbox.id, "ids")
    purge_autocommit = sa.delete(binding.outbox.table).where(purge_statement)
    sent: dict[str, int] = defaultdict(int)  # what the driver sent during the current mark
    timing: dict[str, float] = {}

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, cursor: Any, statement: str, *a: Any) -> None:
        timing["t"] = time.perf_counter()

    @sa.event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, *a: Any) -> None:
        sent["statements"] += 1
        kind = statement.split(None, 1)[0].upper()
        sent[f"{kind} {sent['statements']}"] = 0
        timing[f"{kind} {sent['statements']}"] = time.perf_counter() - timing["t"]

    @sa.event.listens_for(engine, "commit")
    def _commit(conn: Any) -> None:
        sent["commits"] += 1

    @sa.event.listens_for(engine, "rollback")
    def _rollback(conn: Any) -> None:
        sent["rollbacks"] += 1

    stop = multiprocessing.Event()
    load = None
    if args.writers:
        load = multiprocessing.Process(target=writer, args=(args.database, table, args.writers, stop), daemon=True)
        load.start()
    marks: dict[str, list[float]] = defaultdict(list)
    purges: dict[str, list[float]] = defaultdict(list)
    purges_autocommit: list[float] = []
    cpu: dict[str, list[float]] = defaultdict(list)
    statements: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    trips: dict[str, list[int]] = defaultdict(list)
    try:
        for round_ in range(args.rounds):
            order = ways[round_ % len(ways):] + ways[: round_ % len(ways)]
            for way in order:
                binding.marker = strategy(way, binding.outbox)
                fill(engine, table, args.batch * args.marks + args.batch)
                leader = str(uuid.uuid4())
                cpu0, marked = time.process_time(), 0
                for n in range(args.marks):
                    sent.clear()
                    timing.clear()
                    t0 = time.perf_counter()
                    records = binding.mark(leader, args.batch)
                    marks[way].append(time.perf_counter() - t0)
                    for k, v in timing.items():
                        if k != "t":
                            statements[way][k].append(v)
                    trips[way].append(sent["statements"] + sent["commits"] + sent["rollbacks"])
                    ids = [r.id for r in records]
                    marked += len(ids) or args.batch
                    t0 = time.perf_counter()
                    if ids and n % 2 == 0:
                        binding.purge(ids)
                        purges[way].append(time.perf_counter() - t0)
                    elif ids:  # every other purge: in autocommit, one round trip
                        with autocommit.connect() as c:
                            c.execute(purge_autocommit, {"ids": ids})
                        purges_autocommit.append(time.perf_counter() - t0)
                    else:  # the floor way: purge what it marked, untimed as a purge
                        with engine.begin() as c:
                            c.execute(sa.text(f"DELETE FROM {table} WHERE leader_id = :l"), {"l": leader})
                cpu[way].append((time.process_time() - cpu0) * 1e6 / marked)
                with engine.begin() as c:
                    c.execute(sa.text(f"DELETE FROM {table}"))
                print(f"round {round_ + 1} {way:>12}: mark p50 {pct(marks[way][-args.marks:], 0.5) * 1e3:.2f} ms",
                      flush=True)
    finally:
        stop.set()
        if load is not None:
            load.join(10)
        with engine.begin() as c:
            c.execute(sa.text(f"DROP TABLE {table}"))
        binding.dispose()
        autocommit.dispose()

    base = statistics.median(marks[ways[0]])
    print(f"\n{args.database.split('://')[0]}, batch {args.batch}, {args.marks} marks x {args.rounds} rounds per way"
          + (f", a writer at {args.writers:,.0f} records/s" if args.writers else ", no other load"))
    for way in ways:
        m = marks[way]
        each = ", ".join(f"{k.split()[0]} {statistics.median(v) * 1e3:.2f}" for k, v in statements[way].items())
        purge = (f"purge p50 {pct(purges[way], 0.5) * 1e3:.2f} p99 {pct(purges[way], 0.99) * 1e3:.2f} ms"
                 if purges[way] else "purge -")
        print(f"  {way:>12}: mark p50 {pct(m, 0.5) * 1e3:6.2f} ms p99 {pct(m, 0.99) * 1e3:6.2f} ms "
              f"({statistics.median(m) / base:.2f}x {ways[0]}), {statistics.median(trips[way]):.0f} round trips, "
              f"{statistics.median(cpu[way]):.1f} µs CPU/record; {purge}; statements p50 ms: {each}")
    if purges_autocommit:
        every = [v for way in ways for v in purges[way]]
        print(f"  purge (DELETE … WHERE id IN (ids), commit): p50 {pct(every, 0.5) * 1e3:.2f} ms "
              f"p99 {pct(every, 0.99) * 1e3:.2f} ms; in autocommit, one round trip: "
              f"p50 {pct(purges_autocommit, 0.5) * 1e3:.2f} ms p99 {pct(purges_autocommit, 0.99) * 1e3:.2f} ms "
              f"({statistics.median(purges_autocommit) / statistics.median(every):.2f}x), interleaved mark by mark")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
