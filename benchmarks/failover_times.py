"""How long leadership takes: the first election, and the handover when the leader is killed
(SIGKILL) or stopped (SIGTERM), measured with real harvester processes.

    python -m benchmarks.failover_times [--bootstrap HOST:PORT] [--rounds 3] [--heartbeat-timeout 5s]
    python -m benchmarks.failover_times --bootstrap HOST:PORT --group-protocols classic,consumer
    python -m benchmarks.failover_times --bootstrap HOST:PORT --restart

Each round starts a harvester alone (fresh start → its LeaderAcquired), then a standby; once
the group is settled it SIGKILLs the leader and times the standby's LeaderAcquired; then
starts another standby and SIGTERMs the leader the same way. Harvesters harvest an empty
SQLite outbox; times are wall-clock across processes. Without ``--bootstrap`` an embedded
broker is started. Prints the load average beside the figures.

``--restart`` times, instead, a lone harvester killed (SIGKILL) and started again at once, as
a dynamic member (the restart waits for the group to expire the dead member: a session, 3 x
heartbeatTimeout) and as a static one (``instanceID``: it takes the shard straight back);
rounds interleaved. A record is stashed while the harvester is down; seconds from the new
process's exec (and from its "starting" line, after its imports) to its LeaderAcquired and to
that record's publication (acknowledged by Kafka and purged). ``--timeline`` prints the
restarted process's log lines with their times for the last static round.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from benchmarks.children import python_code
from pyharvest.core.config.durations import parse_duration

# A harvester process: prints "<wall time> <event>" for its start and its leadership events.
CHILD = """
import logging, signal, sys, threading, time
logging.basicConfig(level=logging.INFO, format="%(created).3f %(name)s %(message)s", stream=sys.stderr)
from pyharvest import Config, Harvest, Limits
from pyharvest.events import LeaderAcquired, LeaderFenced, LeaderRevoked
from pyharvest.core.config.durations import parse_duration

def say(what):
    print(f"{time.time():.3f} {what}", flush=True)

def on_event(e):
    if isinstance(e, (LeaderAcquired, LeaderRevoked, LeaderFenced)):
        say(type(e).__name__)

bootstrap, url, group, heartbeat, interval, protocol, instance_id = (sys.argv[1:8] + [""])[:7]
kafka = {"bootstrap.servers": bootstrap, **({"heartbeat.interval.ms": int(interval)} if interval else {})}
config = Config(base_kafka_config=kafka, data_source=url, leader_group_id=group, group_protocol=protocol,
                limits=Limits(heartbeat_timeout=parse_duration(heartbeat)), instance_id=instance_id)
harvest = Harvest(config, on_event=on_event)
signal.signal(signal.SIGTERM, lambda *_: harvest.stop())
say("starting")
harvest.start()

def published():
    while harvest.metrics.records_purged == 0:
        time.sleep(0.005)
    say("Published")

threading.Thread(target=published, daemon=True).start()
harvest.join()
say("stopped")
"""


#: A handover not done after this long is reported as a stall.
STALL = 120.0


class Harvester:
    def __init__(self, name: str, args: list[str], log: bool = False) -> None:
        self.name = name
        self.events: queue.Queue[tuple[float, str]] = queue.Queue()
        self.history: list[tuple[float, str]] = []
        self.log: list[str] = []
        self.exec_at = time.time()
        self.proc = subprocess.Popen(
            python_code(CHILD, *args), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if log else subprocess.DEVNULL, text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        if log:
            threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            stamp, _, what = line.strip().partition(" ")
            try:
                self.events.put((float(stamp), what))
            except ValueError:
                continue

    def drain(self) -> None:
        while True:
            try:
                self.history.append(self.events.get_nowait())
            except queue.Empty:
                return

    def leads(self) -> bool:
        self.drain()
        status = [w for _, w in self.history if w.startswith("Leader")]
        return bool(status) and status[-1] == "LeaderAcquired"

    def first(self, what: str, after: float = 0.0, timeout: float = 120.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.drain()
            for stamp, w in self.history:
                if w == what and stamp >= after:
                    return stamp
            time.sleep(0.02)
        raise TimeoutError(f"{self.name}: no {what} within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def settled(harvesters: list[Harvester], quiet: float, timeout: float = 120.0) -> Harvester:
    """Wait until exactly one harvester leads and nothing happened for ``quiet`` s: no
    leadership event, and no harvester started (its join takes up to a session timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        leaders = [h for h in harvesters if h.leads()]
        last = max((s for h in harvesters for s, _ in h.history), default=0.0)
        if len(leaders) == 1 and time.time() - last > quiet:
            return leaders[0]
    raise TimeoutError("the group did not settle on one leader")


def handover(running: list[Harvester], sig: int, leader: Harvester | None = None) -> float:
    """Signal the leader (by default the one harvester leading); seconds until the other leads."""
    if leader is None:
        (leader,) = [h for h in running if h.leads()]
    at = time.time()
    leader.proc.send_signal(sig)
    running.remove(leader)
    (standby,) = running
    try:
        took = standby.first("LeaderAcquired", after=at, timeout=STALL) - at
    except TimeoutError:
        took = float("inf")  # printed as a stall
    leader.proc.wait(60)
    return took


def round_(args: argparse.Namespace, bootstrap: str, url: str, interval: str, protocol: str = "classic"
           ) -> dict[str, float]:
    group = f"failover-{uuid.uuid4().hex[:8]}"
    child = [bootstrap, url, group, args.heartbeat_timeout, interval, protocol]
    # A join completes within a session timeout (3 × heartbeatTimeout) on any broker.
    quiet = 3 * parse_duration(args.heartbeat_timeout) + 2
    times: dict[str, float] = {}
    running: list[Harvester] = []
    try:
        first = Harvester("a", child)
        running.append(first)
        started = first.first("starting")
        times["fresh start → leader"] = first.first("LeaderAcquired") - started
        running.append(Harvester("b", child))
        settled(running, quiet)
        times["SIGKILL → new leader"] = handover(running, signal.SIGKILL)
        running.append(Harvester("c", child))
        settled(running, quiet)
        times["SIGTERM → new leader"] = handover(running, signal.SIGTERM)
        if not args.mid_rebalance:
            return times
        # A stop in the middle of a rebalance (a standby joining): the rebalance must not wait
        # for the member that left.
        (leader,) = running
        joining = Harvester("d", child)
        running.append(joining)
        joining.first("starting")
        # fixed sleep: the join under way (it revokes nothing from the sticky leader, so there is
        # no event to wait on); the stop lands in the rebalance it began.
        time.sleep(0.5)
        times["SIGTERM mid-rebalance → leader"] = handover(running, signal.SIGTERM, leader)
    finally:
        for h in running:
            h.stop()
    return times


def stash_one(url: str, topic: str) -> None:
    import sqlalchemy as sa

    from pyharvest import OutboxRecord, stasher

    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            stasher.Stasher("outbox").stash(conn, OutboxRecord(topic, "restart", b"again"))
    finally:
        engine.dispose()


TIMELINE: list[str] = []


def restart_round(args: argparse.Namespace, bootstrap: str, url: str, instance_id: str) -> dict[str, float]:
    """A lone harvester SIGKILLed and started again at once, a record stashed meanwhile:
    seconds from the restart to its LeaderAcquired and to the record's publication."""
    child = [bootstrap, url, f"restart-{uuid.uuid4().hex[:8]}", args.heartbeat_timeout, "", "classic", instance_id]
    first = Harvester("a", child)
    try:
        first.first("LeaderAcquired")
        first.proc.kill()
        first.proc.wait()
        stash_one(url, f"restart-{uuid.uuid4().hex[:8]}")
        again = Harvester("a'", child, log=bool(args.timeline and instance_id))
        try:
            started = again.first("starting")
            led = again.first("LeaderAcquired", timeout=STALL)
            published = again.first("Published", timeout=STALL)
            if again.log:
                TIMELINE[:] = [f"{again.exec_at:.3f} (exec)", f"{started:.3f} starting (imports done)",
                               *again.log, f"{published:.3f} Published (acknowledged and purged)"]
            return {
                "exec → leader": led - again.exec_at,
                "exec → published": published - again.exec_at,
                "starting → leader": led - started,
            }
        finally:
            again.stop()
    finally:
        first.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="a running broker (default: start the embedded one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heartbeat-timeout", default="5s", help="limits.heartbeatTimeout of every harvester")
    parser.add_argument(
        "--mid-rebalance", action="store_true",
        help="also SIGTERM the leader while a standby joins (on the embedded broker: a stall, see docs/operations.md)",
    )
    parser.add_argument(
        "--compare-heartbeat-interval", type=int, metavar="MS",
        help="also run rounds with this heartbeat.interval.ms (e.g. 3000, librdkafka's default), interleaved",
    )
    parser.add_argument("--restart", action="store_true",
                        help="time a kill -9 and an immediate restart, dynamic and static (instanceID), instead")
    parser.add_argument("--static-only", action="store_true", help="with --restart: the static member's rounds only")
    parser.add_argument("--timeline", action="store_true",
                        help="with --restart: print the last static restart's log lines with their times")
    parser.add_argument("--group-protocols", default="classic",
                        help="the leader group's protocols (classic, consumer: KIP-848), rounds interleaved")
    args = parser.parse_args()

    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from pyharvest.bindings.kafka.embedded import EmbeddedBroker

            bootstrap = stack.enter_context(EmbeddedBroker()).bootstrap_servers
        from pyharvest.bindings.sql import create_outbox_table

        url = f"sqlite:///{Path(tmp) / 'outbox.db'}"
        create_outbox_table(url)
        print(f"heartbeatTimeout {args.heartbeat_timeout}, broker {bootstrap}; load average {os.getloadavg()[0]:.2f}")
        variants = {("", p): p for p in args.group_protocols.split(",")}
        if args.compare_heartbeat_interval:
            variants[(str(args.compare_heartbeat_interval), "classic")] = (
                f"heartbeat.interval.ms={args.compare_heartbeat_interval}")
        results: dict[tuple[str, str], list[float]] = {}
        for n in range(1, args.rounds + 1):
            runs = (
                [(label, lambda i=instance: restart_round(args, bootstrap, url, i))
                 for label, instance in (("dynamic (no instanceID)", ""), ("static (instanceID)", "bench-0"))
                 if instance or not args.static_only]
                if args.restart else
                [(label, lambda i=interval, p=protocol: round_(args, bootstrap, url, i, p))
                 for (interval, protocol), label in variants.items()]
            )
            for label, run in runs:
                for what, seconds in run().items():
                    results.setdefault((label, what), []).append(seconds)
                    shown = f"{seconds:6.1f} s" if seconds != float("inf") else f"no leader after {STALL:.0f} s"
                    print(f"round {n}  {label:<26} {what:<30} {shown}", flush=True)
        print(f"load average {os.getloadavg()[0]:.2f}")
        if TIMELINE:
            t0 = float(TIMELINE[0].split()[0])
            print("timeline of the last static restart (seconds from exec):")
            for line in TIMELINE:
                stamp, _, rest = line.partition(" ")
                try:
                    print(f"  {float(stamp) - t0:6.3f}  {rest[:160]}")
                except ValueError:
                    print(f"          {line[:160]}")
        for (label, what), values in results.items():
            print(f"{label:<26} {what:<30} median {statistics.median(values):5.1f} s  "
                  f"(min {min(values):.1f}, max {max(values):.1f})")


if __name__ == "__main__":
    main()
