"""Harvesters under test: ``reaper`` processes (one, or a sharded group to kill at random; one
watched from outside through its operations server, :class:`ReaperProcess`), the
configurations they run with, and the topic they filled, checked at the end."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.children import python_module
from benchmarks.topic_check import read_back
from pyharvest import Config, Limits
from tests.helpers.fixtures.kafka import on_embedded_broker
from tests.helpers.waiting import wait_until


class Reaper:
    def __init__(self, config_path: Path, log_path: Path, cwd: Path | None = None) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [*python_module("pyharvest"), "-f", str(config_path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def leader_terms(self) -> int:
        text = self.log()
        return text.count("elected leader") - text.count("lost leader status") - text.count("fenced:")

    def is_leader(self) -> bool:
        return self.proc.poll() is None and self.leader_terms() > 0

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()


_LISTENING = re.compile(r"metrics and health listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)")


class ReaperProcess(Reaper):
    """A ``reaper`` for tests that watch it from outside (a browser, Prometheus): started from a
    configuration mapping written to ``folder`` as ``reaper -f NAME.yaml`` there (as an operator
    types it), its operations server found from its log, stopped by a signal."""

    def __init__(self, config: dict[str, Any], folder: Path, name: str = "reaper") -> None:
        self.folder = folder
        self.config_path = folder / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        super().__init__(Path(self.config_path.name), folder / f"{name}.log", cwd=folder)

    def ops_url(self, timeout: float = 60.0) -> str:
        """The operations server's base URL, once its start-up line is logged."""
        found: list[re.Match[str]] = []

        def listening() -> bool:
            assert self.proc.poll() is None, f"reaper exited ({self.proc.returncode}):\n{self.log()}"
            found[:] = [m for m in [_LISTENING.search(self.log())] if m]
            return bool(found)

        wait_until(listening, timeout, "the reaper to log its metrics address", interval=0.1)
        return f"http://127.0.0.1:{found[0].group(2)}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal it and wait for it to exit (killed after ``timeout``); its exit status."""
        if self.proc.poll() is None:
            self.signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> ReaperProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def config(bootstrap: str, url: str, table: str, **overrides) -> Config:
    limits = {"heartbeat_timeout": 2.0, "min_poll_interval": 0.05, "io_error_backoff": 0.05}
    limits.update(overrides.pop("limits", {}))
    return Config(
        base_kafka_config={"bootstrap.servers": bootstrap, **overrides.pop("kafka", {})},
        leader_group_id=overrides.pop("group", f"faults-{uuid.uuid4().hex[:8]}"),
        data_source=url,
        outbox_table=table,
        limits=Limits(**limits),
        **overrides,
    )


def check_topic(bootstrap: str, topic: str, expected) -> None:
    report, _hidden = read_back(bootstrap, topic, expected, timeout=60, nudge_missing=on_embedded_broker())
    print(report)
    assert report.ok, str(report)



# ---------------------------------------------------------------------- a sharded group

SHARDS = 6


_EVENT = re.compile(r"shard (\d+) (assigned|revoked|fenced)")


def shards_of(reaper: Reaper) -> set[int]:
    """The shards a reaper process owns, from its log (assignments minus revocations)."""
    if reaper.proc.poll() is not None:
        return set()
    owned: set[int] = set()
    for shard, what in _EVENT.findall(reaper.log()):
        if what == "assigned":
            owned.add(int(shard))
        elif what == "revoked":
            owned.discard(int(shard))
    return owned


def live_databases(dialect: str) -> None:
    if dialect not in ("postgresql", "mysql"):
        pytest.skip("sharded chaos runs on PostgreSQL and MariaDB")


def write_config(tmp_path, bootstrap: str, url: str, table: str, group_protocol: str = "classic", **harvest) -> object:
    path = tmp_path / "reaper.yaml"
    path.write_text(yaml.safe_dump({
        "harvest": {
            "baseKafkaConfig": {"bootstrap.servers": bootstrap, **({"debug": os.environ["PYHARVEST_CHAOS_DEBUG"]} if os.environ.get("PYHARVEST_CHAOS_DEBUG") else {})}, "leaderGroupID": f"chaos-{uuid.uuid4().hex[:8]}",
            "dataSource": url, "outboxTable": table, "shards": SHARDS, "groupProtocol": group_protocol,
            "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms", "maxInFlightRecords": 500,
                       "shutdownTimeout": "3s"},
            **harvest,
        },
        # With PYHARVEST_CHAOS_DEBUG (librdkafka debug contexts, e.g. "cgrp"), log at Debug so they show.
        "logging": {"level": "Debug" if os.environ.get("PYHARVEST_CHAOS_DEBUG") else "Info"},
    }))
    return path


def settled(reapers: list[Reaper]) -> bool:
    """Every shard led and every live process leading some: no rebalance is under way."""
    owned = [shards_of(r) for r in reapers if r.proc.poll() is None]
    return sorted(s for o in owned for s in o) == list(range(SHARDS)) and all(owned)


def stop_all(reapers: list[Reaper]) -> None:
    for r in reapers:
        if r.proc.poll() is None:
            r.signal(signal.SIGTERM)
    for r in reapers:
        try:
            r.wait(30)
        except Exception:  # noqa: BLE001
            r.proc.kill()
            r.wait(5)


class Spawner:
    """Starts reaper processes on one config, each with a log of its own."""

    def __init__(self, config: object, logs: Path) -> None:
        self._config, self._logs, self.spawned = config, logs, 0

    def __call__(self) -> Reaper:
        self.spawned += 1
        return Reaper(self._config, self._logs / f"reaper-{self.spawned}.log")


def pause_at_random(rnd: random.Random, low: float, high: float) -> None:
    """The chaos tests' pause between two faults, a random span of ``low`` to ``high`` seconds."""
    # fixed sleep: a chaos test strikes at random moments, mid-stream; the pause is that
    # randomness (the schedule of the faults), not a wait for the system: nothing to wait on.
    time.sleep(rnd.uniform(low, high))


def stop_at_random(reapers: list[Reaper], spawn: Spawner, rnd: random.Random, seconds: float,
                   pause: tuple[float, float]) -> list[str]:
    """For ``seconds``: every ``pause`` seconds (a random span), SIGKILL or SIGTERM a random
    process that leads a shard and start a new one in its place. Returns what was done."""
    actions: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pause_at_random(rnd, *pause)
        victims = [r for r in reapers if shards_of(r)]
        if not victims:
            continue
        victim = rnd.choice(victims)
        action = rnd.choice(("SIGKILL", "SIGTERM"))
        if action == "SIGTERM" and on_embedded_broker():
            # The embedded broker (Tansu 0.6) does not complete a rebalance whose group leader
            # left with LeaveGroup while it was under way: every member is left without an
            # assignment for minutes (tests/kafka_repro_leader_leave.py shows it without
            # pyharvest; a SIGKILLed leader is replaced). Apache Kafka elects another leader,
            # so there the stop stays at a random moment.
            wait_until(lambda: settled(reapers), 60, "the group to settle before a graceful stop")
            victim = rnd.choice([r for r in reapers if shards_of(r)])
        victim.signal(signal.SIGKILL if action == "SIGKILL" else signal.SIGTERM)
        code = victim.wait(30)
        assert action == "SIGKILL" or code == 0, victim.log()[-3000:]
        actions.append(action)
        reapers[reapers.index(victim)] = spawn()
    return actions

