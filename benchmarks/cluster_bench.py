"""The harvester on a replicated three-node Apache Kafka cluster (``make kafka-cluster``):
drain, and what production's faults cost it.

    make kafka-cluster
    python -m benchmarks.cluster_bench                      # every scenario, 3 rounds, PostgreSQL
    python -m benchmarks.cluster_bench --scenarios drain,rolling --rounds 3
    python -m benchmarks.cluster_bench --quick              # toy sizes: correctness only

Two ``reaper`` processes lead four shards of a PostgreSQL outbox (the library's default limits:
``heartbeatTimeout`` 5 s, so a 15 s group session), at least once unless ``--delivery`` says
otherwise. The cluster is found through ``PYHARVEST_TEST_KAFKA_CLUSTER`` or ``--bootstrap``.

``drain``
    a backlog drained into a topic of replication 3 (``min.insync.replicas`` 2, the cluster's
    default) and into one of replication 1, alternately (in reverse order every other round).
``rolling``
    a rolling restart (each node SIGTERMed, restarted, its ISR full again) under a paced writer:
    the longest any record waited from its commit to its append (the longest stall of any key)
    and the topic's longest silence while records waited; then the same restart while a backlog
    drains (the drain rate, beside ``drain``'s at replication 3).
``kill``
    under a paced writer, the node that leads the most outbox partitions SIGKILLed, kept down
    until the cluster moved on, restarted; then the same for the leader group's coordinator:
    the longest stall of any key. ``--producer delivery.timeout.ms=20000`` runs each also with
    that producer setting, alternately.
``below-min-isr``
    two nodes stopped (the ISRs shrink to one, below ``min.insync.replicas``: produce refused),
    then one started: how long from the moment every partition of the outbox and leader topics
    has two in-sync replicas again to the first record appended.

Times are the broker's: the topics keep ``message.timestamp.type=LogAppendTime``, so a record
that librdkafka retried for seconds is timed at its append, not at its first attempt. Every run
verifies its output (nothing lost, per-key order). The targets of issue 40 are printed beside
the figures; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.shard_bench import SteadyWriter, backlog, drop, start_reapers, wait_balanced
from benchmarks.topic_check import read_back
from pyharvest import OutboxRecord, stasher
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.faults.cluster import CLUSTER_ENV, KafkaCluster

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_CLUSTER = "127.0.0.1:19192,127.0.0.1:19194,127.0.0.1:19196"  # make kafka-cluster
SHARDS, PROCESSES, PARTITIONS = 4, 2, 4
SCENARIOS = ("drain", "rolling", "kill", "below-min-isr")
BROKER_SESSION_S = 9.0  # broker.session.timeout.ms, Kafka's default (.ci/kafka/cluster.properties keeps it)
TARGETS = {
    "rolling_key_stall_s": ("longest key stall during a rolling restart", "<=", 3.0),
    "kill_key_stall_s": ("longest key stall after a node's SIGKILL", "<=", BROKER_SESSION_S + 3.0),
    "flowing_after_min_isr_s": ("records flowing after min ISR is met again", "<=", 5.0),
    "drain_rf3_over_rf1": ("drain at replication 3 over replication 1", ">=", 0.7),
}


@dataclass
class Run:
    scenario: str
    round: int
    variant: str = ""
    records: int = 0
    seconds: float = 0.0
    records_per_second: float = 0.0
    key_stall_s: float = 0.0  # the longest any record waited from commit to append
    topic_stall_s: float = 0.0  # the topic's longest silence while a record waited
    flowing_after_s: float | None = None
    load_1min: float = 0.0
    lost: int = 0
    reordered: int = 0
    duplicates: int = 0
    notes: dict[str, Any] = field(default_factory=dict)


_OPEN: list[Outbox] = []  # stopped however the benchmark ends: no reaper outlives it


class Outbox:
    """A sharded outbox, its topic (log-append timestamps) and two reapers leading it."""

    def __init__(self, args: argparse.Namespace, cluster: KafkaCluster, workdir: Path, replication: int = 3,
                 producer: dict[str, Any] | None = None) -> None:
        _OPEN.append(self)
        self.args, self.cluster = args, cluster
        self.table, self.topic = f"cbench_{uuid.uuid4().hex[:8]}", f"cbench-{uuid.uuid4().hex[:8]}"
        create_outbox_table(args.database, self.table, shards=SHARDS)
        config = {"message.timestamp.type": "LogAppendTime"}
        if replication == 1:
            config["min.insync.replicas"] = "1"  # the cluster's 2 would refuse every write
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        admin.create_topics([NewTopic(self.topic, PARTITIONS, replication, config=config)])[self.topic].result(30)
        self.reapers = start_reapers(workdir, PROCESSES, SHARDS, cluster.bootstrap_servers, args.database,
                                     self.table, delivery=args.delivery, producer=producer)
        wait_balanced(self.reapers, SHARDS)
        self.group = _group_of(self.reapers)

    def count(self) -> int:
        engine = sa.create_engine(self.args.database)
        try:
            with engine.connect() as c:
                return int(c.execute(sa.text(f"SELECT COUNT(*) FROM {self.table}")).scalar_one())
        finally:
            engine.dispose()

    def wait_empty(self, timeout: float = 300) -> float:
        deadline = time.monotonic() + timeout
        while self.count():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the outbox did not drain within {timeout:g}s")
            time.sleep(0.1)
        return time.monotonic()

    def stop(self) -> None:
        for r in self.reapers:
            r.stop()
        if self in _OPEN:
            _OPEN.remove(self)

    def close(self, expected: list[tuple[str, bytes]], run: Run) -> None:
        self.stop()
        died = [r.log_path.name for r in self.reapers if r.proc.returncode not in (0, None)]
        report, _ = read_back(self.cluster.bootstrap_servers, self.topic, expected, timeout=120, nudge_missing=False)
        run.lost, run.reordered, run.duplicates = report.lost_count, report.reorder_count, report.duplicate_count
        if died or (not report.ok and (report.lost_count or report.reorder_count)):
            raise RuntimeError(f"{run.scenario} round {run.round}: {report}; reapers that failed: {died}")
        drop(self.args.database, self.table)
        self.cluster.delete_topics([self.topic, f"{self.group}.neli", f"{self.group}.progress"])


def _group_of(reapers: list[Any]) -> str:
    for r in reapers:
        found = re.search(r"joined leader group '([^']+)'", r.log_path.read_text(errors="replace"))
        if found:
            return found.group(1)
    return ""


def appended(bootstrap: str, topic: str, expect: int, timeout: float = 120) -> dict[int, float]:
    """Sequence number -> the broker's append time (s) of its first copy."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cbench-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    out: dict[int, float] = {}
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        deadline, last = time.monotonic() + timeout, time.monotonic()
        while time.monotonic() < deadline and (len(out) < expect or time.monotonic() - last < 2):
            for m in consumer.consume(1000, 0.2):
                if m.error() is None:
                    seq, at = int(m.value()), m.timestamp()[1] / 1000.0
                    out[seq] = min(at, out.get(seq, at))
                    last = time.monotonic()
    finally:
        consumer.close()
    return out


def stalls(writer: SteadyWriter, appends: dict[int, float], since: float, until: float) -> tuple[float, float]:
    """(the longest any record committed in [since, until] waited for its append, the topic's
    longest silence while a committed record waited)."""
    key_stall, waits = 0.0, []
    for seq, committed in enumerate(writer.committed_at):
        if since <= committed <= until and seq in appends:
            key_stall = max(key_stall, appends[seq] - committed)
            waits.append((appends[seq], committed))
    waits.sort()
    topic_stall = max((b - max(a, committed_b) for (a, _), (b, committed_b) in zip(waits, waits[1:], strict=False)),
                      default=0.0)
    return round(max(0.0, key_stall), 2), round(max(0.0, topic_stall), 2)


# ------------------------------------------------------------------------------ scenarios


def run_drain(args: argparse.Namespace, cluster: KafkaCluster, workdir: Path, rnd: int, replication: int,
              fault: Callable[[], None] | None = None, keys: int | None = None) -> Run:
    keys = keys or args.keys
    run = Run("drain" if fault is None else "rolling-drain", rnd, f"rf {replication}, {keys} keys")
    box = Outbox(args, cluster, workdir, replication)
    records = [(k, str(i).encode()) for i, (k, _) in enumerate(backlog(args.records, keys))]
    engine = sa.create_engine(args.database)
    with engine.begin() as conn:
        stasher.Stasher(box.table).prepare(conn).stash_many([OutboxRecord(box.topic, k, v) for k, v in records])
    started = time.monotonic()
    engine.dispose()
    run.load_1min = round(os.getloadavg()[0], 1)
    faulting = threading.Thread(target=fault, daemon=True) if fault is not None else None
    if faulting is not None:
        faulting.start()
    run.seconds = round(box.wait_empty() - started, 2)
    if faulting is not None:
        faulting.join()
        cluster.wait_full_isr()
    run.records = len(records)
    run.records_per_second = round(len(records) / run.seconds)
    box.close(records, run)
    return run


def run_fault(args: argparse.Namespace, cluster: KafkaCluster, workdir: Path, rnd: int, scenario: str,
              fault: Callable[[Outbox], dict[str, Any]], producer: dict[str, Any] | None = None) -> Run:
    run = Run(scenario, rnd, " ".join(f"{k}={v}" for k, v in (producer or {}).items()))
    box = Outbox(args, cluster, workdir, producer=producer)
    writer = SteadyWriter(args.database, box.table, box.topic, args.rate, args.keys)
    writer.start()
    try:
        time.sleep(args.warmup)
        run.load_1min = round(os.getloadavg()[0], 1)
        since = time.time()
        run.notes = fault(box)
        cluster.wait_full_isr()
        time.sleep(args.after)
        until = time.time()
        writer.stopping.set()
        writer.join()
        box.wait_empty()
    finally:
        writer.stopping.set()
    run.records = len(writer.records)
    appends = appended(cluster.bootstrap_servers, box.topic, len(writer.records))
    run.key_stall_s, run.topic_stall_s = stalls(writer, appends, since - 1, until)
    flowing_from = run.notes.pop("min_isr_met_at", None)
    if flowing_from is not None:
        after = [at for at in appends.values() if at >= flowing_from]
        run.flowing_after_s = round(min(after) - flowing_from, 2) if after else None
    box.close(writer.records, run)
    return run


def rolling_restart(cluster: KafkaCluster) -> dict[str, Any]:
    took = {}
    for node in sorted(cluster.nodes):
        t = time.monotonic()
        cluster.stop(node)
        cluster.start(node)
        cluster.wait_full_isr()
        took[f"node {node}"] = round(time.monotonic() - t, 1)
    return took


def crash(cluster: KafkaCluster, victim: int, moved: Callable[[], bool]) -> float:
    """SIGKILL ``victim``, keep it down until the cluster moved on, restart it; seconds down."""
    t = time.monotonic()
    cluster.kill(victim)
    deadline = time.monotonic() + 60
    while not moved() and time.monotonic() < deadline:
        time.sleep(0.1)
    down = time.monotonic() - t
    cluster.start(victim)
    cluster.wait_full_isr()
    return round(down, 1)


def kill_leader(box: Outbox) -> dict[str, Any]:
    leaders = box.cluster.leaders(box.topic)
    victim = max(set(leaders.values()), key=list(leaders.values()).count)
    led = [p for p, n in leaders.items() if n == victim]
    moved = lambda: all(box.cluster.leaders(box.topic).get(p) not in (victim, -1) for p in led)  # noqa: E731
    return {"victim": victim, "partitions": led, "moved_after_s": crash(box.cluster, victim, moved)}


def kill_coordinator(box: Outbox) -> dict[str, Any]:
    victim = box.cluster.coordinator_of(box.group)
    assert victim is not None
    moved = lambda: box.cluster.coordinator_of(box.group) not in (None, victim)  # noqa: E731
    return {"victim": victim, "moved_after_s": crash(box.cluster, victim, moved)}


def below_min_isr(box: Outbox) -> dict[str, Any]:
    first, second, _ = sorted(box.cluster.nodes)
    box.cluster.stop(first)
    box.cluster.stop(second)
    time.sleep(box.args.down)
    box.cluster.start(first)
    topics = [box.topic, f"{box.group}.neli"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        metadata = box.cluster.admin().list_topics(timeout=5)
        if all(len(p.isrs) >= 2 for t in topics for p in metadata.topics[t].partitions.values()):
            break
        time.sleep(0.05)
    met = time.time()
    box.cluster.start(second)
    return {"min_isr_met_at": met}


# ------------------------------------------------------------------------------ report


def summary(runs: list[Run]) -> dict[str, float]:
    def median(values: list[float]) -> float:
        return round(statistics.median(values), 2) if values else float("nan")

    by = lambda name: [r for r in runs if r.scenario == name]  # noqa: E731
    out: dict[str, float] = {}
    shapes = sorted({r.variant.split(", ", 1)[1] for r in by("drain")}, key=lambda v: int(v.split()[0]))
    for shape in shapes:
        rf3 = [r.records_per_second for r in by("drain") if r.variant == f"rf 3, {shape}"]
        rf1 = [r.records_per_second for r in by("drain") if r.variant == f"rf 1, {shape}"]
        out[f"drain over {shape}: replication 3, median rec/s"] = median(rf3)
        out[f"drain over {shape}: replication 1, median rec/s"] = median(rf1)
        out[f"drain_rf3_over_rf1 ({shape})"] = round(median(rf3) / median(rf1), 2) if rf3 and rf1 else float("nan")
    rf3 = [r.records_per_second for r in by("drain") if r.variant == f"rf 3, {shapes[0]}"] if shapes else []
    out.update({
        "rolling_key_stall_s": max((r.key_stall_s for r in by("rolling")), default=float("nan")),
        "kill_key_stall_s": max((r.key_stall_s for r in by("kill-leader") + by("kill-coordinator") if not r.variant),
                                default=float("nan")),
        "flowing_after_min_isr_s": max((r.flowing_after_s for r in by("below-min-isr")
                                        if r.flowing_after_s is not None), default=float("nan")),
    })
    for variant in sorted({r.variant for r in by("kill-leader") + by("kill-coordinator")}):
        for name in ("kill-leader", "kill-coordinator"):
            mine = [r for r in by(name) if r.variant == variant]
            out[f"{name} {variant or 'defaults'}: median key stall s"] = median([r.key_stall_s for r in mine])
            out[f"{name} {variant or 'defaults'}: median duplicates"] = median([float(r.duplicates) for r in mine])
    rolling_rates = [r.records_per_second for r in by("rolling-drain")]
    if rolling_rates and rf3:
        out["rolling_drain_over_drain"] = round(median(rolling_rates) / median(rf3), 2)
    return out


def print_report(runs: list[Run]) -> None:
    print(f"{'scenario':<18} {'round':>5} {'variant':<17} {'records':>8} {'rec/s':>7} {'key stall':>9} "
          f"{'topic stall':>11} {'flowing':>7} {'dup':>5} {'load':>5}  notes")
    for r in runs:
        flowing = "-" if r.flowing_after_s is None else f"{r.flowing_after_s:.2f}"
        rate = f"{r.records_per_second}" if r.records_per_second else "-"
        print(f"{r.scenario:<18} {r.round:>5} {r.variant:<17} {r.records:>8} {rate:>7} {r.key_stall_s:>9.2f} "
              f"{r.topic_stall_s:>11.2f} {flowing:>7} {r.duplicates:>5} {r.load_1min:>5}  {json.dumps(r.notes)}")
    print("\ntargets (printed, not asserted):")
    for name, value in summary(runs).items():
        if name.split(" (")[0] in TARGETS:
            what, op, target = TARGETS[name.split(" (")[0]]
            what += name[len(name.split(" (")[0]):]
            met = value <= target if op == "<=" else value >= target
            print(f"  {what}: {value} ({op} {target}: {'met' if met else 'NOT met'})")
        else:
            print(f"  {name}: {value}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", help=f"the cluster (default: ${CLUSTER_ENV}, else make kafka-cluster's)")
    p.add_argument("--database", default=DEFAULT_DATABASE)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--records", type=int, default=100_000, help="the drain's backlog")
    p.add_argument("--rolling-records", type=int, default=300_000, help="the backlog drained during a rolling restart")
    p.add_argument("--keys", type=int, default=1000, help="the paced writer's keys, and the rolling drain's")
    p.add_argument("--drain-keys", default="1000,100000",
                   help="the drain's backlogs: over few keys (a key's records go one after another, so latency "
                        "bounds the rate) and over many")
    p.add_argument("--rate", type=int, default=500, help="the paced writer's records per second")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--after", type=float, default=5.0, help="seconds of writing after the cluster healed")
    p.add_argument("--down", type=float, default=10.0, help="seconds two nodes stay down")
    p.add_argument("--delivery", default="at-least-once")
    p.add_argument("--producer", action="append", default=[], metavar="KEY=V1,V2",
                   help="kill runs also with producerKafkaConfig KEY=V1, then KEY=V2 (e.g. delivery.timeout.ms=20000)")
    p.add_argument("--quick", action="store_true", help="toy sizes, one round: correctness only")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.records, args.rolling_records, args.warmup, args.after, args.down = 1, 2000, 5000, 1, 1, 2
    cluster = KafkaCluster(args.bootstrap or os.environ.get(CLUSTER_ENV) or DEFAULT_CLUSTER)
    scenarios = args.scenarios.split(",")
    runs: list[Run] = []
    try:
        scenarios_run(args, cluster, scenarios, runs)
    finally:
        for box in list(_OPEN):
            box.stop()
    print_report(runs)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 0


def scenarios_run(args: argparse.Namespace, cluster: KafkaCluster, scenarios: list[str], runs: list[Run]) -> None:
    variants: list[dict[str, Any] | None] = [None]
    for option in args.producer:  # KEY=V1,V2: a variant per value, beside the defaults
        key, values = option.split("=", 1)
        variants += [{key: int(v) if v.isdigit() else v} for v in values.split(",")]
    with tempfile.TemporaryDirectory(prefix="cbench-") as tmp:
        workdir = Path(tmp)
        for rnd in range(1, args.rounds + 1):
            cluster.heal()
            if "drain" in scenarios:
                for keys in map(int, args.drain_keys.split(",")):
                    for replication in (3, 1) if rnd % 2 else (1, 3):
                        runs.append(run_drain(args, cluster, workdir, rnd, replication, keys=keys))
                        print(runs[-1], file=sys.stderr, flush=True)
            if "rolling" in scenarios:
                runs.append(run_fault(args, cluster, workdir, rnd, "rolling", lambda box: rolling_restart(box.cluster)))
                print(runs[-1], file=sys.stderr, flush=True)
                saved, args.records = args.records, args.rolling_records
                runs.append(run_drain(args, cluster, workdir, rnd, 3, lambda: rolling_restart(cluster)))
                args.records = saved
                print(runs[-1], file=sys.stderr, flush=True)
            if "kill" in scenarios:
                # Each --producer variant in turn (in reverse order every other round).
                for producer in variants if rnd % 2 else variants[::-1]:
                    runs.append(run_fault(args, cluster, workdir, rnd, "kill-leader", kill_leader, producer))
                    print(runs[-1], file=sys.stderr, flush=True)
                    runs.append(run_fault(args, cluster, workdir, rnd, "kill-coordinator", kill_coordinator, producer))
                    print(runs[-1], file=sys.stderr, flush=True)
            if "below-min-isr" in scenarios:
                runs.append(run_fault(args, cluster, workdir, rnd, "below-min-isr", below_min_isr))
                print(runs[-1], file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
