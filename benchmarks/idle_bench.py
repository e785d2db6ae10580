"""Idle cost and lone-record latency: what an idle leader costs its database, and how soon a
record stashed into a quiet outbox is published; plus what PostgreSQL's NOTIFY costs writers.

    python -m benchmarks.idle_bench                                  # PostgreSQL: idle, lone, steady
    python -m benchmarks.idle_bench --database mysql+pymysql://root@127.0.0.1:3306/test --scenarios idle,lone
    python -m benchmarks.idle_bench --database mysql+pymysql://root@127.0.0.1:3306/test --scenarios idle,lone \
        --wake-address 127.0.0.1:19301 --pythons before=/old/.venv/bin/python,after=.venv/bin/python --rounds 3
    python -m benchmarks.idle_bench --scenarios notify-cost          # writers with and without NOTIFY
    python -m benchmarks.idle_bench --pythons before=/old/.venv/bin/python,after=.venv/bin/python --rounds 3

Scenarios:

* ``idle``: a leader over an empty outbox, for ``--idle-seconds`` after it settled; the database's
  transactions per second: PostgreSQL's ``pg_stat_database`` (``xact_commit + xact_rollback``)
  of a database only the benchmark uses (``--database``'s, or ``pyharvest_bench_idle`` when it is
  ``test``); MariaDB's ``SHOW GLOBAL STATUS`` (``Com_commit + Com_rollback``, and ``Questions``:
  statements, server-wide); in
  both, less a window of the same length without the harvester just before (the counter's own
  reads and, on MariaDB, the rest of the machine's work); and, on every database, the commits
  and rollbacks the harvester's engine itself sent (counted in-process).
* ``lone``: one record every 300 ms (``--lone-records`` of them) into an otherwise idle outbox;
  commit → ack latency (the writer's time just before its commit to the record's delivery
  report), p50 and p99; and commit → CreateTime (the record's Kafka timestamp, read back).
  ``--wake-address host:port`` sets ``PYHARVEST_WAKE_ADDRESS`` for the children: the stasher's
  wake-up datagrams where the database has no NOTIFY (an interpreter without them ignores it).
* ``steady``: :mod:`benchmarks.harvest_bench`'s steady scenario (four writers offering
  10,000 records/s, 50 per commit), imported and run as it is.
* ``notify-cost``: no harvester; writer processes commit as fast as they can for a few seconds
  (and four writers at ``--notify-rate`` records/s, 50 per commit), with the stasher's NOTIFY
  off, in every transaction, and as by default (after a quiet spell only), a listener
  connected; transactions/s, records/s and commit latency.

``--pythons name=python,...`` runs every scenario under each interpreter in turn, ``--rounds``
times, interleaved (the machine's speed drifts): e.g. a virtualenv of the release before.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
BENCH_PG_DATABASE = "pyharvest_bench_idle"


@dataclass
class Figures:
    scenario: str
    database: str
    python: str = ""
    load: str = ""
    figures: dict[str, object] = field(default_factory=dict)


# ----------------------------------------------------------------------------- helpers


def bench_database(url: str) -> str:
    """PostgreSQL's ``test`` database is shared with other work: use a database of our own, so
    that ``pg_stat_database`` counts only the benchmark's transactions."""
    import sqlalchemy as sa

    u = sa.make_url(url)
    if u.get_backend_name() != "postgresql" or u.database != "test":
        return url
    admin = sa.create_engine(u, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            if not c.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": BENCH_PG_DATABASE}).first():
                c.exec_driver_sql(f"CREATE DATABASE {BENCH_PG_DATABASE}")
    except sa.exc.DBAPIError as e:
        print(f"idle_bench: cannot create {BENCH_PG_DATABASE} ({str(e).splitlines()[0]}); the server's counter "
              "will include whatever else runs in the shared database", file=sys.stderr)
        return url
    finally:
        admin.dispose()
    return u.set(database=BENCH_PG_DATABASE).render_as_string(hide_password=False)


class ServerTransactions:
    """The database server's transaction counter, where it has one."""

    def __init__(self, url: str) -> None:
        import sqlalchemy as sa

        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.backend = self.engine.url.get_backend_name()

    def read(self) -> int | None:
        import sqlalchemy as sa

        if self.backend == "postgresql":
            with self.engine.connect() as c:
                c.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
                return int(c.execute(sa.text(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
                )).scalar_one())
        if self.backend in ("mysql", "mariadb"):
            with self.engine.connect() as c:
                rows = dict(c.exec_driver_sql("SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit', 'Com_rollback')").all())
                return sum(int(v) for v in rows.values())
        return None

    def questions(self) -> int | None:
        """MariaDB's ``Questions``: statements the server ran for clients, server-wide."""
        if self.backend not in ("mysql", "mariadb"):
            return None
        with self.engine.connect() as c:
            return int(c.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Questions'").one()[1])


class EngineTransactions:
    """Commits, rollbacks and statements of the harvester's engine, counted in-process; and the
    pool's resets on return (a ``ROLLBACK`` where the driver sends one on an idle connection:
    PyMySQL does, psycopg does not)."""

    def __init__(self, engine: object) -> None:
        import sqlalchemy as sa

        self.commits = self.rollbacks = self.statements = self.pool_resets = 0
        sa.event.listen(engine, "commit", self._commit)
        sa.event.listen(engine, "rollback", self._rollback)
        sa.event.listen(engine, "before_cursor_execute", self._statement)
        sa.event.listen(engine.pool, "reset", self._reset)  # type: ignore[attr-defined]

    def _commit(self, *a: object) -> None:
        self.commits += 1

    def _rollback(self, *a: object) -> None:
        self.rollbacks += 1

    def _reset(self, *a: object) -> None:
        self.pool_resets += 1

    def _statement(self, *a: object) -> None:
        self.statements += 1

    def total(self) -> tuple[int, int, int, int]:
        return self.commits, self.rollbacks, self.statements, self.pool_resets


def harvest_args(database: str, limits: str = "{}") -> argparse.Namespace:
    return argparse.Namespace(database=database, limits=limits, producer_config="{}", quick=False,
                              rate=10_000.0, duration=20.0, scenario="steady", skew=False)


def start_leader(database: str, bootstrap: str, table: str, kafka: object = None, limits: str = "{}") -> object:
    from harvest_bench import harvester  # type: ignore[import-not-found]

    h = harvester(harvest_args(database, limits), table, bootstrap, kafka)
    h.start()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    while not h.is_leader:  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise RuntimeError("the harvester was not elected within 60 s")
        time.sleep(0.01)
    return h


def stop(h: object) -> None:
    h.stop()  # type: ignore[attr-defined]
    h.join(60)  # type: ignore[attr-defined]


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


# ----------------------------------------------------------------------------- scenarios


def run_idle(args: argparse.Namespace, bootstrap: str, out: Figures) -> None:
    from harvest_bench import drop  # type: ignore[import-not-found]

    from pyharvest.bindings.sql import create_outbox_table

    table = f"bench_{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table)
    server = ServerTransactions(args.database)
    window = args.idle_seconds
    # The same window without the harvester: the counter reads themselves, and on MariaDB
    # (server-wide counters) whatever the rest of the machine commits meanwhile.
    a, qa = server.read(), server.questions()
    time.sleep(window)
    b, qb = server.read(), server.questions()
    background = b - a if a is not None and b is not None else None
    q_background = qb - qa if qa is not None and qb is not None else None
    h = start_leader(args.database, bootstrap, table, limits=args.limits)
    try:
        counter = EngineTransactions(h.binding.engine)  # type: ignore[attr-defined]
        time.sleep(args.settle)  # leadership's first marks, and the pause growing to its bound
        c0, r0, s0, p0 = counter.total()
        marks0 = h.metrics.marks  # type: ignore[attr-defined]
        a, qa = server.read(), server.questions()
        time.sleep(window)
        b, qb = server.read(), server.questions()
        c1, r1, s1, p1 = counter.total()
        marks1 = h.metrics.marks  # type: ignore[attr-defined]
    finally:
        stop(h)
        drop(args.database, table)
    f = out.figures
    if a is not None and b is not None and background is not None:
        f["server_tx_per_s"] = round((b - a - background) / window, 2)
        f["server_background_tx_per_s"] = round(background / window, 2)
    if qa is not None and qb is not None and q_background is not None:
        # The counter's reads and the rest of the machine's statements, measured just before.
        f["server_questions_per_s"] = round((qb - qa - q_background) / window, 2)
        f["server_background_questions_per_s"] = round(q_background / window, 2)
    # What the harvester's engine put on the wire, each one of MariaDB's Questions: statements,
    # COMMITs, ROLLBACKs, and the pool's reset on return (PyMySQL and mysqlclient send a
    # ROLLBACK for it; psycopg sends nothing on an idle connection: an overcount there).
    f["engine_questions_per_s"] = round(((s1 - s0) + (c1 - c0) + (r1 - r0) + (p1 - p0)) / window, 2)
    f["engine_commits_per_s"] = round((c1 - c0) / window, 2)
    f["engine_rollbacks_per_s"] = round((r1 - r0) / window, 2)
    f["engine_statements_per_s"] = round((s1 - s0) / window, 2)
    f["engine_pool_resets_per_s"] = round((p1 - p0) / window, 2)
    f["marks_per_s"] = round((marks1 - marks0) / window, 2)


def run_lone(args: argparse.Namespace, bootstrap: str, out: Figures) -> None:
    import sqlalchemy as sa
    from harvest_bench import AckClock, drop  # type: ignore[import-not-found]
    from tests_support import create_topic  # type: ignore[import-not-found]

    from pyharvest import OutboxRecord, stasher
    from pyharvest.bindings.sql import create_outbox_table

    table, topic = f"bench_{uuid.uuid4().hex[:8]}", f"bench-{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table)
    create_topic(bootstrap, topic, 1)
    clock = AckClock()
    h = start_leader(args.database, bootstrap, table, kafka=clock, limits=args.limits)
    writer = sa.create_engine(args.database)
    st = stasher.Stasher(table)
    try:
        time.sleep(args.settle)
        commits: list[float] = []  # the writer's stash and commit: part of every latency above
        returned: dict[str, float] = {}  # key → when its commit returned
        with writer.connect() as conn:
            for i in range(args.lone_records):
                with conn.begin():
                    ts = repr(time.time())  # stamped just before commit
                    st.stash(conn, OutboxRecord(topic, f"key-{i}", b"lone", headers=[("ts", ts)]))
                returned[f"key-{i}"] = time.time()
                commits.append(returned[f"key-{i}"] - float(ts))
                time.sleep(0.3)
        deadline = time.monotonic() + 30
        while len(clock.latencies) < args.lone_records and time.monotonic() < deadline:
            time.sleep(0.05)
        create_times, from_return = commit_to_create_time(bootstrap, topic, args.lone_records, returned)
    finally:
        stop(h)
        writer.dispose()
        drop(args.database, table)
    lat = clock.latencies
    f = out.figures
    f["records"], f["acked"] = args.lone_records, len(lat)
    f["stash_and_commit_ms_p50"] = round(percentile(commits, 0.5) * 1000, 1)
    f["stash_and_commit_ms_p99"] = round(percentile(commits, 0.99) * 1000, 1)
    if create_times:
        f["commit_to_create_time_ms_p50"] = round(percentile(create_times, 0.5) * 1000, 1)
        f["commit_to_create_time_ms_p99"] = round(percentile(create_times, 0.99) * 1000, 1)
    if from_return:  # as steady_bench measures: from the commit's return
        f["commit_return_to_create_time_ms_p50"] = round(percentile(from_return, 0.5) * 1000, 1)
        f["commit_return_to_create_time_ms_p99"] = round(percentile(from_return, 0.99) * 1000, 1)
    if lat:
        f["commit_to_ack_ms_p50"] = round(percentile(lat, 0.5) * 1000, 1)
        f["commit_to_ack_ms_p99"] = round(percentile(lat, 0.99) * 1000, 1)
        f["commit_to_ack_ms_max"] = round(max(lat) * 1000, 1)
        f["commit_to_produce_ms_p50"] = round(percentile(clock.to_send, 0.5) * 1000, 1)


def commit_to_create_time(bootstrap: str, topic: str, count: int,
                          returned: dict[str, float]) -> tuple[list[float], list[float]]:
    """Each record's Kafka CreateTime (the producer's, in ms) less its ``ts`` header (the
    writer's time just before its commit), and less the time its commit returned (by key),
    read back from the topic. CreateTime has a millisecond's resolution."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"idle-bench-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    found: list[float] = []
    after_return: list[float] = []
    deadline = time.monotonic() + 30
    try:
        while len(found) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            stamp = dict(msg.headers() or []).get("ts")
            if stamp is not None:
                created = msg.timestamp()[1] / 1000
                found.append(created - float(stamp))
                key = (msg.key() or b"").decode()
                if key in returned:
                    after_return.append(created - returned[key])
    finally:
        consumer.close()
    return found, after_return


def run_steady(args: argparse.Namespace, bootstrap: str, out: Figures) -> None:
    from harvest_bench import Result, run_steady  # type: ignore[import-not-found]

    steady_args = harvest_args(args.database)
    steady_args.rate, steady_args.duration = args.rate, args.duration
    result = Result("steady", args.database.split("://")[0], "at-least-once", 0, 1_000, 100)
    run_steady(steady_args, bootstrap, result)
    f = out.figures
    f["offered_per_s"] = round(result.offered_per_second or 0)
    f["achieved_per_s"] = round(result.records_per_second)
    f["p50_ms"] = round(result.latency_ms_p50 or 0, 1)
    f["p99_ms"] = round(result.latency_ms_p99 or 0, 1)
    f["max_ms"] = round(result.latency_ms_max or 0, 1)
    f["lost"], f["reordered"] = result.lost, result.reordered
    f.update({k: v for k, v in result.notes.items() if k != "received"})


def _notify_writer(database: str, table: str, interval: float, batch: int, seconds: float, out: str,
                   start: object, rate: float) -> None:
    """Commit ``batch`` records per transaction for ``seconds``: at ``rate`` records/s, or as
    fast as possible when ``rate`` is 0."""
    import sqlalchemy as sa

    from pyharvest import OutboxRecord, stasher
    from pyharvest.stasher import notify

    notify.NOTIFY_INTERVAL = interval
    engine = sa.create_engine(database)
    st = stasher.Stasher(table)
    commits: list[float] = []
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
        conn.rollback()
        start.wait()  # type: ignore[attr-defined]
        started = time.monotonic()
        deadline = started + seconds
        n = 0
        while time.monotonic() < deadline:
            if rate and n / rate > time.monotonic() - started:
                time.sleep(n / rate - (time.monotonic() - started))
            records = [OutboxRecord("t", f"key-{(n + i) % 1000}", b"x" * 100) for i in range(batch)]
            n += batch
            with conn.begin():
                st.prepare(conn).stash_many(records)
                before_commit = time.monotonic()
            commits.append(time.monotonic() - before_commit)
    Path(out).write_text(json.dumps({"transactions": len(commits), "records": n, "commit_s": commits}))
    engine.dispose()


NOTIFY_MODES = {"off": float("inf"), "every-tx": 0.0, "default": None}


def run_notify_cost(args: argparse.Namespace, bootstrap: str, out: Figures) -> None:
    import multiprocessing as mp

    import sqlalchemy as sa
    from harvest_bench import drop  # type: ignore[import-not-found]

    from pyharvest.stasher import notify
    from pyharvest.bindings.sql import create_outbox_table
    from pyharvest.plugins.api import load_dialect, parse_table_name

    table = f"bench_{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table)
    engine = sa.create_engine(args.database)
    factory = load_dialect("postgresql").listener(engine, parse_table_name(table))
    listener = factory() if factory is not None else None  # as a harvester would be listening
    drained = [0]
    stop_listening = threading.Event()

    def listen() -> None:
        while listener is not None and not stop_listening.is_set():
            drained[0] += listener.wait(0.1)

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    work = Path(tempfile.mkdtemp(prefix="pyharvest-notify-"))
    ctx = mp.get_context("spawn")
    f = out.figures
    try:
        loads = [(w, b, 0.0) for w in args.notify_writers for b in args.notify_batches]
        if args.notify_rate:
            loads.append((4, 50, args.notify_rate))  # the steady scenario's writers
        for writers, batch, rate in loads:
            for _round in range(args.notify_rounds):
                for mode, interval in NOTIFY_MODES.items():
                    start = ctx.Barrier(writers)
                    outs = [str(work / f"{mode}-{w}.json") for w in range(writers)]
                    procs = [ctx.Process(target=_notify_writer, args=(
                        args.database, table, notify.NOTIFY_INTERVAL if interval is None else interval,
                        batch, args.notify_seconds, outs[w], start, rate / writers)) for w in range(writers)]
                    for p in procs:
                        p.start()
                    for p in procs:
                        p.join()
                    data = [json.loads(Path(o).read_text()) for o in outs]
                    commits = [c for d in data for c in d["commit_s"]]
                    key = f"w{writers}-b{batch}-{mode}" + (f"-at{rate:.0f}" if rate else "")
                    entry = f.setdefault(key, {"tx_per_s": [], "records_per_s": [], "commit_ms_p50": [],
                                               "commit_ms_p99": []})
                    entry["tx_per_s"].append(round(sum(d["transactions"] for d in data) / args.notify_seconds))  # type: ignore[index]
                    entry["records_per_s"].append(round(sum(d["records"] for d in data) / args.notify_seconds))  # type: ignore[index]
                    entry["commit_ms_p50"].append(round(percentile(commits, 0.5) * 1000, 2))  # type: ignore[index]
                    entry["commit_ms_p99"].append(round(percentile(commits, 0.99) * 1000, 2))  # type: ignore[index]
                    with engine.begin() as c:
                        c.exec_driver_sql(f"TRUNCATE {table}")
    finally:
        stop_listening.set()
        t.join()
        if listener is not None:
            listener.close()
        engine.dispose()
        drop(args.database, table)
    f["notifications_heard"] = drained[0]


RUNNERS = {"idle": run_idle, "lone": run_lone, "steady": run_steady, "notify-cost": run_notify_cost}


# ----------------------------------------------------------------------------- driver


def child(args: argparse.Namespace) -> int:
    out = Figures(args.scenario, args.database.split("://")[0], args.label, os.getloadavg().__repr__())
    RUNNERS[args.scenario](args, args.bootstrap, out)
    out.load += f" -> {os.getloadavg()!r}"
    print(json.dumps(asdict(out)))
    return 0


def parent(args: argparse.Namespace) -> int:
    from pyharvest.bindings.kafka.embedded import EmbeddedBroker

    database = bench_database(args.database)
    pythons = dict(p.split("=", 1) for p in args.pythons.split(",")) if args.pythons else {"current": sys.executable}
    results: list[Figures] = []
    root = Path(__file__).resolve().parent.parent
    wake = {"PYHARVEST_WAKE_ADDRESS": args.wake_address} if args.wake_address else {}
    with EmbeddedBroker() if not args.bootstrap else _Null() as broker:
        bootstrap = args.bootstrap or broker.bootstrap_servers
        for rnd in range(args.rounds):
            for scenario in args.scenarios.split(","):
                for label, python in pythons.items():
                    # Run as a script from a neutral directory: with the repository on sys.path,
                    # another virtualenv's interpreter would import this tree's ``pyharvest``.
                    cmd = [python, str(root / "benchmarks" / "idle_bench.py"), "--child", "--scenario", scenario, "--label", label,
                           "--database", database, "--bootstrap", bootstrap, "--rate", str(args.rate),
                           "--duration", str(args.duration), "--idle-seconds", str(args.idle_seconds),
                           "--settle", str(args.settle), "--lone-records", str(args.lone_records),
                           "--notify-seconds", str(args.notify_seconds),
                           "--notify-writers", ",".join(map(str, args.notify_writers)),
                           "--notify-batches", ",".join(map(str, args.notify_batches)),
                           "--notify-rounds", str(args.notify_rounds), "--notify-rate", str(args.notify_rate),
                           "--limits", args.limits]
                    print(f"round {rnd + 1}: {scenario} with {label} ...", file=sys.stderr, flush=True)
                    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir(),
                                          env={**os.environ, "PYTHONPATH": str(root / "benchmarks"), **wake})
                    if proc.returncode != 0:
                        print(proc.stderr[-4000:], file=sys.stderr)
                        return 1
                    fig = Figures(**json.loads(proc.stdout.strip().splitlines()[-1]))
                    results.append(fig)
                    print(f"  {label:>8} {scenario:<12} {json.dumps(fig.figures)}  load {fig.load}", flush=True)
    out = Path(args.json or "benchmarks/results/idle.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        pass


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", default=os.environ.get("PYHARVEST_BENCH_DATABASE", DEFAULT_DATABASE))
    p.add_argument("--bootstrap", default=os.environ.get("PYHARVEST_BENCH_KAFKA"), help="default: the embedded broker")
    p.add_argument("--scenarios", default="idle,lone,steady")
    p.add_argument("--pythons", default="", help="name=python,... : run each scenario under each, interleaved")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--idle-seconds", type=float, default=10.0, help="the idle scenario's measured window")
    p.add_argument("--settle", type=float, default=4.0, help="seconds a new leader idles before measuring")
    p.add_argument("--lone-records", type=int, default=100)
    p.add_argument("--rate", type=float, default=10_000)
    p.add_argument("--duration", type=float, default=20)
    p.add_argument("--notify-seconds", type=float, default=5.0)
    p.add_argument("--notify-writers", type=_ints, default=[1, 4])
    p.add_argument("--notify-batches", type=_ints, default=[1, 50])
    p.add_argument("--notify-rounds", type=int, default=2)
    p.add_argument("--notify-rate", type=float, default=10_000, help="also 4 writers x 50 at this rate; 0: not")
    p.add_argument("--limits", default="{}",
                   help='the idle and lone leaders\' limits, goharvest\'s names: \'{"maxMarkBackoff": "2s"}\'')
    p.add_argument("--wake-address", default=None,
                   help="PYHARVEST_WAKE_ADDRESS for every child (wake-up datagrams where there is no NOTIFY)")
    p.add_argument("--json", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scenario", default=None, help=argparse.SUPPRESS)
    p.add_argument("--label", default="current", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
