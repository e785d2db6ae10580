"""The stasher's cost per record: process CPU time per record (``time.process_time()``) and
records per second, of each way the stasher can be called, on one database.

    python -m benchmarks.stasher_bench [--database URL] [--records 5000] [--rounds 3]
    python -m benchmarks.stasher_bench --database sqlite:////tmp/stash.db --ways stash,stash_many
    python -m benchmarks.stasher_bench --pythons before=/old/.venv/bin/python,after=.venv/bin/python

Ways (``--ways``, default ``stash,stash_many,insert``):

* ``stash``: ``Stasher.stash(tx, record)``, one record per transaction;
* ``stash_100``: ``Stasher.stash(tx, record)`` for each of 100 records per transaction: what
  one call costs without a transaction's begin and commit;
* ``stash_many``: ``Stasher.stash_many(tx, records)``, 100 records per transaction (``COPY``
  on PostgreSQL with psycopg 3, one ``executemany`` elsewhere);
* ``insert``: the floor under ``stash``: the same one-row transactions through SQLAlchemy
  alone, the row's parameters made beforehand; ``stash`` less ``insert`` is the stasher's own;
* ``stash_many_avro``: ``stash_many`` of 100 records per transaction whose values are dicts,
  serialised by an ``AvroSerializer`` against the registry at ``--registry`` (a record of a
  string and 90 bytes, the same size as the bytes value framed): what typed values cost;
* ``prepare``, ``batch``, ``batch_open``: 100 records per transaction through ``prepare(tx)``
  then ``stash`` per record (one ``INSERT`` each), ``batch(tx)`` in a ``with`` block, and a
  batch the commit flushes without closing it (the README's old and current examples).

Every way runs in a child process: ``--pythons name=python,...`` runs each child under each
interpreter in turn, round after round (``before, after, before, after...``), so that the
machine's drift hits them alike: e.g. a virtualenv with the release before. The child runs
this file as a script from a neutral directory, so that it imports the ``pyharvest`` of the
interpreter's environment, not this checkout's (and says which one it imported). Within a
child the ways run in an order rotated each round. CPU time per record is the fair figure on
a shared machine: it counts what this process spent, not what it waited for; records/s is
given beside it, with the load average before and after each child.

Only the stasher's public API is used, so the same file measures any version of it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PER_COMMIT = 100
DEFAULT_WAYS = "stash,stash_many,insert"
VALUES = {
    "bytes": b"x" * 100,
    "ascii": "x" * 100,
    "unicode": "é" * 50,  # 100 bytes of UTF-8: the text every check must encode
}


# ----------------------------------------------------------------------------- the child


def run_ways(args: argparse.Namespace) -> dict[str, Any]:
    """Runs in the child: every way once, in the order given; their figures."""
    import sqlalchemy as sa

    import pyharvest
    from pyharvest import OutboxRecord
    from pyharvest.bindings.sql import create_outbox_table
    from pyharvest.stasher import Stasher

    table = f"bench_{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table)
    engine = sa.create_engine(args.database)
    stasher = Stasher(table)
    value = VALUES[args.value]
    recs = [OutboxRecord("t", f"key-{i % 1000}", value, [("h", "v")]) for i in range(args.records)]
    txs = [recs[i:i + PER_COMMIT] for i in range(0, len(recs), PER_COMMIT)]

    def stash() -> None:
        for r in recs:
            with engine.begin() as tx:
                stasher.stash(tx, r)

    def stash_100() -> None:
        for chunk in txs:
            with engine.begin() as tx:
                for r in chunk:
                    stasher.stash(tx, r)

    def stash_many() -> None:
        for chunk in txs:
            with engine.begin() as tx:
                stasher.stash_many(tx, chunk)

    typed: Any = None  # the Avro stasher, made (and its schema registered) before any timing
    values = [OutboxRecord("t", r.key, {"id": r.key, "payload": b"x" * 90}, r.headers) for r in recs]
    if "stash_many_avro" in args.ways.split(","):
        from confluent_kafka.schema_registry.avro import AvroSerializer

        from pyharvest.stasher import registry_client

        schema = ('{"type": "record", "name": "Bench", "fields": [{"name": "id", "type": "string"}, '
                  '{"name": "payload", "type": "bytes"}]}')
        typed = Stasher(table, value_serializer=AvroSerializer(registry_client(args.registry), schema))

    def stash_many_avro() -> None:
        for i in range(0, len(values), PER_COMMIT):
            with engine.begin() as tx:
                typed.stash_many(tx, values[i:i + PER_COMMIT])

    def prepare() -> None:
        for chunk in txs:
            with engine.begin() as tx:
                prepared = stasher.prepare(tx)
                for r in chunk:
                    prepared.stash(r)

    def batch() -> None:
        for chunk in txs:
            with engine.begin() as tx, stasher.batch(tx) as out:
                for r in chunk:
                    out.stash(r)

    def batch_open() -> None:
        for chunk in txs:
            with engine.begin() as tx:
                out = stasher.batch(tx, flush_every=1000)  # flushed by the commit
                for r in chunk:
                    out.stash(r)

    # The floor: the table as the database has it (no pyharvest code), its rows made beforehand.
    reflected = sa.Table(table, sa.MetaData(), autoload_with=engine)
    insert = sa.insert(reflected)
    now = datetime.now(UTC)  # bound as the stasher binds it: aware where the column keeps the zone
    row = {
        "create_time": now if engine.dialect.name == "postgresql" else now.replace(tzinfo=None),
        "kafka_topic": "t", "kafka_key": "key-0",
        "kafka_value": value.encode() if isinstance(value, str) else value, "kafka_headers": '[["h","v"]]',
    }
    if "kafka_key_hash" in reflected.c:
        row["kafka_key_hash"] = 0
    rows = [dict(row, kafka_key=r.key) for r in recs]

    def insert_floor() -> None:
        for params in rows:
            with engine.begin() as tx:
                tx.execute(insert, params)

    ways: dict[str, Callable[[], None]] = {
        "stash": stash, "stash_100": stash_100, "stash_many": stash_many, "stash_many_avro": stash_many_avro,
        "insert": insert_floor, "prepare": prepare, "batch": batch, "batch_open": batch_open,
    }
    out: dict[str, Any] = {
        "label": args.label, "database": f"{engine.dialect.name}+{engine.dialect.driver}",
        "pyharvest": str(Path(pyharvest.__file__).resolve().parent.parent), "value": args.value,
        "records": args.records, "load": list(os.getloadavg()), "ways": {},
    }
    try:
        with engine.begin() as tx:  # the table's look-ups, the driver's first statements: once, untimed
            stasher.stash(tx, OutboxRecord("t", "warm-up", value))
            stasher.stash_many(tx, recs[:PER_COMMIT])
            if typed is not None:  # registers the schema: the registry's round trips, untimed
                typed.stash_many(tx, values[:PER_COMMIT])
            tx.execute(insert, rows[0])
        for name in args.ways.split(","):
            way = ways[name]
            before = count(engine, table)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            way()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            written = count(engine, table) - before
            assert written == args.records, f"{name}: {written} of {args.records} records written"
            out["ways"][name] = {"cpu_us": 1e6 * cpu / args.records, "rate": args.records / wall}
    finally:
        with engine.begin() as tx:
            tx.execute(sa.text(f"DROP TABLE {table}"))
        engine.dispose()
    out["load"] += list(os.getloadavg())
    return out


def count(engine: Any, table: str) -> int:
    import sqlalchemy as sa

    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


# ----------------------------------------------------------------------------- the parent


def child(python: str, label: str, ways: list[str], args: argparse.Namespace) -> dict[str, Any]:
    # Run as a script from a neutral directory: with this checkout on sys.path, another
    # environment's interpreter would import this checkout's pyharvest façade over its own.
    cmd = [python, str(Path(__file__).resolve()), "--child", "--label", label, "--database", args.database,
           "--records", str(args.records), "--value", args.value, "--ways", ",".join(ways),
           "--registry", args.registry]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir(), check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{label} ({python}) failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def print_summary(results: list[dict[str, Any]], labels: list[str], ways: list[str]) -> None:
    print("\nmedian CPU per record (µs) and records/s:")
    medians: dict[tuple[str, str], float] = {}
    for label in labels:
        for way in ways:
            runs = [r["ways"][way] for r in results if r["label"] == label]
            cpu = statistics.median(w["cpu_us"] for w in runs)
            rate = statistics.median(w["rate"] for w in runs)
            medians[label, way] = cpu
            each = " / ".join(f"{w['cpu_us']:.1f}" for w in runs)
            print(f"  {label:>8} {way:<11} {cpu:>8.1f} µs  ({each})  {rate:>9,.0f} records/s")
    if "insert" in ways:
        print("the stasher's own (stash less the insert floor):")
        for label in labels:
            if "stash" in ways:
                print(f"  {label:>8} stash       {medians[label, 'stash'] - medians[label, 'insert']:>8.1f} µs")
    if len(labels) >= 2:
        before, after = labels[0], labels[1]
        print(f"{after} / {before}, CPU per record:")
        for way in ways:
            pairs = [(b["ways"][way]["cpu_us"], a["ways"][way]["cpu_us"])
                     for b, a in zip((r for r in results if r["label"] == before),
                                     (r for r in results if r["label"] == after), strict=False)]
            rounds = " ".join(f"{a / b:.2f}" for b, a in pairs)
            print(f"  {way:<11} {medians[after, way] / medians[before, way]:.2f} of the medians "
                  f"(round by round: {rounds})")


def parent(args: argparse.Namespace) -> int:
    pythons = dict(p.split("=", 1) for p in args.pythons.split(",")) if args.pythons else {"current": sys.executable}
    ways = args.ways.split(",")
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        raise SystemExit(f"unknown ways {unknown}; known: {', '.join(WAYS)}")
    results: list[dict[str, Any]] = []
    print(f"{args.records} records of a {args.value} value ({len(VALUES[args.value])} characters) per way, "
          f"{args.database.split('://')[0]}; load average {os.getloadavg()[0]:.2f} at start", flush=True)
    for round_ in range(1, args.rounds + 1):
        start = (round_ - 1) % len(ways)
        order = ways[start:] + ways[:start]  # what ran just before must not always weigh on the same way
        for label, python in pythons.items():
            r = child(python, label, order, args)
            results.append(r)
            figures = "  ".join(f"{w} {r['ways'][w]['cpu_us']:.1f} µs {r['ways'][w]['rate']:,.0f}/s" for w in ways)
            load = f"load {r['load'][0]:.2f} -> {r['load'][3]:.2f}"
            print(f"round {round_} {label:>8}: {figures}  ({load}; {r['database']}; pyharvest of {r['pyharvest']})",
                  flush=True)
    print_summary(results, list(pythons), ways)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


WAYS = ("stash", "stash_100", "stash_many", "stash_many_avro", "insert", "prepare", "batch", "batch_open")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", default=os.environ.get("PYHARVEST_BENCH_DATABASE", DEFAULT_DATABASE))
    p.add_argument("--records", type=int, default=5_000, help="records per way, child and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ways", default=DEFAULT_WAYS, help=f"comma-separated, of {', '.join(WAYS)}")
    p.add_argument("--value", choices=sorted(VALUES), default="bytes", help="the records' value: 100 bytes, "
                   "100 ASCII characters, or 50 non-ASCII ones (100 bytes of UTF-8)")
    p.add_argument("--registry", default=os.environ.get("PYHARVEST_BENCH_SCHEMA_REGISTRY", ""),
                   help="the schema registry's Confluent-compatible URL, for stash_many_avro")
    p.add_argument("--pythons", default="", help="name=python,... : each child under each, interleaved")
    p.add_argument("--json", default=None, help="also write every child's figures here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--label", default="current", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(run_ways(args)))
        return 0
    return parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
