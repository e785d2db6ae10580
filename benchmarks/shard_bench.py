"""Sharded leadership benchmark: drain scaling over processes, and failover per shard.

    python -m benchmarks.shard_bench                          # both scenarios, PostgreSQL + embedded broker
    python -m benchmarks.shard_bench --scenarios drain --rounds 3 --records 200000
    python -m benchmarks.shard_bench --scenarios failover --database mysql+pymysql://root@127.0.0.1:3306/test
    python -m benchmarks.shard_bench --quick                  # toy sizes: correctness only
    python -m benchmarks.shard_bench --scenarios failover --bootstrap 127.0.0.1:9092 \
        --group-protocols classic,consumer --heartbeat-timeout 2s --shards 6 --rounds 3
    python -m benchmarks.shard_bench --bootstrap 127.0.0.1:19092 --delivery at-least-once,exactly-once

``drain`` runs 1, 2 and 3 ``reaper`` processes (shards 1, 4 and 6) over the same backlog, with
the database reached directly and then through the loopback fault proxy adding about 1 ms of
round-trip latency. The configurations are interleaved round by round (in reverse order every
other round), so each round's speed-up compares runs minutes apart, not hours; each run has an
embedded broker of its own unless ``--bootstrap`` names one. The backlog is stashed in one
transaction while the reapers already lead, so the timed part starts at its commit and ends
when the outbox is empty.
Each layout drains two backlogs: over 1,000 keys (200 records a key) and over 100,000 (2 a
key). A shard has at most one record of a key in flight, so few keys per shard means small
purges and produce requests, and the first backlog shows what that costs sharding.

``failover`` runs three processes under a steady stream, then SIGKILLs (and, in a separate run,
SIGTERMs) one that leads something, with shards 1 (the single-leader design) and shards 6. From
each record's commit time and its Kafka timestamp it reports each shard's outage (the longest
commit-to-publish delay), the share of keys that paused for over 1 s, and the duplicates.

``--group-protocols classic,consumer`` runs each failover under both of the leader group's
protocols (``groupProtocol``; ``consumer`` is KIP-848's, Apache Kafka 4.0+), alternating between
them, ``--rounds`` times; ``--heartbeat-timeout`` sets the group's session (three of it).

Every run verifies its output (nothing lost, per-key order); the reapers use the library's
default limits unless ``--heartbeat-timeout`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from benchmarks.broker_process import broker_pids
from benchmarks.children import python_module
from benchmarks.tests_support import create_topic
from benchmarks.topic_check import NUDGE_KEY, read_back
from pyharvest import OutboxRecord, stasher
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.core.outbox.keys import shard_of

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
LAYOUTS = ((1, 1), (2, 4), (3, 6))  # (processes, shards)
TOPIC_PARTITIONS = 10
_SHARD_EVENT = re.compile(r"shard (\d+) (assigned|revoked)")
# A survivor taking a shard over, as its log says (the CLI's format: local time, milliseconds).
_TAKEOVER = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?"
                       r"(?:shard (\d+) assigned|acquired leader status)", re.MULTILINE)
ROOT = Path(__file__).resolve().parent.parent
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class DrainRun:
    round: int
    processes: int
    shards: int
    added_rtt_ms: float
    records: int
    keys: int
    seconds: float = 0.0
    records_per_second: float = 0.0
    reaper_cpu_us_per_record: float = 0.0
    database_cpu_us_per_record: float = 0.0
    broker_cpu_us_per_record: float = 0.0
    machine_busy: float = 0.0  # share of all cores busy during the drain, whatever used them
    lost: int = 0
    hidden: int = 0  # missing at first, read after a write to every partition (benchmarks.topic_check)
    reordered: int = 0
    duplicates: int = 0
    delivery: str = "at-least-once"


@dataclass
class FailoverRun:
    shards: int
    signal: str
    group_protocol: str = "classic"
    round: int = 1
    load_1min: float = 0.0  # the machine's load average at the stop
    records: int = 0
    victim_shards: list[int] = field(default_factory=list)
    outage_s_by_shard: dict[int, float] = field(default_factory=dict)
    survivor_max_delay_s: float = 0.0
    victim_max_delay_s: float = 0.0
    keys_paused_share: float = 0.0
    p99_before_ms: float = 0.0
    # From the stop to the group handing the stopped process's last shard to a survivor (the
    # broker's part: its failure detection and rebalance), and the longest a record of those
    # shards then waited beyond its shard's hand-over (the reapers' part).
    reassigned_s: float | None = None
    after_reassignment_s: float | None = None
    lost: int = 0
    hidden: int = 0  # missing at first, read after a write to every partition (benchmarks.topic_check)
    reordered: int = 0
    duplicates: int = 0
    delivery: str = "at-least-once"


# ----------------------------------------------------------------------------- processes

_DATABASE_COMMANDS = ("postgres", "mariadbd", "mysqld")


def _process_cpu(stat: str) -> tuple[str, float]:
    name, rest = stat.split(" (", 1)[1].rsplit(")", 1)
    fields = rest.split()
    return name, (int(fields[11]) + int(fields[12])) / _TICKS


class CpuUse:
    """CPU seconds used so far by the reapers, the database's processes and the broker (Linux
    ``/proc``), and the machine's busy and total core-seconds: where a drain's CPU goes."""

    def __init__(self, reapers: list[Reaper], broker: set[int]) -> None:
        pids = {r.proc.pid for r in reapers}
        self.reapers = self.database = self.broker = 0.0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                name, seconds = _process_cpu((entry / "stat").read_text())
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            if int(entry.name) in pids:
                self.reapers += seconds
            elif name in _DATABASE_COMMANDS:
                self.database += seconds
            elif int(entry.name) in broker:  # the process on the bootstrap port (broker_process)
                self.broker += seconds
        cpu = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        self.total = sum(cpu) / _TICKS
        self.idle = (cpu[3] + cpu[4]) / _TICKS  # idle and iowait



class Reaper:
    """One ``reaper`` process and its log."""

    def __init__(self, config: Path, log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen([*python_module("pyharvest"), "-f", str(config)],
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def owned(self, shards: int) -> set[int]:
        """The shards this process leads now, from its log."""
        if self.proc.poll() is not None:
            return set()
        text = self.log_path.read_text(errors="replace")
        if shards == 1:
            elected = text.count("elected leader") - text.count("lost leader status") - text.count("fenced:")
            return {0} if elected > 0 else set()
        owned: set[int] = set()
        for shard, what in _SHARD_EVENT.findall(text):
            (owned.add if what == "assigned" else owned.discard)(int(shard))
        return owned

    def takeovers(self, since: float) -> dict[int, float]:
        """When this process was assigned each shard after ``since`` (epoch seconds), from its log."""
        out: dict[int, float] = {}
        for stamp, shard in _TAKEOVER.findall(self.log_path.read_text(errors="replace")):
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= since:
                out.setdefault(int(shard or 0), at)
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


def start_reapers(workdir: Path, processes: int, shards: int, bootstrap: str, url: str, table: str,
                  kafka: dict[str, Any] | None = None, group_protocol: str = "classic",
                  heartbeat_timeout: str | None = None, delivery: str = "at-least-once",
                  producer: dict[str, Any] | None = None) -> list[Reaper]:
    config = workdir / f"reaper-{uuid.uuid4().hex[:6]}.yaml"
    harvest: dict[str, Any] = {"baseKafkaConfig": {"bootstrap.servers": bootstrap, **(kafka or {})},
                               "leaderGroupID": f"shardbench-{uuid.uuid4().hex[:8]}",
                               "dataSource": url, "outboxTable": table}
    if shards > 1:
        harvest["shards"] = shards
    if group_protocol != "classic":
        harvest["groupProtocol"] = group_protocol
    if heartbeat_timeout:
        harvest["limits"] = {"heartbeatTimeout": heartbeat_timeout}
    if delivery != "at-least-once":
        harvest["delivery"] = delivery
    if producer:
        harvest["producerKafkaConfig"] = producer
    config.write_text(yaml.safe_dump({"harvest": harvest, "logging": {"level": "Info"}}))
    return [Reaper(config, workdir / f"{config.stem}-{n}.log") for n in range(processes)]


def wait_balanced(reapers: list[Reaper], shards: int, timeout: float = 120) -> None:
    """Until every shard has a leader and the shards are spread as evenly as they can be,
    held for a second (cooperative rebalancing settles in steps)."""
    deadline, steady_since = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        owned = [r.owned(shards) for r in reapers]
        counts = [len(o) for o in owned]
        spread = min(len(reapers), shards)
        ok = (sorted(s for o in owned for s in o) == list(range(shards))
              and sum(1 for c in counts if c) == spread and max(counts) - min(c for c in counts if c) <= 1)
        if ok:
            steady_since = steady_since or time.monotonic()
            if time.monotonic() - steady_since >= 1.0:
                return
        else:
            steady_since = None
        time.sleep(0.1)
    raise RuntimeError(f"shards not balanced within {timeout}s: {[sorted(r.owned(shards)) for r in reapers]}")


@contextlib.contextmanager
def broker_for_run(args: argparse.Namespace) -> Iterator[str]:
    """The broker of one run: ``--bootstrap``, or a fresh embedded broker. A long benchmark on
    one embedded broker saw its CPU per record grow run after run (the single leader's drain:
    2.3 us a record at first, 3.8 after 13 minutes), which would favour whatever ran first."""
    if args.bootstrap:
        yield args.bootstrap
        return
    from pyharvest.bindings.kafka.embedded import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.bootstrap_servers


def through_proxy(url: str, proxy: Any) -> str:
    host, port = proxy.address
    return sa.make_url(url).set(host=host, port=port).render_as_string(hide_password=False)


def drop(url: str, table: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(sa.text(f"DROP TABLE {table}"))
    engine.dispose()


# ----------------------------------------------------------------------------- drain


def backlog(n: int, keys: int) -> list[tuple[str, bytes]]:
    return [(f"key-{i % keys}", f"{i:011d}|".encode() + b"x" * 88) for i in range(n)]


def run_drain(args: argparse.Namespace, bootstrap: str, workdir: Path, rnd: int, processes: int, shards: int,
              rtt_ms: float, keys: int, delivery: str = "at-least-once") -> DrainRun:
    from tests.helpers.faults.proxy import FaultProxy

    run = DrainRun(rnd, processes, shards, rtt_ms, args.records, keys, delivery=delivery)
    table, topic = f"sbench_{uuid.uuid4().hex[:8]}", f"sbench-{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table, shards=shards)
    create_topic(bootstrap, topic, TOPIC_PARTITIONS)
    records = backlog(args.records, keys)
    db = sa.make_url(args.database)
    proxy = FaultProxy(upstream=(db.host or "127.0.0.1", db.port or 5432)) if rtt_ms else None
    reapers: list[Reaper] = []
    engine = sa.create_engine(args.database)
    try:
        url = args.database
        if proxy is not None:
            proxy.start()
            proxy.set_latency(rtt_ms / 2000)  # each way
            url = through_proxy(args.database, proxy)
        reapers = start_reapers(workdir, processes, shards, bootstrap, url, table, args.kafka_config, delivery=delivery)
        wait_balanced(reapers, shards)
        with engine.connect() as conn:
            with conn.begin():  # one commit: the whole backlog appears at once
                stash = stasher.Stasher(table).prepare(conn)
                for i in range(0, len(records), 5000):
                    stash.stash_many([OutboxRecord(topic, k, v) for k, v in records[i:i + 5000]])
            broker = broker_pids(bootstrap)
            started, before = time.monotonic(), CpuUse(reapers, broker)
            probe = sa.text(f"SELECT id FROM {table} ORDER BY id LIMIT 1")
            while conn.execute(probe).first() is not None:
                conn.rollback()
                time.sleep(0.05)
            run.seconds = time.monotonic() - started
            after = CpuUse(reapers, broker)
    finally:
        for r in reapers:
            r.stop()
        if proxy is not None:
            proxy.stop()
        engine.dispose()
    run.records_per_second = run.records / run.seconds
    per_record = 1e6 / run.records
    run.reaper_cpu_us_per_record = round((after.reapers - before.reapers) * per_record, 1)
    run.database_cpu_us_per_record = round((after.database - before.database) * per_record, 1)
    run.broker_cpu_us_per_record = round((after.broker - before.broker) * per_record, 1)
    total = after.total - before.total
    run.machine_busy = round(1 - (after.idle - before.idle) / total, 3) if total > 0 else 0.0
    report, run.hidden = read_back(bootstrap, topic, records, timeout=max(60, len(records) / 5000),
                                   nudge_missing=not args.bootstrap)
    run.lost, run.reordered, run.duplicates = report.lost_count, report.reorder_count, report.duplicate_count
    keep_loss(report, reapers, table, {})
    drop(args.database, table)
    return run


def drain(args: argparse.Namespace, workdir: Path) -> list[DrainRun]:
    rtts = [0.0] + ([args.latency_ms] if args.latency_ms and not args.database.startswith("sqlite") else [])
    runs: list[DrainRun] = []
    for rnd in range(1, args.rounds + 1):
        # Every other round in reverse: what drifts over a run (the machine, the embedded
        # broker's cost per record) must not favour the layouts that run first.
        layouts = args.layouts if rnd % 2 else tuple(reversed(args.layouts))
        for rtt in rtts:
            for keys in args.drain_keys:
                for (processes, shards), delivery in itertools.product(layouts, args.delivery.split(",")):
                    print(f"drain round {rnd}: {processes} process(es), {shards} shard(s), +{rtt:g} ms, "
                          f"{keys:,} keys, {delivery}", file=sys.stderr, flush=True)
                    with broker_for_run(args) as bootstrap:
                        runs.append(run_drain(args, bootstrap, workdir, rnd, processes, shards, rtt, keys, delivery))
                    print(f"  {runs[-1].records_per_second:,.0f} records/s", file=sys.stderr, flush=True)
    return runs


# ----------------------------------------------------------------------------- failover


class SteadyWriter(threading.Thread):
    """Stashes ``rate`` records/s over ``keys`` keys, committing every 20 ms, and keeps each
    record's commit time (the value is its sequence number)."""

    def __init__(self, url: str, table: str, topic: str, rate: int, keys: int) -> None:
        super().__init__(daemon=True)
        self.url, self.table, self.topic, self.rate, self.keys = url, table, topic, rate, keys
        self.records: list[tuple[str, bytes]] = []
        self.committed_at: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        engine = sa.create_engine(self.url)
        per_tick, seq, tick = max(1, self.rate // 50), 0, time.monotonic()
        with engine.connect() as conn:
            while not self.stopping.is_set():
                batch = [(f"key-{(seq + i) % self.keys}", str(seq + i).encode()) for i in range(per_tick)]
                with conn.begin():
                    stasher.Stasher(self.table).prepare(conn).stash_many(
                        [OutboxRecord(self.topic, k, v) for k, v in batch])
                now = time.time()
                self.records += batch
                self.committed_at += [now] * len(batch)
                seq += per_tick
                tick += 0.02
                time.sleep(max(0.0, tick - time.monotonic()))
        engine.dispose()


def published(bootstrap: str, topic: str, expect: int, timeout: float = 120) -> list[tuple[str, int, float]]:
    """(key, sequence number, Kafka timestamp in s) of every message of ``topic``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"sbench-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    out: list[tuple[str, int, float]] = []
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        deadline, last = time.monotonic() + timeout, time.monotonic()
        # Count what was read: the embedded broker's high watermark lags.
        while time.monotonic() < deadline and (len(out) < expect or time.monotonic() - last < 2):
            for m in consumer.consume(1000, 0.2):
                if m.error() is None and m.key() != NUDGE_KEY.encode():
                    out.append((m.key().decode(), int(m.value()), m.timestamp()[1] / 1000.0))
                    last = time.monotonic()
    finally:
        consumer.close()
    return out


def run_failover(args: argparse.Namespace, bootstrap: str, workdir: Path, shards: int, sig: str,
                 group_protocol: str = "classic", rnd: int = 1, delivery: str = "at-least-once") -> FailoverRun:
    run = FailoverRun(shards, sig, group_protocol, rnd, delivery=delivery)
    table, topic = f"sbench_{uuid.uuid4().hex[:8]}", f"sbench-{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table, shards=shards)
    create_topic(bootstrap, topic, TOPIC_PARTITIONS)
    reapers = start_reapers(workdir, 3, shards, bootstrap, args.database, table, args.kafka_config, group_protocol,
                            args.heartbeat_timeout, delivery)
    writer = SteadyWriter(args.database, table, topic, args.rate, args.keys)
    engine = sa.create_engine(args.database)
    try:
        wait_balanced(reapers, shards)
        writer.start()
        time.sleep(args.warmup)
        victim = next(r for r in reapers if r.owned(shards))
        run.victim_shards = sorted(victim.owned(shards))
        run.load_1min = round(os.getloadavg()[0], 1)
        killed_at = time.time()
        victim.stop(signal.SIGKILL if sig == "SIGKILL" else signal.SIGTERM)
        time.sleep(args.after)
        writer.stopping.set()
        writer.join()
        deadline = time.monotonic() + 120
        with engine.connect() as conn:
            while conn.execute(sa.text(f"SELECT id FROM {table} LIMIT 1")).first() is not None:
                conn.rollback()
                if time.monotonic() > deadline:
                    raise RuntimeError("the outbox did not drain after the failover")
                time.sleep(0.2)
    finally:
        writer.stopping.set()
        for r in reapers:
            r.stop()
        engine.dispose()
    run.records = len(writer.records)
    report, run.hidden = read_back(bootstrap, topic, writer.records, timeout=90, nudge_missing=not args.bootstrap)
    run.lost, run.reordered, run.duplicates = report.lost_count, report.reorder_count, report.duplicate_count
    keep_loss(report, reapers, table, {"killed_at": killed_at, "victim_shards": run.victim_shards})
    measure_outage(run, writer, published(bootstrap, topic, len(writer.records)), killed_at, args.after)
    taken: dict[int, float] = {}
    for r in reapers:
        if r is not victim:
            for shard, at in r.takeovers(killed_at).items():
                taken[shard] = min(at, taken.get(shard, at))
    if all(s in taken for s in run.victim_shards):
        run.reassigned_s = round(max(taken[s] - killed_at for s in run.victim_shards), 2)
        run.after_reassignment_s = round(max(run.outage_s_by_shard.get(s, 0.0) - (taken[s] - killed_at)
                                             for s in run.victim_shards), 2)
    drop(args.database, table)
    return run


def keep_loss(report: Any, reapers: list[Reaper], table: str, context: dict[str, Any]) -> None:
    """On a loss, keep what a diagnosis needs: which records, and the reapers' logs."""
    if not report.lost_count:
        return
    kept = ROOT / "benchmarks" / "results" / f"lost-{table}"
    kept.mkdir(parents=True, exist_ok=True)
    for r in reapers:
        shutil.copy(r.log_path, kept)
    lost = {k: list(ids) for k, ids in report.lost.items()}
    (kept / "lost.json").write_text(json.dumps({**context, "lost": lost}, default=str, indent=1))
    print(f"LOST {report.lost_count} record(s), e.g. {dict(list(lost.items())[:5])}; logs kept in {kept}",
          file=sys.stderr, flush=True)


def measure_outage(run: FailoverRun, writer: SteadyWriter, messages: list[tuple[str, int, float]],
                   killed_at: float, after: float) -> None:
    """Each record's delay is its first publish minus its commit; a shard's outage is the longest
    delay of the records committed from 1 s before the kill to the end of the stream."""
    first: dict[int, float] = {}
    for _key, seq, at in messages:
        first[seq] = min(at, first.get(seq, at))
    groups = max(run.shards, 1)
    by_shard: dict[int, float] = defaultdict(float)
    by_key: dict[str, float] = defaultdict(float)
    before: list[float] = []
    for seq, (key, _value) in enumerate(writer.records):
        committed = writer.committed_at[seq]
        delay = max(0.0, first.get(seq, committed) - committed)
        if committed < killed_at - 1:
            before.append(delay)
        elif committed <= killed_at + after:
            shard = shard_of(key, groups)
            by_shard[shard] = max(by_shard[shard], delay)
            by_key[key] = max(by_key[key], delay)
    run.outage_s_by_shard = {s: round(d, 2) for s, d in sorted(by_shard.items())}
    victims = set(run.victim_shards)
    run.victim_max_delay_s = round(max((d for s, d in by_shard.items() if s in victims), default=0.0), 2)
    run.survivor_max_delay_s = round(max((d for s, d in by_shard.items() if s not in victims), default=0.0), 2)
    run.keys_paused_share = round(sum(1 for d in by_key.values() if d > 1.0) / max(1, len(by_key)), 3)
    if before:
        run.p99_before_ms = round(1000 * statistics.quantiles(before, n=100)[98], 1) if len(before) > 1 else 0.0


def failover(args: argparse.Namespace, workdir: Path) -> list[FailoverRun]:
    runs = []
    for rnd in range(1, args.rounds + 1):
        for sig in args.signals.split(","):
            for shards, delivery in itertools.product(map(int, args.shards.split(",")), args.delivery.split(",")):
                # Alternated, in reverse order every other round: each protocol sees the same load.
                protocols = args.group_protocols.split(",")
                for protocol in protocols if rnd % 2 else protocols[::-1]:
                    print(f"failover: round {rnd}, {sig}, shards {shards}, {protocol} protocol, {delivery}",
                          file=sys.stderr, flush=True)
                    with broker_for_run(args) as bootstrap:
                        runs.append(run_failover(args, bootstrap, workdir, shards, sig, protocol, rnd, delivery))
    return runs


# ----------------------------------------------------------------------------- report


def print_drain(runs: list[DrainRun]) -> None:
    layouts = list(dict.fromkeys((r.processes, r.shards) for r in runs))
    names = [f"{p} proc{'s' if p > 1 else ''}, {s} shard{'s' if s > 1 else ''}" for p, s in layouts]
    print(f"\ndrain: records/s (speed-up over {names[0]} in the same round)")
    print(f"{'round':>5} {'+RTT ms':>7} {'keys':>8} " + " ".join(f"{n:>20}" for n in names)
          + "  lost/reord/dup  reapers' CPU us/record")
    rows: dict[tuple[int, float, int, str], dict[tuple[int, int], DrainRun]] = defaultdict(dict)
    for r in runs:
        rows[(r.round, r.added_rtt_ms, r.keys, r.delivery)][(r.processes, r.shards)] = r
    for (rnd, rtt, keys, delivery), by in sorted(rows.items()):
        first = by.get(layouts[0])
        cells = []
        for layout in layouts:
            r = by.get(layout)
            ratio = (f" ({r.records_per_second / first.records_per_second:.2f}x)"
                     if r and first and layout != layouts[0] else "")
            cells.append(f"{r.records_per_second:,.0f}{ratio}" if r else "-")
        bad = "/".join(str(sum(getattr(r, a) for r in by.values())) for a in ("lost", "reordered", "duplicates"))
        cpu = " ".join(f"{by[x].reaper_cpu_us_per_record:g}" if x in by else "-" for x in layouts)
        print(f"{rnd:>5} {rtt:>7g} {keys:>8,} " + " ".join(f"{c:>20}" for c in cells) + f"  {bad:>14}  {cpu}"
              + (f"  {delivery}" if delivery != "at-least-once" else ""))
    print("\nwhere the CPU went: us/record for reapers / database / broker, and the machine's busy share")
    for r in sorted(runs, key=lambda r: (r.round, r.added_rtt_ms, r.keys, r.processes, r.shards)):
        print(f"  round {r.round} +{r.added_rtt_ms:g} ms, {r.keys:,} keys, {r.processes}x{r.shards}: "
              f"{r.reaper_cpu_us_per_record:g} / {r.database_cpu_us_per_record:g} / {r.broker_cpu_us_per_record:g} us, "
              f"busy {r.machine_busy:.0%}")
    _print_hidden([(f"round {r.round} +{r.added_rtt_ms:g} ms, {r.keys:,} keys, {r.processes}x{r.shards}", r.hidden)
                   for r in runs])


def print_failover(runs: list[FailoverRun]) -> None:
    print("\nfailover: one of three processes stopped under a steady stream")
    print(f"{'protocol':>8} {'delivery':>13} {'rnd':>3} {'signal':>7} {'shards':>6} {'victim shards':>13} "
          f"{'victim outage s':>15} {'survivors max s':>15} {'keys paused':>11} {'p99 before ms':>13} "
          f"{'reassigned s':>12} {'then s':>6} {'load':>5}  lost/reord/dup  outage by shard")
    for r in sorted(runs, key=lambda r: (r.shards, r.signal, r.group_protocol, r.delivery, r.round)):
        victims = ",".join(map(str, r.victim_shards))
        print(f"{r.group_protocol:>8} {r.delivery:>13} {r.round:>3} {r.signal:>7} {r.shards:>6} {victims:>13} "
              f"{r.victim_max_delay_s:>15} {r.survivor_max_delay_s:>15} {r.keys_paused_share:>11.0%} "
              f"{r.p99_before_ms:>13} {_or_dash(r.reassigned_s):>12} {_or_dash(r.after_reassignment_s):>6} "
              f"{r.load_1min:>5}  {r.lost}/{r.reordered}/{r.duplicates}  {r.outage_s_by_shard}")
    print("reassigned: from the stop until the group gave the stopped process's shards to survivors (the "
          "broker's detection and rebalance); then: the longest a record of those shards waited after that")
    _print_hidden([(f"{r.signal}, shards {r.shards}", r.hidden) for r in runs])


def _print_hidden(runs: list[tuple[str, int]]) -> None:
    hidden = [(what, n) for what, n in runs if n]
    if hidden:
        print("hidden by the broker until their partition was written again (read then; not lost): "
              + "; ".join(f"{what}: {n}" for what, n in hidden))


def _or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database", default=DEFAULT_DATABASE)
    p.add_argument("--bootstrap", default="", help="a broker to use instead of the embedded one")
    p.add_argument("--scenarios", default="drain,failover")
    p.add_argument("--records", type=int, default=200_000, help="drain backlog")
    p.add_argument("--keys", type=int, default=1_000, help="failover stream's keys")
    p.add_argument("--drain-keys", type=_counts, default=(1_000, 100_000),
                   help="drain backlogs' distinct keys, each its own runs (default 1000,100000: 200 records a "
                        "key, and 2); a shard has at most one record of a key in flight")
    p.add_argument("--rounds", type=int, default=1, help="drain rounds, interleaved; failover rounds")
    p.add_argument("--group-protocols", default="classic",
                   help="failover: the leader group's protocols, alternated (classic, consumer: KIP-848)")
    p.add_argument("--heartbeat-timeout", default=None,
                   help="the reapers' limits.heartbeatTimeout (e.g. 2s: a 6 s group session); default the library's")
    p.add_argument("--latency-ms", type=float, default=1.0, help="added database round trip (0: none)")
    p.add_argument("--rate", type=int, default=2_000, help="failover stream, records/s")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--after", type=float, default=30.0, help="seconds of stream after the stop")
    p.add_argument("--kafka-config", type=json.loads, default={}, help="JSON properties added to baseKafkaConfig")
    p.add_argument("--layouts", type=_layouts, default=LAYOUTS, help="drain runs as PROCESSESxSHARDS, e.g. 1x1,2x4,3x6")
    p.add_argument("--signals", default="SIGKILL,SIGTERM", help="failover runs")
    p.add_argument("--shards", default="1,6", help="failover runs")
    p.add_argument("--delivery", default="at-least-once",
                   help="at-least-once, exactly-once, or both comma-separated (each run in each mode)")
    p.add_argument("--quick", action="store_true", help="toy sizes, for correctness")
    p.add_argument("--json", default="benchmarks/results/shards.json")
    args = p.parse_args(argv)
    if args.quick:
        args.records, args.rate, args.warmup, args.after = 3_000, 300, 2.0, 8.0
        args.drain_keys = args.drain_keys[:1]
    results: dict[str, list[Any]] = {}
    with tempfile.TemporaryDirectory(prefix="shardbench-") as tmp:
        workdir = Path(tmp)
        if "drain" in args.scenarios:
            results["drain"] = drain(args, workdir)
        if "failover" in args.scenarios:
            results["failover"] = failover(args, workdir)
    if "drain" in results:
        print_drain(results["drain"])
    if "failover" in results:
        print_failover(results["failover"])
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({k: [asdict(r) for r in v] for k, v in results.items()}, indent=2))
    print(f"\nwrote {out}", file=sys.stderr)
    runs = [r for v in results.values() for r in v]
    return 0 if all(r.lost == 0 and r.reordered == 0 for r in runs) else 1


def _layouts(text: str) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(p), int(s)) for p, s in (one.split("x") for one in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PROCESSESxSHARDS[,...], e.g. 1x1,2x4; got {text!r}") from None


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(one) for one in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive whole numbers, e.g. 1000,100000; got {text!r}")
    return counts


if __name__ == "__main__":
    sys.exit(main())
