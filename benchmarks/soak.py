"""Hours of steady load: a writer at a fixed rate, the real ``reaper`` relaying it, a record
per minute of what drifts.

    python -m benchmarks.soak --minutes 60 --rate 10000 --bootstrap 127.0.0.1:19092 \\
        --database postgresql+psycopg://postgres@127.0.0.1:5432/soak --out docs/images/soak-postgresql
    python -m benchmarks.soak --minutes 2 --interval 10 --rate 500 ...   # CI's short run
    python -m benchmarks.soak --minutes 14 --interval 30 --rate 5000 --hold 120:600 ...  # a held horizon

The writer, the consumer and the workload are :mod:`benchmarks.steady_bench`'s (10 records
per key and minute, 200-byte values, two topics); the harvester is ``reaper -f`` with a YAML
config, as in production (``acks=all``). Every ``--interval`` seconds (60) a row goes to
``OUT.csv``: the records committed and published in it, CreateTime and visible p50/p99
(``read_committed``), the backlog at its end, the reaper's RSS, threads, file descriptors and
CPU, and the table's cost to its database (:mod:`benchmarks.soak_db`: size, dead tuples and
autovacuum runs on PostgreSQL, InnoDB's history list length on MariaDB). At the end
``OUT.json`` holds the summary and the targets' verdicts, and ``OUT.png`` a plot of each
series (matplotlib: ``pip install 'pyharvest[benchmarks]'``; without it the plot is skipped).

With ``--hold START:SECONDS`` another session holds a snapshot from START seconds after the
writer's start for SECONDS (:class:`benchmarks.soak_db.HorizonHold`: the clean-up horizon held
back, issue 47); each row says whether it was held (``held``), the pages a mark reads from the
lowest id and from where the key-set cursor stands (``mark_probe_buffers``,
``cursor_probe_buffers``), and ``OUT.json`` p99 per window and the table's size before the
hold and 60 s after its release.

Targets (checked from minute 5, the first minutes being start-up): the reaper's RSS grows by
at most 10%; the emptied table at the end is at most twice its size at minute 5; p99 over the
last 10 minutes is at most 1.2x the first 10 (shorter runs compare their first and last
thirds).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import yaml

from benchmarks.soak_db import HorizonHold, TableStats
from benchmarks.steady_bench import ROOT, Child, child_cmd, create_topics, delete_topics, drop, load_average
from benchmarks.steady_load import Spec, proc_sample
from benchmarks.steady_watch import Watch, dumps, histogram_quantile

COLUMNS = ["interval", "minute", "load1", "offered_per_s", "published_per_s", "create_p50_ms", "create_p99_ms",
           "visible_p50_ms", "visible_p99_ms", "backlog", "rss_mib", "threads", "fds", "reaper_cpu_s",
           "marks_per_s", "rows_per_mark", "mark_ms", "purge_ms",
           "table_bytes", "index_bytes", "live_tuples", "dead_tuples", "autovacuum_runs", "vacuum_runs",
           "held", "mark_probe_buffers", "mark_probe_ms", "cursor_probe_buffers", "cursor_probe_ms",
           "data_free_bytes", "file_bytes", "history_list_length"]


def reaper_config(args: argparse.Namespace, table: str, group: str, path: Path) -> None:
    limits = json.loads(args.limits)
    path.write_text(yaml.safe_dump({
        "harvest": {
            "baseKafkaConfig": {"bootstrap.servers": args.bootstrap},
            "producerKafkaConfig": {"acks": "all"},
            "leaderGroupID": group, "dataSource": args.database, "outboxTable": table,
            "delivery": args.delivery, "limits": {"heartbeatTimeout": "2s", **limits},
        },
        "logging": {"level": "Info"},
        # The reaper's own counters (marks, their durations), scraped at each interval's end.
        "metrics": {"address": "127.0.0.1", "port": args.metrics_port},
    }))


#: The reaper's metrics each row takes the interval's difference of.
SCRAPED = ("pyharvest_marks_total", "pyharvest_records_marked_total", "pyharvest_mark_duration_seconds_sum",
           "pyharvest_mark_duration_seconds_count", "pyharvest_purge_duration_seconds_sum",
           "pyharvest_purge_duration_seconds_count")


def scrape(url: str | None) -> dict[str, float]:
    """The :data:`SCRAPED` series of the reaper's ``/metrics``, summed over their labels."""
    if url is None:
        return {}
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:  # noqa: S310 - our own reaper
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in SCRAPED:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def engine_figures(now: dict[str, float], before: dict[str, float], seconds: float) -> dict[str, float]:
    """Marks per second, rows per mark, mean mark and purge ms over an interval."""
    d = {k: now.get(k, 0.0) - before.get(k, 0.0) for k in SCRAPED}
    if not now:
        return {}
    marks = d["pyharvest_mark_duration_seconds_count"]
    purges = d["pyharvest_purge_duration_seconds_count"]
    return {"marks_per_s": round(d["pyharvest_marks_total"] / seconds, 1),
            "rows_per_mark": round(d["pyharvest_records_marked_total"] / max(1.0, d["pyharvest_marks_total"]), 1),
            "mark_ms": round(1000 * d["pyharvest_mark_duration_seconds_sum"] / marks, 2) if marks else None,
            "purge_ms": round(1000 * d["pyharvest_purge_duration_seconds_sum"] / purges, 2) if purges else None}


class Sampler:
    """Samples the reaper's process and the table at each interval's end (from the writer's
    start), on a thread of its own: the consumer's figures for an interval come later."""

    def __init__(self, pid: int, stats: TableStats, start: float, interval: float, metrics: str | None,
                 hold: HorizonHold | None = None) -> None:
        self.pid, self.stats, self.start, self.interval, self.metrics = pid, stats, start, interval, metrics
        self.hold = hold
        self._held = False  # whether the hold was on at any moment of the interval
        self._scraped = scrape(metrics)
        self.rows: dict[int, dict[str, float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def sample(self) -> dict[str, float]:
        row: dict[str, float] = {"load1": load_average()}
        if self.hold is not None:
            row["held"] = int(self._held or self.hold.held)
            self._held = self.hold.held
        try:
            proc = proc_sample(self.pid)
            row.update(rss_mib=round(proc["rss_mib"], 1), threads=proc["threads"], fds=proc["fds"],
                       reaper_cpu_s=round(proc["cpu_s"], 1))
        except (OSError, StopIteration):
            pass
        row.update(self.stats.sample())
        scraped = scrape(self.metrics)
        row.update(engine_figures(scraped, self._scraped, self.interval))
        self._scraped = scraped
        return row

    def _run(self) -> None:
        g = 0
        while True:
            due = self.start + (g + 1) * self.interval
            while time.time() < due:
                if self.stop.wait(min(0.5, max(0.0, due - time.time()))):
                    return
                if self.hold is not None and self.hold.held:
                    self._held = True
            self.rows[g] = self.sample()
            g += 1


def write_row(writer: csv.DictWriter, g: int, interval: float, sample: dict[str, float], line: dict) -> dict:  # type: ignore[type-arg]
    row = {"interval": g, "minute": round((g + 1) * interval / 60, 2), **sample,
           "offered_per_s": round(line["committed"] / interval), "published_per_s": round(line["published"] / interval),
           "create_p50_ms": line["create"].get("p50"), "create_p99_ms": line["create"].get("p99"),
           "visible_p50_ms": line["visible"].get("p50"), "visible_p99_ms": line["visible"].get("p99"),
           "backlog": line["backlog_at_end"]}
    writer.writerow({k: row.get(k, "") for k in COLUMNS})
    return row


def verdicts(rows: list[dict], lines: list[dict], interval: float, end_size: float | None) -> dict[str, object]:  # type: ignore[type-arg]
    """The soak's targets, from minute 5 on (or from a third of the way, for short runs)."""
    if not rows:
        return {}
    n = len(rows)
    settle = min(int(round(300 / interval)) - 1, n // 3)  # the row at minute 5
    window = min(int(round(600 / interval)), max(1, (n - settle) // 3))
    base = rows[settle]
    rss = [r.get("rss_mib") for r in rows[settle:] if r.get("rss_mib")]
    out: dict[str, object] = {"from_minute": base["minute"]}
    if rss:
        out["rss_growth"] = round(max(rss) / rss[0] - 1, 3)
        out["rss_target_met"] = out["rss_growth"] <= 0.10  # type: ignore[operator]
    size = (base.get("table_bytes") or 0) + (base.get("index_bytes") or 0)
    if end_size is not None and size:
        out["size_at_settle"], out["size_at_end"] = size, end_size
        out["size_ratio"] = round(end_size / size, 2)
        out["size_target_met"] = end_size <= 2 * size
    first, last = _merged(lines[settle:settle + window]), _merged(lines[-window:])
    if first and last:
        p99_first, p99_last = histogram_quantile(first, 0.99), histogram_quantile(last, 0.99)
        out["p99_first_ms"], out["p99_last_ms"] = round(p99_first, 2), round(p99_last, 2)
        out["p99_ratio"] = round(p99_last / p99_first, 2)
        out["p99_target_met"] = p99_last <= 1.2 * p99_first
        out["p99_windows"] = [f"minutes {rows[settle]['minute'] - interval / 60:g}-{rows[settle + window - 1]['minute']:g}",
                              f"minutes {rows[-window]['minute'] - interval / 60:g}-{rows[-1]['minute']:g}"]
    return out


def held_windows(rows: list[dict], lines: list[dict], interval: float) -> dict[str, object]:  # type: ignore[type-arg]
    """A held horizon's figures: p99 of each window (held or not), the worst while held, and
    the table's size before the hold and about 60 s after its release."""
    per_window = [{"minute": r["minute"], "held": r.get("held", 0), "p99_ms": r.get("create_p99_ms"),
                   "mark_probe_buffers": r.get("mark_probe_buffers"),
                   "cursor_probe_buffers": r.get("cursor_probe_buffers")} for r in rows]
    held = [i for i, r in enumerate(rows) if r.get("held")]
    out: dict[str, object] = {"windows": per_window}
    if held:
        p99s = [rows[i].get("create_p99_ms") for i in held if rows[i].get("create_p99_ms") is not None]
        out["held_p99_max_ms"] = max(p99s) if p99s else None
        out["held_p99_target_met"] = bool(p99s) and max(p99s) <= 100
        size = lambda r: (r.get("table_bytes") or 0) + (r.get("index_bytes") or 0)  # noqa: E731
        before = rows[held[0] - 1] if held[0] > 0 else rows[0]
        after_i = min(len(rows) - 1, held[-1] + max(1, round(60 / interval)))
        out["size_before_hold"], out["size_after_release_60s"] = size(before), size(rows[after_i])
        out["size_max_while_held"] = max(size(rows[i]) for i in held)
        if size(before):
            out["size_ratio_after_release"] = round(size(rows[after_i]) / size(before), 2)
    return out


def _merged(lines: list[dict]) -> dict[int, int]:  # type: ignore[type-arg]
    out: dict[int, int] = {}
    for line in lines:
        for b, c in line.get("create_hist", {}).items():
            out[int(b)] = out.get(int(b), 0) + c
    return out


def storage(url: str, table: str, spec: str) -> None:
    """PostgreSQL: set the table's storage parameters (``name=value,...``) before the run, or
    with ``reset:name,...`` put them back to the server's defaults (a before/after comparison
    of what ``reaper init-db`` sets)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as c:
        if spec.startswith("reset:"):
            c.execute(sa.text(f"ALTER TABLE {table} RESET ({spec[len('reset:'):]})"))
        else:
            c.execute(sa.text(f"ALTER TABLE {table} SET ({spec})"))
        options = c.execute(sa.text("SELECT reloptions FROM pg_class WHERE oid = CAST(:t AS regclass)"),
                            {"t": table}).scalar()
    engine.dispose()
    print(f"soak: {table}'s storage parameters: {options}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", default=os.environ.get("PYHARVEST_BENCH_DATABASE",
                                                        "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    p.add_argument("--bootstrap", default=os.environ.get("PYHARVEST_BENCH_KAFKA"), required=
                   "PYHARVEST_BENCH_KAFKA" not in os.environ)
    p.add_argument("--minutes", type=float, required=True)
    p.add_argument("--rate", type=float, default=10_000)
    p.add_argument("--interval", type=float, default=60.0, help="seconds per row")
    p.add_argument("--delivery", default="at-least-once")
    p.add_argument("--limits", default="{}", help="the reaper's limits as JSON")
    p.add_argument("--partitions", type=int, default=10)
    p.add_argument("--out", default="benchmarks/results/soak", help="OUT.csv, OUT.json and OUT.png are written")
    p.add_argument("--metrics-port", type=int, default=0, help="the reaper's operations server (0: any free port)")
    p.add_argument("--storage", default=None, help="PostgreSQL: the table's storage parameters for the run "
                   "('autovacuum_vacuum_cost_delay=0,...', or 'reset:name,...' for the server's defaults)")
    p.add_argument("--table", default=None, help="the outbox table (default: a new one, dropped at the end)")
    p.add_argument("--hold", default=None, metavar="START:SECONDS",
                   help="another session holds a snapshot (the clean-up horizon) from START s after the writer's "
                        "start, for SECONDS")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = run(args, out)
    print(json.dumps(summary, indent=2))
    return 0 if summary["lost"] == 0 and summary["reordered"] == 0 else 1


def run(args: argparse.Namespace, out: Path) -> dict[str, object]:
    from pyharvest.bindings.sql import create_outbox_table

    tag = uuid.uuid4().hex[:8]
    table = args.table or f"soak_{tag}"
    topics = [f"soak-{tag}-create", f"soak-{tag}-append"]
    create_outbox_table(args.database, table)
    if args.storage:
        storage(args.database, table, args.storage)
    create_topics(args.bootstrap, topics, args.partitions)
    work = out.parent / f".soak-{tag}"
    work.mkdir()
    seconds = args.minutes * 60
    keys = max(2, int(args.rate * 60 / 10))  # 10 records per key and minute
    commits = work / "commits.txt"
    commits.touch()
    spec = Spec(database=args.database, bootstrap=args.bootstrap, table=table, topics=topics, rate=args.rate,
                seconds=seconds, keys=keys, commits=str(commits))
    watch = Watch(bootstrap=args.bootstrap, topics=topics, keys=keys, commits=str(commits), interval=args.interval,
                  groups=max(1, round(seconds / args.interval)), grace=min(10.0, args.interval / 2), group=f"soak-watch-{tag}")
    reaper_config(args, table, f"soak-{tag}", work / "reaper.yaml")
    lookback = json.loads(args.limits).get("markLookback", 0.0)  # off by default
    stats = TableStats(args.database, table, cursor_rows=int(args.rate * float(lookback or 0)))
    hold: HorizonHold | None = None
    reaper_log = open(work / "reaper.log", "wb")  # noqa: SIM115 - closed below
    reaper = subprocess.Popen(child_cmd("pyharvest", ["-f", str(work / "reaper.yaml")]), cwd=ROOT,
                              stdout=reaper_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    children: list[Child] = []
    rows: list[dict] = []  # type: ignore[type-arg]
    lines: list[dict] = []  # type: ignore[type-arg]
    sampler: Sampler | None = None
    try:
        deadline = time.monotonic() + 120
        while b"elected leader" not in (work / "reaper.log").read_bytes():
            if reaper.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the reaper was not elected:\n" + (work / "reaper.log").read_text()[-3000:])
            time.sleep(0.1)
        listening = re.search(r"metrics and health listening on [^:]+:(\d+)", (work / "reaper.log").read_text())
        metrics = f"http://127.0.0.1:{listening.group(1)}" if listening else None
        watcher = Child(child_cmd("benchmarks.steady_watch", [dumps(watch)]), work / "watch.log")
        children.append(watcher)
        watcher.expect(lambda s: s.startswith("{"), "the consumer's start")
        writer = Child(child_cmd("benchmarks.steady_load", ["writer", spec.dumps()]), work / "writer.log")
        children.append(writer)
        writer.expect(lambda s: s == "ready", "the writer's start")
        writer.send("go")
        while not commits.read_text().startswith("start"):
            time.sleep(0.01)
        start = float(commits.read_text().split("\n", 1)[0].split()[1])
        if args.hold:
            at, held_for = (float(v) for v in args.hold.split(":"))
            hold = HorizonHold(args.database, start + at, held_for)
        sampler = Sampler(reaper.pid, stats, start, args.interval, metrics, hold)
        with open(out.with_suffix(".csv"), "w", newline="") as f:
            table_csv = csv.DictWriter(f, COLUMNS)
            table_csv.writeheader()
            while True:
                line = json.loads(watcher.expect(lambda s: s.startswith("{"), "the consumer's figures"))
                if line.get("final"):
                    final = line
                    break
                g = line["group"]
                while g not in sampler.rows and not sampler.stop.wait(0.05):
                    pass
                rows.append(write_row(table_csv, g, args.interval, sampler.rows.get(g, {}), line))
                lines.append(line)
                f.flush()
                print(f"soak: minute {rows[-1]['minute']:g}: " + ", ".join(
                    f"{k} {rows[-1].get(k)}" for k in ("offered_per_s", "create_p99_ms", "rss_mib", "table_bytes",
                                                        "dead_tuples", "history_list_length", "held",
                                                        "mark_probe_buffers", "cursor_probe_buffers") if k in rows[-1]),
                      file=sys.stderr, flush=True)
        wrote = json.loads(writer.expect(lambda s: s.startswith("{"), "the writer's summary"))
        sampler.stop.set()
        end = stats.sample()  # the backlog drained: the emptied table
        reaper.send_signal(signal.SIGTERM)
        code = reaper.wait(60)
    finally:
        if sampler is not None:
            sampler.stop.set()
        if hold is not None:
            hold.close()
        for c in children:
            c.close()
        if reaper.poll() is None:
            reaper.kill()
            reaper.wait(10)
        reaper_log.close()
    end_size = (end.get("table_bytes") or 0) + (end.get("index_bytes") or 0)
    summary: dict[str, object] = {
        "database": args.database.split("://")[0].split("+")[0], "rate": args.rate, "minutes": args.minutes,
        "delivery": args.delivery, "storage": args.storage, "records": wrote["records"], "writer_cpu_s": round(wrote["cpu_s"], 1),
        "lost": final["lost"], "reordered": final["reordered"], "duplicates": final["duplicates"],
        "reaper_exit": code, "end": end, "targets": verdicts(rows, lines, args.interval, end_size),
        "hold": held_windows(rows, lines, args.interval) if args.hold else None,
        "final_rows": rows[-1:],
    }
    out.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    try:
        from benchmarks.soak_plots import plot

        plot(out.with_suffix(".csv"), out.with_suffix(".png"), summary)
    except ImportError:
        print("soak: matplotlib is not installed (pip install 'pyharvest[benchmarks]'): no plot", file=sys.stderr)
    stats.dispose()
    if not args.table:
        drop(args.database, table)
    delete_topics(args.bootstrap, topics)
    for f in work.iterdir():
        f.unlink()
    work.rmdir()
    return summary


if __name__ == "__main__":
    raise SystemExit(main())
