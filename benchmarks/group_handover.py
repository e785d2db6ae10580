"""How long does the broker take to hand a stopped member's partitions to the others? No pyharvest.

    python -m benchmarks.group_handover                         # the embedded broker, 15 s session
    python -m benchmarks.group_handover --heartbeat-timeout 2   # a 6 s session
    python -m benchmarks.group_handover --bootstrap HOST:9092   # any broker
    python -m benchmarks.group_handover --bootstrap HOST:9092 --group-protocols classic,consumer

A sharded harvester's shard resumes once the group has given the shard's leader-topic
partition to a surviving member, and pyharvest's own part after that is short (``shard_bench``'s
"then": 0.01-0.2 s). This measures the rest, the broker's part, with no harvester: member
processes with the leader group's own consumer settings (:func:`~pyharvest.core.election.group_protocol.shard_client_configs`:
the session of ``heartbeatTimeout``, the heartbeat interval, cooperative-sticky) share a topic
of one partition per shard. Once every partition is owned, one member is stopped (SIGTERM: it
closes its consumer and leaves the group, as a harvester does; SIGKILL: it just dies), and the
time until the others own all its partitions is reported, with whether they kept their own
partitions throughout (incremental rebalancing). Under KIP-848's consumer protocol
(``--group-protocols consumer``, Apache Kafka 4.0+) the session is the group's own configuration,
set as the harvester sets it (:mod:`~pyharvest.core.election.group_protocol`, within the broker's bounds);
with several protocols the runs alternate between them. Exits 1 if a handover did not complete.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from benchmarks.children import python_module
from benchmarks.tests_support import create_topic
from pyharvest.bindings.kafka.confluent import ConfluentClients
from pyharvest.core.election.group_protocol import choose_session, shard_client_configs, wanted_session

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Handover:
    signal: str
    session_s: float
    members: int
    partitions: int
    victim_partitions: list[int]
    handover_s: float | None = None  # None: not within the wait
    survivors_kept_theirs: bool = True
    group_protocol: str = "classic"
    load_1min: float = 0.0  # the machine's load average when the member was stopped


def member(config: dict[str, Any], topic: str) -> None:
    """One member: prints each change of its partitions as a JSON line until SIGTERM, then leaves."""
    from confluent_kafka import Consumer

    def report(event: str, partitions: list[Any]) -> None:
        print(json.dumps({"t": time.time(), "event": event, "partitions": sorted(p.partition for p in partitions)}),
              flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    consumer = Consumer(config)
    consumer.subscribe([topic], on_assign=lambda c, ps: report("assigned", ps),
                       on_revoke=lambda c, ps: report("revoked", ps), on_lost=lambda c, ps: report("revoked", ps))
    while not stop.is_set() and os.getppid() == parent:  # not outliving a benchmark that was killed
        consumer.poll(0.1)
    consumer.close()  # leaves the group: the others' rebalance starts at once


class Members:
    """Member processes and what each owns, from their reports."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.owned: dict[str, set[int]] = {}
        self.events: list[tuple[float, str, str, list[int]]] = []
        self._lock = threading.Lock()

    def start(self, name: str, config: dict[str, Any], topic: str) -> None:
        proc = subprocess.Popen(  # noqa: S603 - this module, fixed arguments
            [*python_module("benchmarks.group_handover"), "--member", json.dumps(config), topic],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )
        self.procs[name] = proc
        self.owned[name] = set()
        threading.Thread(target=self._read, args=(name, proc.stdout), daemon=True).start()

    def _read(self, name: str, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                parts = set(ev["partitions"])
                if ev["event"] == "assigned":
                    self.owned[name] |= parts
                else:
                    self.owned[name] -= parts
                self.events.append((ev["t"], name, ev["event"], ev["partitions"]))

    def changes_since(self, since: float) -> list[tuple[float, str, str, list[int]]]:
        """(time, member, "assigned" or "revoked", partitions) of every change from ``since``."""
        with self._lock:
            return [e for e in self.events if e[0] >= since]

    def snapshot(self) -> dict[str, set[int]]:
        with self._lock:
            return {k: set(v) for k, v in self.owned.items()}

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(what: str, done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.02)
    print(f"  {what}: not within {timeout:.0f} s", file=sys.stderr, flush=True)
    return False


def group_session_s(base: dict[str, Any], group_id: str, heartbeat_timeout: float, group_protocol: str) -> float:
    """The group's session, seconds: under the consumer protocol, set as the harvester sets it."""
    if group_protocol == "classic":
        return wanted_session(heartbeat_timeout).session_ms / 1000
    clients = ConfluentClients()
    clients.check_consumer_protocol(base)
    session, note = choose_session(heartbeat_timeout, clients.session_bounds(base))
    if note:
        print(f"  {note}", file=sys.stderr, flush=True)
    clients.set_group_session(base, group_id, session)
    return session.session_ms / 1000


def run_once(bootstrap: str, sig: str, members: int, partitions: int, heartbeat_timeout: float,
             kafka_config: dict[str, Any], group_protocol: str = "classic") -> Handover:
    topic = f"handover-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    base = {"bootstrap.servers": bootstrap, **kafka_config}
    session_s = group_session_s(base, f"g-{topic}", heartbeat_timeout, group_protocol)
    config, _ = shard_client_configs(base, f"g-{topic}", heartbeat_timeout, group_protocol)
    result = Handover(sig, session_s, members, partitions, [], group_protocol=group_protocol)
    group = Members()
    try:
        for i in range(members):
            group.start(f"m{i}", config, topic)
        everyone = set(range(partitions))

        def settled() -> bool:
            owned = group.snapshot()
            return set().union(*owned.values()) == everyone and all(owned.values())

        if not _wait("every partition owned", settled, 120):
            return result
        time.sleep(1.0)  # a settled group, not one between the two steps of an incremental rebalance
        before = group.snapshot()
        victim = max(before, key=lambda name: (len(before[name]), name))
        result.victim_partitions = sorted(before[victim])
        result.load_1min = os.getloadavg()[0]
        stopped = time.time()
        group.procs[victim].send_signal(getattr(signal, sig))

        def handed_over() -> bool:
            owned = group.snapshot()
            return set().union(*(v for k, v in owned.items() if k != victim)) == everyone

        if _wait("handover", handed_over, result.session_s + 120):
            changes = [c for c in group.changes_since(stopped) if c[1] != victim]
            assigned = [t for t, _, event, _ in changes if event == "assigned"]
            result.handover_s = round(max(assigned) - stopped, 2) if assigned else 0.0
            result.survivors_kept_theirs = not any(
                event == "revoked" and set(parts) & before[who] for _, who, event, parts in changes
            )
    finally:
        group.stop_all()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="", help="a broker to use instead of the embedded one")
    p.add_argument("--signals", default="SIGTERM,SIGKILL")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--partitions", type=int, default=6, help="the shards")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0, help="heartbeatTimeout, s (the session: 3 times)")
    p.add_argument("--kafka-config", type=json.loads, default={}, help="JSON properties added to the consumers'")
    p.add_argument("--group-protocols", default="classic", help="classic, consumer (KIP-848), or both: alternated")
    p.add_argument("--json", default=None)
    p.add_argument("--member", nargs=2, metavar=("CONFIG", "TOPIC"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.member:
        member(json.loads(args.member[0]), args.member[1])
        return 0
    if args.members < 2 or args.partitions < args.members:
        p.error("need at least 2 members and a partition for each")
    from pyharvest.bindings.kafka.embedded import EmbeddedBroker

    runs: list[Handover] = []
    broker = EmbeddedBroker() if not args.bootstrap else None
    try:
        bootstrap = args.bootstrap or broker.start().bootstrap_servers  # type: ignore[union-attr]
        for rnd in range(1, args.rounds + 1):
            for sig in args.signals.split(","):
                for protocol in args.group_protocols.split(","):
                    print(f"round {rnd}: {sig}, {protocol} protocol", file=sys.stderr, flush=True)
                    runs.append(run_once(bootstrap, sig, args.members, args.partitions, args.heartbeat_timeout,
                                         args.kafka_config, protocol))
    finally:
        if broker is not None:
            broker.stop()
    print(f"\n{args.members} members, {args.partitions} partitions; handover: from the stop until the others "
          "own every partition")
    print(f"{'protocol':>8} {'signal':>7} {'session s':>9} {'handover s':>10} {'beyond session s':>16} "
          f"{'load':>5}  survivors kept theirs")
    for r in sorted(runs, key=lambda r: (r.group_protocol, r.signal)):
        beyond = "" if r.handover_s is None or r.signal != "SIGKILL" else f"{r.handover_s - r.session_s:.2f}"
        handover = "-" if r.handover_s is None else f"{r.handover_s:.2f}"
        print(f"{r.group_protocol:>8} {r.signal:>7} {r.session_s:>9g} {handover:>10} {beyond:>16} "
              f"{r.load_1min:>5.1f}  {'yes' if r.survivors_kept_theirs else 'no'}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in runs], indent=2))
    return 0 if all(r.handover_s is not None for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
