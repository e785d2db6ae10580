"""Relay latency at a sustained rate: a writer offers R records/s, the harvester relays them.

    python -m benchmarks.steady_bench --bootstrap 127.0.0.1:19092            # PostgreSQL, both modes
    python -m benchmarks.steady_bench --bootstrap 127.0.0.1:19092 \\
        --database mysql+pymysql://root@127.0.0.1:3306/test --rates 1000,5000 --delivery at-least-once
    python -m benchmarks.steady_bench --bootstrap ... --rates 20000 --search   # the highest sustainable rate
    python -m benchmarks.steady_bench --bootstrap ... --rates 10000 --trace    # where each record's time goes

Three processes besides this one (:mod:`benchmarks.steady_load`, :mod:`benchmarks.steady_watch`):
a writer committing a batch every 10 ms with ``stash_many`` (200-byte values, 10 records per
key, two topics: CreateTime and LogAppendTime), the harvester (``acks=all``), and a
``read_committed`` consumer. Each record's latency is measured from the moment the writer's
commit returned to its Kafka timestamp (CreateTime: the harvester's producer took it;
LogAppendTime: the broker appended it) and to the moment the consumer received it
(``visible``). The first ``--warmup`` seconds are left out of the percentiles.

A rate is **sustainable** when the writer offered it (≥ 97%), the backlog (committed, not yet
in Kafka) did not grow (its slope over the run under 1% of the rate per second), nothing was
lost or reordered, and the CreateTime p99 was at most 100 ms. ``--search`` runs more rates
above the highest sustainable one to find the limit. The CPU each process spent per record is
printed beside it: the writer's own cost is counted apart from the relay's (harvester,
database, broker). Each rate runs in every delivery mode before the next rate, so that modes
are compared minutes apart; the 1-minute load average at each run's start is printed beside
its figures, as latency percentiles on a loaded machine measure the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import uuid
from array import array
from pathlib import Path

from benchmarks.children import python_module
from benchmarks.steady_load import Spec, commits_path, proc_sample
from benchmarks.steady_watch import Watch, dumps, percentile

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
P99_TARGET_MS = 100.0


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def create_topics(bootstrap: str, topics: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(topics[0], partitions),
           NewTopic(topics[1], partitions, config={"message.timestamp.type": "LogAppendTime"})]
    for f in admin.create_topics(new).values():
        f.result(30)


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_topics(topics).values():
        try:
            f.result(30)
        except Exception:  # noqa: BLE001 - left behind, harmless
            pass


class Child:
    """A child process speaking lines: JSON or words on stdout, commands on stdin."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self._log = open(log, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True)
        self.log_path = log

    def expect(self, predicate, what: str) -> str:  # type: ignore[no-untyped-def]
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if predicate(line.strip()):
                return line.strip()
        self.proc.wait(5)
        raise RuntimeError(f"{what}: the child exited ({self.proc.returncode}); its log:\n"
                           + self.log_path.read_text()[-4000:])

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def child_cmd(module: str, args: list[str], python: str | None = None) -> list[str]:
    cmd = python_module(module, *args)
    if python:
        cmd[0] = python  # another environment's pyharvest (a before/after comparison)
    return cmd


def backlog_slope(backlog: list[int], skip: int) -> float:
    """Least-squares slope (records/s) of the backlog after its first ``skip`` seconds."""
    ys = backlog[skip:]
    n = len(ys)
    if n < 3:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def run_one(args: argparse.Namespace, rate: float, delivery: str, work: Path,
            harvester_env: tuple[str, str | None] = ("", None)) -> dict[str, object]:
    from benchmarks.harvest_bench import MachineCpu
    from pyharvest.bindings.sql import create_outbox_table

    tag = uuid.uuid4().hex[:8]
    table, topics = f"steady_{tag}", [f"steady-{tag}-create", f"steady-{tag}-append"]
    create_outbox_table(args.database, table)
    create_topics(args.bootstrap, topics, args.partitions)
    keys = args.keys or max(2, int(rate * args.seconds / args.records_per_key))
    keys += -keys % (2 * args.writers)  # each key one writer's (and one topic's)
    run_dir = work / f"{tag}-{int(rate)}-{delivery}"
    run_dir.mkdir()
    spec = Spec(database=args.database, bootstrap=args.bootstrap, table=table, topics=topics, rate=rate,
                seconds=args.seconds, keys=keys, commits=str(run_dir / "commits.txt"), payload=args.payload,
                delivery=delivery, limits=json.loads(args.limits), producer=json.loads(args.producer_config),
                group=f"steady-{tag}", trace=str(run_dir / "trace.json") if args.trace else None,
                writers=args.writers, tick=args.tick)
    for w in range(args.writers):
        Path(commits_path(spec.commits, w, args.writers)).touch()
    watch = Watch(bootstrap=args.bootstrap, topics=topics, keys=keys, commits=spec.commits, writers=args.writers,
                  warmup=args.warmup,
                  visible_out=str(run_dir / "visible.bin") if args.trace else None, group=f"watch-{tag}")
    result: dict[str, object] = {"database": args.database.split("://")[0].split("+")[0], "delivery": delivery,
                                 "rate": rate, "seconds": args.seconds, "load_start": load_average(),
                                 "harvester_env": harvester_env[0]}
    children: list[Child] = []
    try:
        harvester = Child(child_cmd("benchmarks.steady_load", ["harvester", spec.dumps()], harvester_env[1]),
                          run_dir / "harvester.log")
        children.append(harvester)
        harvester.expect(lambda s: s == "leading", "the harvester's election")
        def start_watcher() -> Child:
            watcher = Child(child_cmd("benchmarks.steady_watch", [dumps(watch)]), run_dir / "watch.log")
            children.append(watcher)
            watcher.expect(lambda s: s.startswith("{"), "the consumer's start")
            return watcher

        # --no-visible: the consumer reads the topics once the writers are done (the Kafka
        # timestamps are in the records), so that its CPU is not taken from the relay's.
        watcher = start_watcher() if args.visible else None
        writers = []
        for w in range(args.writers):
            one = dataclasses.replace(spec, writer=w)
            writers.append(Child(child_cmd("benchmarks.steady_load", ["writer", one.dumps()]), run_dir / f"writer{w}.log"))
            children.append(writers[-1])
        for writer in writers:
            writer.expect(lambda s: s == "ready", "the writer's start")
        servers = MachineCpu(args.bootstrap)
        cpu0 = {"harvester": proc_sample(harvester.proc.pid)["cpu_s"],
                "watch": proc_sample(watcher.proc.pid)["cpu_s"] if watcher else 0.0}
        if args.py_spy:
            # busy: where the harvester's threads spend CPU; idle: also where they wait; gil:
            # only the thread holding the interpreter lock, sampled.
            mode = {"busy": ["--nonblocking"], "idle": ["--idle"], "gil": ["--gil"]}[args.py_spy]
            found = Path(sys.executable).with_name("py-spy")
            spy = subprocess.Popen([str(found) if found.exists() else "py-spy", "record", "--pid", str(harvester.proc.pid),
                                    "--rate", "200", "--duration", str(int(args.seconds)), "--format", "raw",
                                    "--threads", *mode, "-o", str(run_dir / f"py-spy-{args.py_spy}.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for writer in writers:
            writer.send("go")
        summaries = [json.loads(w.expect(lambda s: s.startswith("{"), "the writer's summary")) for w in writers]
        wrote = {"records": sum(x["records"] for x in summaries),
                 "offered_seconds": max(x["offered_seconds"] for x in summaries),
                 "cpu_s": sum(x["cpu_s"] for x in summaries), "commit_s": sum(x["commit_s"] for x in summaries),
                 "late_max_ms": max(x["late_max_ms"] for x in summaries), "batches": sum(x["batches"] for x in summaries)}
        # CPU over the offered time (the drain after it is short when the rate is sustainable).
        cpu = {"harvester": proc_sample(harvester.proc.pid)["cpu_s"] - cpu0["harvester"],
               "watch": proc_sample(watcher.proc.pid)["cpu_s"] - cpu0["watch"] if watcher else 0.0,
               "writer": wrote["cpu_s"], **servers.since()}
        if watcher is None:
            watcher = start_watcher()
        groups: dict[int, dict[str, object]] = {}
        while True:
            line = json.loads(watcher.expect(lambda s: s.startswith("{"), "the consumer's figures"))
            if line.get("final"):
                final = line
                break
            groups[line["group"]] = line
        harvester.send("stop")
        engine = json.loads(harvester.expect(lambda s: s.startswith("{"), "the harvester's summary"))
        if args.py_spy:
            spy.wait(60)
    finally:
        for c in children:
            c.close()
    result["load_end"] = load_average()
    n = wrote["records"]
    result["offered_per_second"] = round(n / wrote["offered_seconds"], 1)
    result["writer"] = {k: round(v, 2) for k, v in wrote.items() if k != "records"}
    result["records"] = n
    measured = groups.get(0, {})
    for kind in ("create", "append", "visible"):
        result[kind] = measured.get(kind, {"n": 0}) if kind != "visible" or args.visible else {"n": 0}
    result["lost"], result["reordered"], result["duplicates"] = final["lost"], final["reordered"], final["duplicates"]
    backlog = final["backlog_per_second"]
    skip = int(args.warmup) + 1
    offered = backlog[: int(args.seconds) + 1]
    result["backlog_max"] = max(offered[skip:], default=0)
    result["backlog_slope_per_s"] = round(backlog_slope(offered, skip), 1)
    result["cpu_us_per_record"] = {k: round(v * 1e6 / max(1, n), 1) for k, v in cpu.items()}
    result["harvester"] = engine
    reasons = []
    if n / wrote["offered_seconds"] < 0.97 * rate:
        reasons.append(f"the writer offered only {n / wrote['offered_seconds']:,.0f}/s")
    if result["backlog_slope_per_s"] > 0.01 * rate:  # type: ignore[operator]
        reasons.append(f"the backlog grew {result['backlog_slope_per_s']}/s")
    if final["lost"] or final["reordered"]:
        reasons.append("records lost or reordered")
    p99 = result["create"].get("p99") if isinstance(result["create"], dict) else None
    if p99 is None or p99 > P99_TARGET_MS:
        reasons.append(f"CreateTime p99 {p99} ms > {P99_TARGET_MS:.0f} ms")
    result["sustainable"] = not reasons
    result["why_not"] = reasons
    if args.trace:
        result["stages_ms"] = trace_stages(spec, run_dir, args.warmup, args.visible)
    if not args.keep:
        drop(args.database, table)
        delete_topics(args.bootstrap, topics)
    return result


def trace_stages(spec: Spec, run_dir: Path, warmup: float, live: bool) -> dict[str, list[float]]:
    """The trace's stages; each record's commit times from its writer's commits file."""
    import bisect

    from benchmarks.steady_trace import stages

    ws = spec.writers
    firsts: list[list[int]] = [[] for _ in range(ws)]
    times: list[list[tuple[float, float]]] = [[] for _ in range(ws)]
    start = float("inf")
    for w in range(ws):
        for line in Path(commits_path(spec.commits, w, ws)).read_text().splitlines():
            parts = line.split()
            if parts[0] == "start":
                start = min(start, float(parts[1]))
            elif parts[0] != "end":
                firsts[w].append(int(parts[1]))
                times[w].append((float(parts[3]), float(parts[4])))

    def committed(seq: int) -> tuple[float, float] | None:
        w, i = seq % ws, seq // ws
        at = bisect.bisect_right(firsts[w], i) - 1
        return times[w][at] if at >= 0 else None

    visible_at = array("d")
    with open(run_dir / "visible.bin", "rb") as f:
        visible_at.frombytes(f.read())
    visible = {i: t for i, t in enumerate(visible_at) if t} if live else {}
    return stages(str(run_dir / "trace.json"), committed, visible, percentile, start + warmup)


def drop(url: str, table: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(sa.text(f"DROP TABLE {table}"))
    engine.dispose()


def print_row(r: dict[str, object]) -> None:
    def lat(kind: str) -> str:
        s = r[kind]
        return "/".join(f"{s[q]:.0f}" if s[q] >= 10 else f"{s[q]:.1f}" for q in ("p50", "p99", "p999", "max")) \
            if isinstance(s, dict) and s.get("n") else "-"

    cpu = r["cpu_us_per_record"]
    assert isinstance(cpu, dict)
    print(f"{r['harvester_env'] or r['database']:>10} {r['delivery']:>13} {r['rate']:>7,.0f} {r['offered_per_second']:>9,.0f} "
          f"{lat('create'):>20} {lat('append'):>20} {lat('visible'):>20} {r['backlog_max']:>8,} "
          f"{'yes' if r['sustainable'] else 'no':>4} {r['load_start']:>5.1f} "
          f"{cpu['harvester']:>5.0f}/{cpu['database']:.0f}/{cpu['broker']:.0f}/{cpu['writer']:.0f}", flush=True)
    if r["why_not"]:
        print(f"{'':>10}   not sustainable: {'; '.join(r['why_not'])}")  # type: ignore[arg-type]
    if "stages_ms" in r:
        print(f"{'':>10}   stages p50/p99/p99.9/max ms: "
              + "; ".join(f"{k} {v}" for k, v in r["stages_ms"].items()))  # type: ignore[union-attr]


HEADER = (f"{'database':>10} {'delivery':>13} {'rate':>7} {'offered':>9} {'CreateTime ms':>20} "
          f"{'LogAppendTime ms':>20} {'visible ms':>20} {'backlog':>8} {'ok':>4} {'load':>5} "
          "µs/rec harv/db/broker/writer")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", default=os.environ.get("PYHARVEST_BENCH_DATABASE", DEFAULT_DATABASE))
    p.add_argument("--bootstrap", default=os.environ.get("PYHARVEST_BENCH_KAFKA"), required=
                   "PYHARVEST_BENCH_KAFKA" not in os.environ, help="an Apache Kafka cluster (LogAppendTime, transactions)")
    p.add_argument("--rates", default="1000,5000,10000,20000", help="records/s offered, comma-separated")
    p.add_argument("--delivery", default="at-least-once,exactly-once")
    p.add_argument("--seconds", type=float, default=30.0, help="how long each rate is offered")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds left out of the percentiles")
    p.add_argument("--records-per-key", type=int, default=10)
    p.add_argument("--keys", type=int, default=0, help="how many keys (default: rate x seconds / records per key)")
    p.add_argument("--writers", type=int, default=1, help="writer processes sharing the rate (harvest_bench's steady: 4)")
    p.add_argument("--tick", type=float, default=0.01, help="seconds between a writer's commits")
    p.add_argument("--payload", type=int, default=200, help="value bytes")
    p.add_argument("--partitions", type=int, default=10)
    p.add_argument("--limits", default="{}", help='harvester limits as JSON, e.g. \'{"markBackoff": "5ms"}\'')
    p.add_argument("--producer-config", default="{}", help="producer properties as JSON (acks=all is set)")
    p.add_argument("--search", action="store_true", help="find the highest sustainable rate above --rates")
    p.add_argument("--no-visible", dest="visible", action="store_false",
                   help="no live consumer: the topics are read after the run (no visible latency; the consumer's CPU "
                        "is then not taken from the relay's)")
    p.add_argument("--trace", action="store_true", help="time each record's stages in the harvester")
    p.add_argument("--py-spy", choices=("busy", "idle", "gil"), default=None,
                   help="profile the harvester with py-spy (collapsed stacks in the run's directory)")
    p.add_argument("--harvesters", default="", help="before/after, interleaved: LABEL=PYTHON,... runs the harvester "
                   "with each environment's Python in turn (an empty PYTHON: this one), rotating which goes first")
    p.add_argument("--keep", action="store_true", help="keep each run's table and topics")
    p.add_argument("--json", default="benchmarks/results/steady.json")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pyharvest-steady-"))
    print(f"steady_bench: runs' files in {work}", file=sys.stderr)
    results: list[dict[str, object]] = []
    print(HEADER, flush=True)
    modes = args.delivery.split(",")
    envs: list[tuple[str, str | None]] = [(label, python or None) for label, _, python in
                                          (e.partition("=") for e in args.harvesters.split(",") if e)] or [("", None)]
    turn = 0
    for rate in [float(r) for r in args.rates.split(",")]:
        for delivery in modes:
            for env in envs[turn % len(envs):] + envs[:turn % len(envs)]:
                results.append(run_one(args, rate, delivery, work, env))
                print_row(results[-1])
            turn += 1
    if len(envs) == 2:
        print_ratios(results, envs[0][0], envs[1][0])
    if args.search:
        for delivery in modes:
            results += search(args, delivery, [r for r in results if r["delivery"] == delivery], work)
    best = {}
    for delivery in modes:
        ok = [r["rate"] for r in results if r["delivery"] == delivery and r["sustainable"]]
        best[delivery] = max(ok, default=0)
        print(f"highest sustainable rate ({delivery}): {best[delivery]:,.0f} records/s")  # type: ignore[str-format]
    print_targets(results, best)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": results, "highest_sustainable": best}, indent=2))
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(r["lost"] == 0 and r["reordered"] == 0 for r in results) else 1


#: Issue 39's targets on the 2-core machine: CreateTime p99 at 10,000 records/s per mode (ms),
#: and the highest sustainable rate at least once.
P99_TARGETS_MS = {"at-least-once": 25.0, "exactly-once": 50.0}
SUSTAINABLE_TARGET = 20_000
CORES = os.cpu_count() or 1


def print_targets(results: list[dict[str, object]], best: dict[str, float]) -> None:
    """Each target beside what the runs gave, with the load they ran under: a run that started
    with a load above the machine's cores measured the machine as much as the relay, and its
    verdict says so."""
    print("\ntargets (issue 39):")

    def loaded(r: dict[str, object]) -> str:
        lo, hi = r["load_start"], r["load_end"]
        busy = max(lo, hi) > CORES  # type: ignore[type-var]
        return f"load {lo:.1f}→{hi:.1f}" + (f" (> {CORES} cores: loaded, not a verdict)" if busy else "")

    for delivery, target in P99_TARGETS_MS.items():
        for r in results:
            if r["delivery"] != delivery or r["rate"] != 10_000:
                continue
            create, visible = r["create"], r["visible"]
            p99 = create.get("p99") if isinstance(create, dict) else None
            seen = visible.get("p99") if isinstance(visible, dict) else None
            verdict = "met" if p99 is not None and p99 <= target else "missed"
            print(f"  {delivery} 10,000/s {r['harvester_env'] or ''}: CreateTime p99 "
                  f"{p99 if p99 is not None else '-'} ms (target ≤ {target:.0f}: {verdict}), visible p99 "
                  f"{seen if seen is not None else '-'} ms; {loaded(r)}")
    if "at-least-once" in best:
        alo = [r for r in results if r["delivery"] == "at-least-once"]
        top = best["at-least-once"]
        verdict = "met" if top >= SUSTAINABLE_TARGET else "missed"
        loads = ", ".join(f"{r['rate']:,.0f}/s {loaded(r)}" for r in alo)  # type: ignore[str-format]
        print(f"  at-least-once highest sustainable {top:,.0f}/s (target ≥ {SUSTAINABLE_TARGET:,}: {verdict}"
              f"{'' if top >= SUSTAINABLE_TARGET or max((r['rate'] for r in alo), default=0) >= SUSTAINABLE_TARGET else '; no rate as high was run'}"  # type: ignore[type-var]
              f"); {loads}")


def print_ratios(results: list[dict[str, object]], before: str, after: str) -> None:
    """``after`` over ``before`` for each rate and mode: CreateTime p50 and p99, visible p99."""
    print(f"\n{after} / {before}:")
    pairs: dict[tuple[object, object], dict[str, dict[str, object]]] = {}
    for r in results:
        pairs.setdefault((r["rate"], r["delivery"]), {})[str(r["harvester_env"])] = r
    for (rate, delivery), two in pairs.items():
        if before in two and after in two:
            def ratio(kind: str, q: str) -> str:
                a, b = two[after][kind], two[before][kind]
                return f"{a[q] / b[q]:.2f}" if isinstance(a, dict) and isinstance(b, dict) and a.get(q) and b.get(q) else "-"
            def cpu(who: str) -> str:
                a, b = two[after]["cpu_us_per_record"][who], two[before]["cpu_us_per_record"][who]  # type: ignore[index]
                return f"{a / b:.2f}" if a and b else "-"

            def marks(r: dict[str, object]) -> float:
                return r["harvester"]["marks"] / max(1, r["records"])  # type: ignore[index, no-any-return, operator]

            loads = f"load {two[before]['load_start']:.1f} / {two[after]['load_start']:.1f}"
            print(f"  {rate:>7,.0f} {delivery:>13}: CreateTime p50 {ratio('create', 'p50')}, p99 {ratio('create', 'p99')}; "  # type: ignore[str-format]
                  f"visible p99 {ratio('visible', 'p99')}; CPU per record: harvester {cpu('harvester')}, "
                  f"database {cpu('database')}; marks per 1,000 records {1000 * marks(two[before]):.0f} → "
                  f"{1000 * marks(two[after]):.0f} ({loads})")


def search(args: argparse.Namespace, delivery: str, done: list[dict[str, object]], work: Path) -> list[dict[str, object]]:
    """Step up from the highest sustainable rate (×1.5) until one fails, then halve the gap twice."""
    ran = list(done)
    out: list[dict[str, object]] = []

    def bounds() -> tuple[float, float | None]:
        lo = max((float(r["rate"]) for r in ran if r["sustainable"]), default=0.0)  # type: ignore[arg-type]
        above = [float(r["rate"]) for r in ran if not r["sustainable"] and float(r["rate"]) > lo]  # type: ignore[arg-type]
        return lo, min(above, default=None)

    for _ in range(5):
        lo, hi = bounds()
        if lo == 0:
            break
        rate = lo * 1.5 if hi is None else (lo + hi) / 2
        if hi is not None and hi - lo <= max(1000.0, 0.1 * lo):
            break
        r = run_one(args, round(rate, -2), delivery, work)
        print_row(r)
        ran.append(r)
        out.append(r)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
