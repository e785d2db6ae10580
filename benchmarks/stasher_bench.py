"""One writer committing every 100 records, each way the stasher can be called: the README's
old loop (``prepare(tx)``, then ``stash`` per record: one INSERT each), its new one (``batch``),
a batch the transaction commits without closing it, and ``stash_many``.

    python -m benchmarks.stasher_bench [--database URL] [--records 20000] [--rounds 3]

The ways run interleaved, round after round, each round starting with the next way, so that
the machine's drift (and the way run just before) hits them alike;
each line is one way in one round, records/s. Prints the load average beside the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable

import sqlalchemy as sa

from pyharvest import OutboxRecord
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.stasher import Stasher

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PER_COMMIT = 100


def records(n: int, value: bytes) -> list[OutboxRecord]:
    return [OutboxRecord("t", f"key-{i % 1000}", value, [("h", "v")]) for i in range(n)]


def transactions(recs: list[OutboxRecord]) -> list[list[OutboxRecord]]:
    return [recs[i:i + PER_COMMIT] for i in range(0, len(recs), PER_COMMIT)]


def old_loop(engine: sa.Engine, stasher: Stasher, txs: list[list[OutboxRecord]]) -> None:
    for chunk in txs:
        with engine.begin() as tx:
            prepared = stasher.prepare(tx)
            for r in chunk:
                prepared.stash(r)


def batch(engine: sa.Engine, stasher: Stasher, txs: list[list[OutboxRecord]]) -> None:
    for chunk in txs:
        with engine.begin() as tx, stasher.batch(tx) as out:
            for r in chunk:
                out.stash(r)


def batch_left_open(engine: sa.Engine, stasher: Stasher, txs: list[list[OutboxRecord]]) -> None:
    for chunk in txs:
        with engine.begin() as tx:
            out = stasher.batch(tx, flush_every=1000)  # flushed by the commit
            for r in chunk:
                out.stash(r)


def stash_many(engine: sa.Engine, stasher: Stasher, txs: list[list[OutboxRecord]]) -> None:
    for chunk in txs:
        with engine.begin() as tx:
            stasher.stash_many(tx, chunk)


WAYS: dict[str, Callable[[sa.Engine, Stasher, list[list[OutboxRecord]]], None]] = {
    "prepare + stash per record (old README)": old_loop,
    "batch(tx) in with (README)": batch,
    "batch(tx), committed unclosed": batch_left_open,
    "stash_many": stash_many,
}


def count(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default=os.environ.get("PYHARVEST_BENCH_DATABASE", DEFAULT_DATABASE))
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()

    table = f"bench_{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table)
    engine = sa.create_engine(args.database)
    stasher = Stasher(table)
    txs = transactions(records(args.records, b"x" * args.value_bytes))
    rates: dict[str, list[float]] = {name: [] for name in WAYS}
    print(f"{args.records} records of {args.value_bytes} bytes per way and round, a commit every {PER_COMMIT}, "
          f"{engine.dialect.name}+{engine.dialect.driver}; load average {os.getloadavg()[0]:.2f}")
    try:
        with engine.begin() as tx:  # the table's look-ups, once, outside the timings
            stasher.stash(tx, OutboxRecord("t", "warm-up", b""))
        names = list(WAYS)
        for round_ in range(1, args.rounds + 1):
            # Each round starts with another way: what ran just before (the old loop's many small
            # commits) must not always weigh on the same one.
            start = (round_ - 1) % len(names)
            for name in names[start:] + names[:start]:
                way = WAYS[name]
                before = count(engine, table)
                started = time.perf_counter()
                way(engine, stasher, txs)
                rate = args.records / (time.perf_counter() - started)
                written = count(engine, table) - before
                assert written == args.records, f"{name}: {written} of {args.records} records written"
                rates[name].append(rate)
                print(f"round {round_}  {name:<42} {rate:>9,.0f} records/s")
        print(f"load average {os.getloadavg()[0]:.2f}")
        print("median:")
        for name, values in rates.items():
            print(f"  {name:<42} {statistics.median(values):>9,.0f} records/s")
    finally:
        with engine.begin() as tx:
            tx.execute(sa.text(f"DROP TABLE {table}"))
        engine.dispose()


if __name__ == "__main__":
    main()
