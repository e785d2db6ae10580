"""Harvester throughput benchmark: backlog drain, steady state, key skew, large values.

    python -m benchmarks.harvest_bench                       # PostgreSQL + embedded broker, every scenario
    python -m benchmarks.harvest_bench --database sqlite:///tmp/b.db --scenarios drain
    python -m benchmarks.harvest_bench --quick               # the small version CI runs for correctness
    python -m benchmarks.harvest_bench --bootstrap 127.0.0.1:19092 --scenarios drain,steady \
        --delivery at-least-once,exactly-once                # both modes side by side (Apache Kafka)

Each scenario runs in a fresh child process, so that its peak RSS and CPU time are its own.
Every scenario verifies its output (every record at least once, per-key order) so a fast
wrong run cannot pass; the table is printed and the figures written as JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path


DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@dataclass
class Result:
    scenario: str
    database: str
    delivery: str
    records: int
    keys: int
    value_bytes: int
    seconds: float = 0.0
    records_per_second: float = 0.0
    bare_produce_per_second: float = 0.0
    statements_per_1000: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_mib: float = 0.0
    latency_ms_p50: float | None = None
    latency_ms_p99: float | None = None
    latency_ms_max: float | None = None
    offered_per_second: float | None = None
    lost: int = 0
    reordered: int = 0
    duplicates: int = 0
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.reordered == 0


# ----------------------------------------------------------------------------- workload


def key_for(i: int, keys: int, skew: bool, rnd: random.Random) -> str:
    if skew and rnd.random() < 0.9:
        return f"hot-{rnd.randrange(10)}"
    return f"key-{i % keys}" if not skew else f"key-{rnd.randrange(keys)}"


def workload(n: int, keys: int, value_bytes: int, skew: bool) -> Iterator[tuple[str, bytes]]:
    """The records of a scenario, always the same for the same arguments."""
    rnd = random.Random(42)
    pad = b"x" * max(0, value_bytes - 12)
    for i in range(n):
        yield key_for(i, keys, skew, rnd), f"{i:011d}|".encode() + pad


def prefill(url: str, table: str, topic: str, n: int, keys: int, value_bytes: int, skew: bool) -> None:
    """Stash the workload with one writer (so every key's records are causally ordered)."""
    import sqlalchemy as sa

    from pyharvest import OutboxRecord, stasher

    engine = sa.create_engine(url)
    records = workload(n, keys, value_bytes, skew)
    with engine.connect() as conn:
        done = 0
        while done < n:
            chunk = [OutboxRecord(topic, k, v, headers=[("bench", "1")]) for k, v in itertools.islice(records, 1000)]
            with conn.begin():
                stasher.Stasher(table).prepare(conn).stash_many(chunk)
            done += len(chunk)
    engine.dispose()


def prefill_in_child(args: argparse.Namespace, table: str, topic: str, result: Result) -> None:
    """Prefill from another process, so this one's memory holds only the harvester."""
    # Imported here: idle_bench imports this module from a script with only benchmarks/ on its path.
    from benchmarks.children import python_module
    cmd = [*python_module("benchmarks.harvest_bench"), "--prefill", table, topic, "--database", args.database,
           "--scenario", args.scenario] + (["--quick"] if args.quick else [])
    subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parent.parent,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)})


class RssSampler:
    """Peak resident memory of this process while sampling (ru_maxrss would count the set-up)."""

    def __init__(self) -> None:
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        self.peak_kib = max(self.peak_kib, int(line.split()[1]))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_kib / 1024


class MachineCpu:
    """CPU seconds of the database server and the broker on this machine (from /proc), so a
    result shows where each record's CPU goes: harvester, database, broker. Zero where the
    server runs elsewhere or /proc is missing. The broker is the process listening on the
    bootstrap port (:mod:`benchmarks.broker_process`), embedded or Apache Kafka alike."""

    DATABASES = ("postgres", "mariadbd", "mysqld")

    def __init__(self, bootstrap: str) -> None:
        from benchmarks.broker_process import broker_pids

        self._broker = broker_pids(bootstrap)
        self._start = self._read()

    def _read(self) -> dict[str, float]:
        from benchmarks.broker_process import cpu_seconds

        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        database = 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            name = text[text.index("(") + 1 : text.rindex(")")]
            if name.startswith(self.DATABASES):
                fields = text[text.rindex(")") + 2 :].split()
                database += (int(fields[11]) + int(fields[12])) / tick
        return {"database": database, "broker": cpu_seconds(self._broker)}

    def since(self) -> dict[str, float]:
        now = self._read()
        return {k: now[k] - self._start[k] for k in now}


class StatementCounter:
    """Counts the statements the harvester's engine sends, while enabled."""

    def __init__(self, engine: object) -> None:
        import sqlalchemy as sa

        self.count = 0
        self.enabled = False
        sa.event.listen(engine, "before_cursor_execute", self._on_execute)

    def _on_execute(self, *args: object) -> None:
        if self.enabled:
            self.count += 1


def bare_produce_rate(bootstrap: str, topic: str, messages: list[tuple[str, bytes]],
                      notes: dict[str, object] | None = None) -> float:
    """The physical ceiling: the same messages through one confluent-kafka producer, acked.
    Its CPU per record (producer and broker) goes into ``notes`` for comparison."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    acked = [0]

    def cb(err: object, _msg: object) -> None:
        if err is None:
            acked[0] += 1

    servers = MachineCpu(bootstrap)
    cpu0 = time.process_time()
    started = time.monotonic()
    for key, value in messages:
        while True:
            try:
                p.produce(topic, value, key, headers=[("bench", "1")], on_delivery=cb)
                break
            except BufferError:
                p.poll(0.005)
        p.poll(0)
    p.flush(60)
    elapsed = time.monotonic() - started
    if notes is not None and messages:
        cpu = {"producer": time.process_time() - cpu0, "broker": servers.since()["broker"]}
        notes["bare_cpu_us_per_record"] = {k: round(v * 1e6 / len(messages), 1) for k, v in cpu.items()}
    return acked[0] / elapsed


def settings(args: argparse.Namespace) -> tuple[object, dict[str, object]]:
    """``--limits`` (goharvest's names: ``{"markQueryRecords": 100}``) and ``--producer-config``,
    parsed and validated; a ``ConfigError`` or ``ValueError`` names what is wrong."""
    from pyharvest import Limits

    limits, producer = json.loads(args.limits), json.loads(args.producer_config)
    if not isinstance(producer, dict):
        raise ValueError(f"--producer-config: expected a JSON object, got {args.producer_config!r}")
    return Limits.from_mapping({"heartbeatTimeout": "2s", **limits}, "--limits"), producer


def harvester(args: argparse.Namespace, table: str, bootstrap: str, kafka: object = None):  # noqa: ANN201
    """The harvester under test, with the run's limits and producer properties."""
    from pyharvest import Config, Harvest

    lim, producer = settings(args)
    cfg = Config(
        base_kafka_config={"bootstrap.servers": bootstrap},
        producer_kafka_config=producer,
        leader_group_id=f"bench-{uuid.uuid4().hex[:8]}",
        data_source=args.database,
        outbox_table=table,
        limits=lim,  # type: ignore[arg-type]
        delivery=getattr(args, "delivery", "at-least-once"),  # idle_bench's arguments have none
    )
    return Harvest(cfg, kafka=kafka)  # type: ignore[arg-type]


def engine_notes(h: object, result: Result) -> None:
    """How the engine spent the run: marks and purges, their sizes and mean durations."""
    m = h.metrics  # type: ignore[attr-defined]
    marks, purges = max(1, m.marks), max(1, m.purge_statements)
    result.notes["marks"] = m.marks
    result.notes["rows_per_mark"] = round(m.records_marked / marks)
    result.notes["mark_ms"] = round(1000 * sum(m.mark_seconds) / max(1, len(m.mark_seconds)), 1)
    result.notes["rows_per_purge"] = round(m.records_purged / purges)
    result.notes["purge_ms"] = round(1000 * sum(m.purge_seconds) / max(1, len(m.purge_seconds)), 1)
    if m.transactions_committed:
        result.notes["transactions"] = m.transactions_committed
        result.notes["aborted"] = m.transactions_aborted
        result.notes["rows_per_transaction"] = round(m.records_purged / m.transactions_committed)
        result.notes["transaction_ms"] = round(1000 * sum(m.transaction_seconds) / max(1, len(m.transaction_seconds)), 1)


def verify(args: argparse.Namespace, topic: str, expected: list[tuple[str, bytes]], result: Result) -> None:
    from benchmarks.topic_check import read_back

    # Only the embedded broker hides acknowledged records; on any other a missing one is lost.
    report, hidden = read_back(args.bootstrap, topic, expected, timeout=max(60, len(expected) / 5000),
                               nudge_missing=args.embedded_broker)
    if hidden:
        result.notes["hidden_by_broker"] = hidden
    result.lost, result.reordered, result.duplicates = report.lost_count, report.reorder_count, report.duplicate_count
    result.notes["received"] = report.received_count


def run_drain(args: argparse.Namespace, bootstrap: str, result: Result) -> None:
    from tests_support import create_topic  # type: ignore[import-not-found]

    from pyharvest.bindings.sql import create_outbox_table

    table, topic = f"bench_{uuid.uuid4().hex[:8]}", f"bench-{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table)
    create_topic(bootstrap, topic, 10)
    prefill_in_child(args, table, topic, result)
    rss = RssSampler()
    h = harvester(args, table, bootstrap)
    h.start()
    try:
        while not h.is_leader:
            time.sleep(0.01)
        counter = StatementCounter(h.binding.engine)  # type: ignore[union-attr]
        counter.enabled = True
        cpu0 = time.process_time()
        # From the first purge, not from election: leader election is not throughput.
        while h.metrics.records_purged == 0:
            time.sleep(0.0005)
        servers = MachineCpu(bootstrap)
        cpu1 = time.process_time()
        started = time.monotonic()
        while h.metrics.records_purged < result.records:
            time.sleep(0.002)
        result.seconds = time.monotonic() - started
        result.cpu_seconds = time.process_time() - cpu0
        # CPU per record, by process, over the timed part: what the drain costs the machine.
        per_record = {"harvester": time.process_time() - cpu1, **servers.since()}
        result.notes["cpu_us_per_record"] = {k: round(v * 1e6 / result.records, 1) for k, v in per_record.items()}
        counter.enabled = False
    finally:
        h.stop()
        h.join(60)
    engine_notes(h, result)
    result.peak_rss_mib = rss.stop()
    result.records_per_second = result.records / result.seconds
    result.statements_per_1000 = counter.count * 1000 / result.records
    expected = list(workload(result.records, result.keys, result.value_bytes, args.skew))
    verify(args, topic, expected, result)
    ceiling_topic = f"bench-bare-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, ceiling_topic, 10)
    result.bare_produce_per_second = bare_produce_rate(bootstrap, ceiling_topic, expected, result.notes)
    drop(args.database, table)


def _steady_writer(database: str, table: str, topic: str, writer: int, writers: int, rate: float,
                   duration: float, keys: int, out: str, start: object) -> None:
    """One writer process: stash at ``rate / writers`` records/s for ``duration`` seconds,
    committing every 50 records; write the (key, value) pairs it committed to ``out``.
    Connected first, then all writers start together at ``start`` (a barrier), so that
    process start-up is not counted as offered time."""
    import sqlalchemy as sa

    from pyharvest import OutboxRecord, stasher

    engine = sa.create_engine(database)
    per_writer, batch, n = rate / writers, 50, 0
    st = stasher.Stasher(table)
    with open(out, "w") as f, engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
        conn.rollback()
        start.wait()  # type: ignore[attr-defined]
        started = last_commit = time.monotonic()
        deadline = started + duration
        while time.monotonic() < deadline:
            rows = []
            for _ in range(batch):
                rows.append((f"key-{writer}-{n % (keys // writers)}", f"{writer}:{n}".encode()))
                n += 1
            with conn.begin():
                ts = repr(time.time())  # stamped just before commit
                st.prepare(conn).stash_many(OutboxRecord(topic, k, v, headers=[("ts", ts)]) for k, v in rows)
            f.writelines(f"{k}\t{v.decode()}\n" for k, v in rows)
            last_commit = time.monotonic()
            ahead = n / per_writer - (last_commit - started)
            if ahead > 0:
                time.sleep(ahead)
    # CLOCK_MONOTONIC is system-wide on Linux: the parent compares it with its own start.
    Path(out + ".end").write_text(repr(last_commit))
    engine.dispose()


class PurgeWatch:
    """The monotonic time of the harvester's last purge, to 5 ms: what the achieved rate is
    measured to, however late the caller looks."""

    def __init__(self, h: object) -> None:
        self._h = h
        self._last = (h.metrics.records_purged, time.monotonic())  # type: ignore[attr-defined]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            purged = self._h.metrics.records_purged  # type: ignore[attr-defined]
            if purged != self._last[0]:
                self._last = (purged, time.monotonic())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self._last[1]


class AckClock:
    """Kafka clients whose producer notes commit -> ack latency: for each record stamped with a
    ``ts`` header (the writer's time just before commit), the time its delivery report came
    back. Measured inside the harvester, on the acknowledgement itself. ``to_send`` holds the
    first part of each latency, commit -> produce call (the outbox side: writer's commit,
    mark, waiting behind its key); the rest is produce -> delivery report (client and broker)."""

    def __init__(self) -> None:
        from pyharvest.bindings.kafka.transactions import ConfluentTransactionalClients

        self.latencies: list[float] = []
        self.to_send: list[float] = []
        self._clients = ConfluentTransactionalClients()

    def __getattr__(self, name: str) -> object:
        return getattr(self._clients, name)

    def producer(self, config: dict[str, object]) -> object:
        from pyharvest.bindings.kafka.confluent import ConfluentProducer

        sink, to_send = self.latencies, self.to_send

        class TimedProducer(ConfluentProducer):
            def produce(self, topic, key, value, headers, on_delivery, partition=None):  # type: ignore[no-untyped-def]
                for name, stamp in headers:
                    if name == "ts":
                        committed, inner = float(stamp), on_delivery
                        to_send.append(time.time() - committed)

                        def on_delivery(err, committed=committed, inner=inner):  # type: ignore[no-untyped-def]
                            if err is None:
                                sink.append(time.time() - committed)
                            inner(err)

                        break
                super().produce(topic, key, value, headers, on_delivery, partition)

        return TimedProducer(config)


class VisibleClock:
    """A ``read_committed`` consumer of the steady scenario's topic: for each record, the time
    from the writer's commit (its ``ts`` header) to the moment a consumer could read it. At
    least once that is about the acknowledgement; exactly once, the transaction's commit."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"visible-{uuid.uuid4().hex[:8]}",
                                   "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                   "isolation.level": "read_committed", "fetch.wait.max.ms": 5})
        self._consumer.subscribe([topic])
        self.first_seen: dict[bytes, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from benchmarks.steady_watch import arrived

        while not self._stop.is_set():
            for m in arrived(self._consumer, 1000, 0.05):
                if m.error() is None and m.value() not in self.first_seen:
                    for name, stamp in m.headers() or []:
                        if name == "ts":
                            self.first_seen[m.value()] = time.time() - float(stamp)
                            break

    def stop(self, expect: int, timeout: float = 30.0) -> list[float]:
        deadline = time.monotonic() + timeout
        while len(self.first_seen) < expect and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join()
        self._consumer.close()
        return sorted(self.first_seen.values())


def run_steady(args: argparse.Namespace, bootstrap: str, result: Result) -> None:
    """Writer processes stash at an offered rate while the harvester runs; the harvester's
    producer notes commit -> ack latency (:class:`AckClock`). Only the harvester runs in this
    process, so its CPU time and memory are its own, as they would be beside a service."""
    import multiprocessing as mp

    from tests_support import create_topic  # type: ignore[import-not-found]

    from pyharvest.bindings.sql import create_outbox_table

    table, topic = f"bench_{uuid.uuid4().hex[:8]}", f"bench-{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table)
    create_topic(bootstrap, topic, 10)
    writers = 4
    work = Path(tempfile.mkdtemp(prefix="pyharvest-bench-"))
    ctx = mp.get_context("spawn")
    rss = RssSampler()
    clock = AckClock()
    h = harvester(args, table, bootstrap, kafka=clock)
    h.start()
    visible = VisibleClock(bootstrap, topic)
    while not h.is_leader:
        time.sleep(0.01)
    counter = StatementCounter(h.binding.engine)  # type: ignore[union-attr]
    counter.enabled = True
    start = ctx.Barrier(writers + 1)
    procs = [ctx.Process(target=_steady_writer, args=(args.database, table, topic, w, writers, args.rate,
                                                      args.duration, result.keys, str(work / f"w{w}.tsv"), start))
             for w in range(writers)]
    for p in procs:
        p.start()
    start.wait(120)  # every writer connected: the offered load starts now
    cpu0 = time.process_time()
    started = time.monotonic()
    purges = PurgeWatch(h)
    for p in procs:
        p.join()
    # Offered time ends at the writers' last commit, not when their processes have exited.
    offered_seconds = max(float((work / f"w{w}.tsv.end").read_text()) for w in range(writers)) - started
    expected: list[tuple[str, bytes]] = []
    for w in range(writers):
        for line in (work / f"w{w}.tsv").read_text().splitlines():
            k, v = line.split("\t")
            expected.append((k, v.encode()))
    while h.metrics.records_purged < len(expected) and time.monotonic() - started < args.duration + 120:
        time.sleep(0.005)
    drained_seconds = purges.stop() - started  # first commit -> last purge
    seen = visible.stop(len(expected))
    if seen:
        result.notes["visible_ms_p50_p99_max"] = [round(seen[len(seen) // 2] * 1000),
                                                  round(seen[min(len(seen) - 1, int(len(seen) * 0.99))] * 1000),
                                                  round(seen[-1] * 1000)]
    counter.enabled = False
    result.cpu_seconds = time.process_time() - cpu0
    h.stop()
    h.join(60)
    engine_notes(h, result)
    result.peak_rss_mib = rss.stop()
    result.records = len(expected)
    result.seconds = offered_seconds
    result.offered_per_second = len(expected) / offered_seconds
    # Achieved: what was harvested over the time it took, from the first commit to the last
    # purge. A harvester that keeps up finishes just after the writers do.
    result.records_per_second = h.metrics.records_purged / drained_seconds
    result.statements_per_1000 = counter.count * 1000 / max(1, len(expected))
    lat = sorted(clock.latencies)
    if lat:
        result.latency_ms_p50 = lat[len(lat) // 2] * 1000
        result.latency_ms_p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        result.latency_ms_max = lat[-1] * 1000
        to_send = sorted(clock.to_send)
        result.notes["commit_to_send_ms_p50_p99"] = [round(to_send[len(to_send) // 2] * 1000),
                                                     round(to_send[int(len(to_send) * 0.99)] * 1000)]
    verify(args, topic, expected, result)
    shutil.rmtree(work, ignore_errors=True)
    drop(args.database, table)


def run_stasher(args: argparse.Namespace, bootstrap: str, result: Result) -> None:
    """One writer committing every 100 records: the batch path (``stash_many``) is the figure;
    the one-statement-per-record path (``prepare(tx).stash``) and plain executemany
    (``bulk=False``) are reported in the notes."""
    import sqlalchemy as sa

    from pyharvest import OutboxRecord, stasher
    from pyharvest.bindings.sql import create_outbox_table

    table = f"bench_{uuid.uuid4().hex[:8]}"
    create_outbox_table(args.database, table)
    engine = sa.create_engine(args.database)
    value = b"x" * result.value_bytes
    st = stasher.Stasher(table)

    def records(b: int) -> list[OutboxRecord]:
        return [OutboxRecord("t", f"key-{(b * 100 + i) % result.keys}", value, [("h", "v")]) for i in range(100)]

    batches = result.records // 100
    with engine.connect() as conn:
        started = time.monotonic()
        for b in range(batches // 4):
            with conn.begin():
                prepared = st.prepare(conn)
                for rec in records(b):
                    prepared.stash(rec)
        one_by_one = (batches // 4) * 100 / (time.monotonic() - started)
        started = time.monotonic()
        inserts = stasher.Stasher(table, bulk=False)
        for b in range(batches // 4):
            with conn.begin():
                inserts.prepare(conn).stash_many(records(b))
        executemany = (batches // 4) * 100 / (time.monotonic() - started)
        started = time.monotonic()
        cpu0 = time.process_time()
        for b in range(batches):
            with conn.begin():
                st.prepare(conn).stash_many(records(b))
        result.seconds = time.monotonic() - started
        result.cpu_seconds = time.process_time() - cpu0
    result.records_per_second = result.records / result.seconds
    result.notes["one_statement_per_record_per_second"] = round(one_by_one)
    # stash_many uses the dialect's bulk writer where it has one (PostgreSQL: COPY); this is
    # the same batches as one executemany each (Stasher(bulk=False)).
    result.notes["executemany_per_second"] = round(executemany)
    result.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    engine.dispose()
    drop(args.database, table)


def drop(url: str, table: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(sa.text(f"DROP TABLE {table}"))
    engine.dispose()


SCENARIOS = {
    # name: (runner, records, keys, value bytes, skew)
    "drain": ("drain", 200_000, 1_000, 100, False),
    "drain-1m": ("drain", 1_000_000, 1_000, 100, False),
    "drain-100k": ("drain", 100_000, 1_000, 100, False),
    "skew": ("drain", 50_000, 1_000, 100, True),
    "large": ("drain", 20_000, 1_000, 10_240, False),
    "steady": ("steady", 0, 1_000, 100, False),
    "stasher": ("stasher", 100_000, 1_000, 100, False),
}
QUICK = {"drain": 3_000, "drain-1m": 4_000, "drain-100k": 2_000, "skew": 2_000, "large": 500, "stasher": 2_000}


def child(args: argparse.Namespace) -> int:
    runner, records, keys, value_bytes, skew = SCENARIOS[args.scenario]
    if args.quick:
        records = QUICK.get(args.scenario, records)
    args.skew = skew
    if args.quick:
        args.duration, args.rate = min(args.duration, 4.0), min(args.rate, 2_000)
    if args.prefill:
        table, topic = args.prefill
        prefill(args.database, table, topic, records, keys, value_bytes, skew)
        return 0
    result = Result(args.scenario, _db_label(args.database), args.delivery, records, keys, value_bytes)
    {"drain": run_drain, "steady": run_steady, "stasher": run_stasher}[runner](args, args.bootstrap, result)
    print(json.dumps(asdict(result)))
    return 0


def _db_label(url: str) -> str:
    return url.split("://")[0].split("+")[0]


def parent(args: argparse.Namespace) -> int:
    from pyharvest.bindings.kafka.embedded import EmbeddedBroker

    try:
        settings(args)  # before starting anything: a typo should not cost a broker start-up
    except ValueError as e:  # json.JSONDecodeError and ConfigError are ValueErrors
        print(f"harvest_bench: {e}", file=sys.stderr)
        return 2
    results: list[Result] = []
    with EmbeddedBroker() if not args.bootstrap else _Null() as broker:
        bootstrap = args.bootstrap or broker.bootstrap_servers
        # Each scenario in every mode before the next scenario: modes compared minutes apart,
        # not the length of a run apart, as this machine's speed drifts.
        for name, delivery in itertools.product(args.scenarios.split(","), args.delivery.split(",")):
            # Imported here: idle_bench imports this module from a script with only benchmarks/ on its path.
            from benchmarks.children import python_module
            cmd = [*python_module("benchmarks.harvest_bench"), "--child", "--scenario", name,
                   "--delivery", delivery,
                   "--database", args.database, "--bootstrap", bootstrap, "--rate", str(args.rate),
                   "--duration", str(args.duration), "--limits", args.limits, "--producer-config", args.producer_config]
            cmd += ["--quick"] if args.quick else []
            cmd += ["--embedded-broker"] if not args.bootstrap else []
            print(f"running {name} ({delivery}) ...", file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent,
                                  env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)})
            if proc.returncode != 0:
                print(proc.stderr[-4000:], file=sys.stderr)
                return 1
            results.append(Result(**json.loads(proc.stdout.strip().splitlines()[-1])))
    print_table(results)
    out = Path(args.json or "benchmarks/results/harvest.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    print(f"\nwrote {out}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        pass


def print_table(results: list[Result]) -> None:
    cols = ["scenario", "db", "delivery", "records", "rec/s", "bare/s", "% bare", "stmt/1k", "cpu s", "rss MiB", "p50 ms", "p99 ms", "max ms", "lost", "reord", "dups"]
    rows = []
    for r in results:
        pct = f"{100 * r.records_per_second / r.bare_produce_per_second:.0f}%" if r.bare_produce_per_second else "-"
        fmt = lambda v: "-" if v is None else f"{v:,.0f}"  # noqa: E731
        rows.append([r.scenario, r.database, r.delivery, f"{r.records:,}", fmt(r.records_per_second), fmt(r.bare_produce_per_second or None),
                     pct, f"{r.statements_per_1000:.1f}", f"{r.cpu_seconds:.1f}", f"{r.peak_rss_mib:.0f}",
                     fmt(r.latency_ms_p50), fmt(r.latency_ms_p99), fmt(r.latency_ms_max), str(r.lost), str(r.reordered), str(r.duplicates)])
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for row in rows:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
    for r in results:
        notes = {k: v for k, v in r.notes.items() if k != "received"}
        if notes:
            print(f"  {r.scenario} ({r.delivery}): " + ", ".join(f"{k}={v}" for k, v in notes.items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", default=os.environ.get("PYHARVEST_BENCH_DATABASE", DEFAULT_DATABASE))
    p.add_argument("--bootstrap", default=os.environ.get("PYHARVEST_BENCH_KAFKA"), help="default: the embedded broker")
    p.add_argument("--scenarios", default="drain,steady,skew,large,stasher")
    p.add_argument("--rate", type=float, default=10_000, help="offered records/s in the steady scenario")
    p.add_argument("--duration", type=float, default=20, help="seconds of the steady scenario")
    p.add_argument("--quick", action="store_true", help="small sizes: correctness, not timing")
    p.add_argument("--limits", default="{}", help='harvester limits as JSON, e.g. \'{"markQueryRecords": 100}\'')
    p.add_argument("--producer-config", default="{}", help='producer properties as JSON, e.g. \'{"linger.ms": 5}\'')
    p.add_argument("--delivery", default="at-least-once",
                   help="at-least-once, exactly-once, or both comma-separated (each scenario in each mode)")
    p.add_argument("--json", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--embedded-broker", action="store_true", help=argparse.SUPPRESS)  # set by the parent that started it
    p.add_argument("--scenario", default=None, help=argparse.SUPPRESS)
    p.add_argument("--prefill", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    return child(args) if args.child or args.prefill else parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
