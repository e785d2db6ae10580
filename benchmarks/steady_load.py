"""The processes of a steady-load run: a paced writer and a harvester, each a child of its own.

    python -m benchmarks.steady_load writer SPEC       # offers SPEC's rate until its time is up
    python -m benchmarks.steady_load harvester SPEC    # harvests SPEC's table until told to stop

``SPEC`` is a JSON :class:`Spec`. Both print one line once ready (``ready``, ``leading``),
then wait for a line on stdin (``go``, ``stop``); at the end each prints a JSON summary line.
The third process, the consumer that times and verifies what reached Kafka, is
:mod:`benchmarks.steady_watch`. Kept in separate processes so that each one's CPU, memory and
GIL are its own: a writer thread inside the harvester would take the harvester's GIL, and
time measured there would be the writer's as much as the relay's.

The workload: record ``seq`` (0, 1, 2, ...) has key ``k<seq % keys>`` (so each key gets
``recordsPerKey`` records, spread over the run) and a ``payload``-byte value that starts with
its sequence number and its writer batch (``<seq:12>|<batch:10>|``). Keys alternate between two
topics: one keeps the producer's timestamp (CreateTime), the other is configured
``message.timestamp.type=LogAppendTime``, so one run gives both. The writer commits a batch
every ``tick`` (10 ms) with ``stash_many``, the records due by the end of that tick (more when
it fell behind, so the offered rate holds), and appends ``batch first count started returned``
to its commits file: ``returned`` (wall clock, after the commit returned) is what every latency
is measured from, ``started`` is before the batch's insert.

With ``writers`` > 1 (the four writer processes of ``harvest_bench``'s steady scenario), writer
``w`` offers ``rate / writers``: its records are ``seq = w + writers * i`` (``first`` in its
commits file, ``<commits>.<w>``, counts ``i``), its batches ``w + writers * b``, and since
``keys`` is a multiple of ``writers`` each key has one writer, so per-key order is defined.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Spec", "commits_path", "key_index", "parse_value", "proc_sample", "value_for"]


@dataclass
class Spec:
    database: str
    bootstrap: str
    table: str
    topics: list[str]  # [CreateTime topic, LogAppendTime topic]
    rate: float  # records/s offered
    seconds: float  # how long the writer offers them
    keys: int
    commits: str  # the commits file
    payload: int = 200
    tick: float = 0.01
    delivery: str = "at-least-once"
    limits: dict[str, object] = field(default_factory=dict)
    producer: dict[str, object] = field(default_factory=dict)
    group: str = "steady"
    trace: str | None = None  # the harvester writes its per-mark and per-produce times here
    writers: int = 1
    writer: int = 0  # which one this process is

    @classmethod
    def parse(cls, text: str) -> Spec:
        return cls(**json.loads(text))

    def dumps(self) -> str:
        return json.dumps(asdict(self))


def key_index(seq: int, keys: int) -> int:
    return seq % keys


def commits_path(commits: str, writer: int, writers: int) -> str:
    return commits if writers == 1 else f"{commits}.{writer}"


def value_for(seq: int, batch: int, payload: int) -> bytes:
    return f"{seq:012d}|{batch:010d}|".encode().ljust(payload, b"x")


def parse_value(value: bytes) -> tuple[int, int]:
    """(seq, batch) of a value :func:`value_for` made."""
    return int(value[:12]), int(value[13:23])


def proc_sample(pid: int) -> dict[str, float]:
    """RSS (MiB), threads, open file descriptors and CPU seconds of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    threads = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:"))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return {"rss_mib": rss / 1024, "threads": threads, "fds": fds, "cpu_s": cpu}


def _wait_for_line(expected: str) -> None:
    for line in sys.stdin:
        if line.strip() == expected:
            return
    raise SystemExit(f"stdin closed before {expected!r}")


# ----------------------------------------------------------------------------- the writer


def writer(spec: Spec) -> None:
    """Offer ``spec.rate / spec.writers`` records/s for ``spec.seconds``: one transaction per tick."""
    import sqlalchemy as sa

    from pyharvest import OutboxRecord, stasher

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    engine = sa.create_engine(spec.database)
    st = stasher.Stasher(spec.table)
    keys, topics, payload, tick = spec.keys, spec.topics, spec.payload, spec.tick
    w, ws = spec.writer, spec.writers
    rate = spec.rate / ws
    key_names = {}
    done = batch = 0  # this writer's records and batches
    late_max = 0.0
    commit_seconds = 0.0
    with engine.connect() as conn, open(commits_path(spec.commits, w, ws), "w") as out:
        with conn.begin():  # connected, the stasher's table looked up: no start-up in the run
            st.prepare(conn)
        print("ready", flush=True)
        _wait_for_line("go")
        cpu0 = time.process_time()
        t0 = time.monotonic()
        out.write(f"start {time.time()!r}\n")
        k = 0
        while not stopping.is_set():
            elapsed = time.monotonic() - t0
            if elapsed >= spec.seconds:
                break
            k = max(k, int(elapsed / tick))
            n = int(rate * min(tick * (k + 1), spec.seconds)) - done
            if n > 0:
                records = []
                b = w + ws * batch
                for i in range(done, done + n):
                    seq = w + ws * i
                    ki = seq % keys
                    name = key_names.get(ki)
                    if name is None:
                        name = key_names[ki] = f"k{ki}"
                    records.append(OutboxRecord(topics[ki & 1], name, value_for(seq, b, payload)))
                started = time.time()
                c0 = time.perf_counter()
                with conn.begin():
                    st.prepare(conn).stash_many(records)
                returned = time.time()
                commit_seconds += time.perf_counter() - c0
                out.write(f"{b} {done} {n} {started!r} {returned!r}\n")
                out.flush()
                done += n
                batch += 1
                late_max = max(late_max, time.monotonic() - (t0 + tick * (k + 1)))
            k += 1
            pause = t0 + tick * k - time.monotonic()
            if pause > 0:
                stopping.wait(pause)
        offered_seconds = time.monotonic() - t0
        out.write(f"end {done}\n")
    engine.dispose()
    print(json.dumps({"records": done, "batches": batch, "offered_seconds": offered_seconds,
                      "cpu_s": time.process_time() - cpu0, "commit_s": commit_seconds,
                      "late_max_ms": late_max * 1000}), flush=True)


# ----------------------------------------------------------------------------- the harvester


def harvester(spec: Spec) -> None:
    """Harvest ``spec.table`` until ``stop`` on stdin; print the engine's figures."""
    from pyharvest import Config, Harvest, Limits

    limits = Limits.from_mapping({"heartbeatTimeout": "2s", **spec.limits}, "limits")
    cfg = Config(
        base_kafka_config={"bootstrap.servers": spec.bootstrap},
        producer_kafka_config={"acks": "all", **spec.producer},
        leader_group_id=spec.group,
        data_source=spec.database,
        outbox_table=spec.table,
        limits=limits,
        delivery=spec.delivery,
    )
    tracer = None
    kafka = None
    if spec.trace:
        from benchmarks.steady_trace import Tracer

        tracer = Tracer(spec.trace, spec.topics)
        kafka = tracer.clients()
    h = Harvest(cfg, kafka=kafka)
    h.start()
    while not h.is_leader:
        if h.state.value == "stopped":
            raise SystemExit("the harvester stopped before it was elected")
        time.sleep(0.01)
    if tracer is not None:
        tracer.watch(h)
    print("leading", flush=True)
    cpu0 = time.process_time()
    _wait_for_line("stop")
    cpu = time.process_time() - cpu0
    m = h.metrics
    h.stop()
    h.join(60)
    if tracer is not None:
        tracer.close()
    marks, purges = max(1, m.marks), max(1, m.purge_statements)
    summary: dict[str, object] = {
        "cpu_s": cpu,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "marks": m.marks,
        "rows_per_mark": round(m.records_marked / marks, 1),
        "mark_ms": round(1000 * sum(m.mark_seconds) / max(1, len(m.mark_seconds)), 2),
        "purges": m.purge_statements,
        "rows_per_purge": round(m.records_purged / purges, 1),
        "purge_ms": round(1000 * sum(m.purge_seconds) / max(1, len(m.purge_seconds)), 2),
        "purged": m.records_purged,
    }
    if m.transactions_committed:
        summary["transactions"] = m.transactions_committed
        summary["aborted"] = m.transactions_aborted
        summary["transaction_ms"] = round(1000 * sum(m.transaction_seconds) / max(1, len(m.transaction_seconds)), 2)
    print(json.dumps(summary), flush=True)


def main(argv: list[str]) -> int:
    role, spec = argv[0], Spec.parse(argv[1])
    {"writer": writer, "harvester": harvester}[role](spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
