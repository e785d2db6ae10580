"""Does the broker serve every message it acknowledged? Idempotent producers through broker stalls.

    python -m benchmarks.broker_acks                          # the embedded broker, paused 6 times
    python -m benchmarks.broker_acks --rounds 3 --pauses 0    # the same, never paused
    python -m benchmarks.broker_acks --bootstrap HOST:9092 --pause-pid PID   # any broker you can pause

The harvester purges an outbox row once the broker acknowledges its message, so a broker's
acknowledgement is the whole of the outbox's guarantee. No pyharvest code runs here: producer
processes (idempotent, as the harvester's) send unique values over keys to a topic of 8
partitions, replacing their producer a few times, while the broker's process is stopped
(SIGSTOP) for a few seconds, several times. A produce request stopped for longer than
``socket.timeout.ms`` times out, and librdkafka sends it again. Then the topic is read from
the beginning, and every acknowledged message that cannot be read is reported, with what a
write to each partition and a new reader bring back.

On the embedded broker (Tansu 0.6, in memory) the pauses make it acknowledge messages at
offsets it also gives to other messages, and a read to the end then misses thousands of
acknowledged messages at a partition's tail, until the partition is written again. The
benchmarks read their topics back with :mod:`benchmarks.topic_check` for this reason.
Exits 1 if an acknowledged message could not be read even then.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.topic_check import NUDGE_KEY, nudge

PARTITIONS = 8


def produce(bootstrap: str, topic: str, worker: int, count: int, replacements: int, config: dict[str, Any],
            out: str) -> None:
    """One producer process: ``count`` messages, its producer replaced ``replacements`` times;
    writes the (partition, offset, value) of every acknowledged message to ``out``."""
    from confluent_kafka import Producer

    acked: list[tuple[int, int, str]] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            offset = msg.offset()
            acked.append((msg.partition(), -1 if offset is None or offset < 0 else offset, msg.value().decode()))

    rnd = random.Random(worker)  # noqa: S311 - keys, not secrets
    cuts = sorted(rnd.sample(range(1, count), replacements)) + [count]
    sent = 0
    for cut in cuts:
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 1, **config})
        while sent < cut:
            try:
                producer.produce(topic, f"{worker}-{sent}".encode(), f"k{rnd.randrange(2000)}", on_delivery=delivered)
                sent += 1
            except BufferError:
                producer.poll(0.01)
            producer.poll(0)
        if producer.flush(300):
            raise RuntimeError("messages still unacknowledged after 300 s")
    Path(out).write_text(json.dumps(acked))


def broker_process(guard_pid: int) -> int:
    """The embedded broker's own process: the child of its guard (Linux ``/proc``)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == guard_pid:
                return int(entry.name)
    raise RuntimeError(f"no child of the embedded broker's guard (pid {guard_pid})")


def pause(pid: int, times: int, seconds: float, stop: threading.Event) -> None:
    stop.wait(1.0)
    for _ in range(times):
        if stop.is_set():
            return
        os.kill(pid, signal.SIGSTOP)
        try:
            stop.wait(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        stop.wait(0.7)


def read(bootstrap: str, topic: str, want: set[str], timeout: float, group: str) -> dict[str, tuple[int, int]]:
    """(partition, offset) of every message read from the beginning, until ``want`` is read or
    ``timeout``; counting what was read, never trusting the high watermark."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    seen: dict[str, tuple[int, int]] = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not want <= seen.keys():
            for m in consumer.consume(1000, 0.5):
                if m.error() is None and m.key() != NUDGE_KEY.encode():
                    seen[m.value().decode()] = (m.partition(), m.offset())
    finally:
        consumer.close()
    return seen


def run_round(args: argparse.Namespace, bootstrap: str, pause_pid: int | None, workdir: Path) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"acks-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result(15)
    config = {"socket.timeout.ms": args.socket_timeout_ms, "delivery.timeout.ms": 300_000}
    ctx = mp.get_context("spawn")
    outs = [workdir / f"{topic}-{w}.json" for w in range(args.producers)]
    procs = [ctx.Process(target=produce, args=(bootstrap, topic, w, args.messages, args.replacements, config, str(o)))
             for w, o in enumerate(outs)]
    started = time.monotonic()
    for p in procs:
        p.start()
    stop = threading.Event()
    pauser = None
    if pause_pid is not None and args.pauses:
        pauser = threading.Thread(target=pause, args=(pause_pid, args.pauses, args.pause_seconds, stop), daemon=True)
        pauser.start()
    for p in procs:
        p.join()
    stop.set()
    if pauser is not None:
        pauser.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError("a producer process failed")
    seconds = time.monotonic() - started
    acked = [tuple(a) for o in outs for a in json.loads(o.read_text())]
    want = {v for _, _, v in acked}
    seen = read(bootstrap, topic, want, args.read_timeout, f"acks-{uuid.uuid4().hex[:6]}")
    missing = want - seen.keys()
    at = Counter((p, o) for p, o, _ in acked if o >= 0)
    result: dict[str, Any] = {
        "acknowledged": len(acked), "seconds": round(seconds, 1),
        "acked_without_offset": sum(1 for _, o, _ in acked if o < 0),
        "acked_at_a_shared_offset": sum(n for n in at.values() if n > 1),
        "missing": len(missing), "missing_by_partition": {}, "after_a_write": None, "new_reader": None,
    }
    if missing:
        for p in range(PARTITIONS):
            offsets = [o for pp, o, v in acked if pp == p and v in missing]
            if offsets:
                top = max(o for pp, o, _ in acked if pp == p)
                result["missing_by_partition"][p] = f"{len(offsets)} at acknowledged offsets " \
                                                    f"{min(offsets)}..{max(offsets)} (highest acknowledged {top})"
        nudge(bootstrap, topic)
        again = read(bootstrap, topic, want, args.read_timeout, f"acks-{uuid.uuid4().hex[:6]}")
        result["after_a_write"] = len(missing - again.keys())
        result["new_reader"] = len(missing & again.keys())
    admin.delete_topics([topic])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="", help="a broker to use instead of the embedded one")
    p.add_argument("--pause-pid", type=int, help="the process to SIGSTOP (the embedded broker's by default)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--producers", type=int, default=3, help="producer processes")
    p.add_argument("--messages", type=int, default=300_000, help="per producer process")
    p.add_argument("--replacements", type=int, default=3, help="times each process replaces its producer")
    p.add_argument("--pauses", type=int, default=6)
    p.add_argument("--pause-seconds", type=float, default=2.5)
    p.add_argument("--socket-timeout-ms", type=int, default=1000,
                   help="shorter than a pause, so that stopped requests time out and are sent again")
    p.add_argument("--read-timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    from pyharvest.bindings.kafka.embedded import EmbeddedBroker

    failed = False
    with tempfile.TemporaryDirectory(prefix="broker-acks-") as tmp, \
            (EmbeddedBroker() if not args.bootstrap else contextlib.nullcontext()) as broker:
        bootstrap = args.bootstrap or broker.bootstrap_servers  # type: ignore[union-attr]
        pause_pid = args.pause_pid or (broker_process(broker.pid) if broker is not None and broker.pid else None)
        if args.pauses and pause_pid is None:
            print("no process to pause: give --pause-pid, or --pauses 0", file=sys.stderr)
        print(f"{args.producers} producers x {args.messages:,} messages, {args.pauses} pauses of "
              f"{args.pause_seconds:g} s, socket.timeout.ms {args.socket_timeout_ms}; broker {bootstrap}")
        for n in range(1, args.rounds + 1):
            r = run_round(args, bootstrap, pause_pid, Path(tmp))
            print(f"round {n}: {r['acknowledged']:,} acknowledged in {r['seconds']} s "
                  f"({r['acked_without_offset']:,} without an offset, {r['acked_at_a_shared_offset']:,} at an offset "
                  f"also given to another message); not read back: {r['missing']:,}", flush=True)
            for part, what in r["missing_by_partition"].items():
                print(f"  partition {part}: {what}")
            if r["missing"]:
                print(f"  after a write to every partition: {r['new_reader']:,} read, {r['after_a_write']:,} "
                      "still missing")
                failed = failed or bool(r["after_a_write"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
