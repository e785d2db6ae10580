"""End to end, with crashes: outbox A → reaper A → topic 1 → two ``reaper inbox`` processes
→ balances + outbox B → reaper B → topic 2.

Writers stash increments into outbox A. Two reaper A processes publish them (the leader is
SIGKILLed at random and replaced). Two inbox processes apply each message as an increment
to its key's balance, log it, and stash a derived record into outbox B in the same
transaction; they are SIGKILLed and restarted at random, forcing rebalances mid-batch.
Reaper B publishes outbox B to topic 2.

Checked: every balance equals the exactly-once sum; every key's increments were applied
once each and in order; topic 2 holds every derived record in per-key order (duplicates
only as at-least-once publishing allows, by :func:`pyharvest.verify.verify_topic`).

CI runs about 15 s of chaos per database; ``PYHARVEST_CHAIN_SECONDS`` makes it longer.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from benchmarks.children import python_module
from pyharvest import OutboxRecord, stasher
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.verify import verify_topic
from tests.helpers.inbox.chain_handler import tables as chain_tables
from tests.helpers.reapers import Reaper, pause_at_random
from tests.helpers.topics import create_topic
from tests.helpers.waiting import wait_until

CHAOS_SECONDS = float(os.environ.get("PYHARVEST_CHAIN_SECONDS", "15"))
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(int(180 + 4 * CHAOS_SECONDS))]


class InboxProcess:
    def __init__(self, config: Path, log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [
                *python_module("pyharvest"),
                "inbox",
                "-f",
                str(config),
                "--handler",
                "tests.helpers.inbox.chain_handler:apply",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()


def _count(engine: sa.Engine, table: str) -> int:
    with engine.connect() as c:
        return int(
            c.execute(sa.text(f"SELECT COUNT(*) FROM {engine.dialect.identifier_preparer.quote(table)}")).scalar_one()
        )


def _stop_all(procs: list) -> None:
    for p in procs:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.wait(5)


def test_chain_exactly_once_under_crashes(tmp_path, kafka_bootstrap, database_url, table_name):
    rnd = random.Random(int(os.environ.get("PYHARVEST_CHAIN_SEED", str(random.randrange(1 << 30)))))
    prefix = table_name
    topic1, topic2 = f"chain1-{uuid.uuid4().hex[:8]}", f"chain2-{uuid.uuid4().hex[:8]}"
    for t in (topic1, topic2):
        create_topic(kafka_bootstrap, t, partitions=4)
    create_outbox_table(database_url, f"{prefix}_a")
    create_outbox_table(database_url, f"{prefix}_b")
    balances, log_table = chain_tables(prefix)
    engine = sa.create_engine(database_url)
    balances.metadata.create_all(engine)
    keys = [f"k{i}" for i in range(24)]
    with engine.begin() as c:
        c.execute(sa.insert(balances), [{"k": k, "balance": 0} for k in keys])

    def reaper_config(outbox: str, group: str) -> Path:
        path = tmp_path / f"{group}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "harvest": {
                        "baseKafkaConfig": {"bootstrap.servers": kafka_bootstrap},
                        "leaderGroupID": group,
                        "dataSource": database_url,
                        "outboxTable": outbox,
                        "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms", "maxInFlightRecords": 200},
                    },
                    "logging": {"level": "Info"},
                }
            )
        )
        return path

    run = uuid.uuid4().hex[:6]
    config_a = reaper_config(f"{prefix}_a", f"chain-a-{run}")
    config_b = reaper_config(f"{prefix}_b", f"chain-b-{run}")
    inbox_config = tmp_path / "inbox.yaml"
    inbox_config.write_text(
        yaml.safe_dump(
            {
                "inbox": {
                    "baseKafkaConfig": {
                        "bootstrap.servers": kafka_bootstrap,
                        "session.timeout.ms": 6000,
                        "heartbeat.interval.ms": 500,
                    },
                    "groupID": f"chain-inbox-{run}",
                    "topics": [topic1],
                    "dataSource": database_url,
                    "checkpointTable": f"{prefix}_cp",
                    "dedupeTable": f"{prefix}_dd",
                    "deadLetterTable": f"{prefix}_dl",
                    "limits": {"maxBatchSize": 200, "maxBatchDuration": "50ms", "ioErrorBackoff": "200ms"},
                },
                "logging": {"level": "Info"},
            }
        )
    )
    env = {**os.environ, "CHAIN_PREFIX": prefix, "CHAIN_TOPIC2": topic2, }

    expected_sum = dict.fromkeys(keys, 0)
    sequence = dict.fromkeys(keys, 0)
    stop_writing = threading.Event()
    errors: list[BaseException] = []

    def writer(mine: list[str], seed: int) -> None:
        # Each key has one writer: its records are causally ordered.
        wr = random.Random(seed)
        out = stasher.Stasher(f"{prefix}_a")
        try:
            while not stop_writing.is_set():
                with engine.begin() as conn:
                    prepared = out.prepare(conn)
                    for _ in range(10):
                        k = wr.choice(mine)
                        amount = wr.randint(1, 100)
                        body = json.dumps({"k": k, "s": sequence[k], "a": amount}).encode()
                        prepared.stash(OutboxRecord(topic1, k, body))
                        sequence[k] += 1
                        expected_sum[k] += amount
                stop_writing.wait(0.02)  # the writer's pace, cut short by the stop
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    n = 0
    logs = tmp_path

    def new_inbox() -> InboxProcess:
        nonlocal n
        n += 1
        return InboxProcess(inbox_config, logs / f"inbox-{n}.log", env)

    def new_reaper(config: Path, name: str) -> Reaper:
        nonlocal n
        n += 1
        return Reaper(config, logs / f"{name}-{n}.log")

    reapers_a = [new_reaper(config_a, "reaper-a") for _ in range(2)]
    reaper_b = new_reaper(config_b, "reaper-b")
    inboxes = [new_inbox() for _ in range(2)]
    everyone = lambda: [*reapers_a, reaper_b, *inboxes]  # noqa: E731
    writers = [threading.Thread(target=writer, args=(keys[w::2], rnd.random())) for w in range(2)]
    kills = {"inbox": 0, "reaper": 0}
    try:
        for w in writers:
            w.start()
        deadline = time.monotonic() + CHAOS_SECONDS
        turn = 0
        while time.monotonic() < deadline:
            pause_at_random(rnd, 2.0, 4.0)
            # Alternate so that a short run still kills both kinds at least once.
            if turn % 2 == 0:
                victim = rnd.choice(inboxes)
                victim.proc.send_signal(signal.SIGKILL)
                victim.wait(10)
                inboxes[inboxes.index(victim)] = new_inbox()
                kills["inbox"] += 1
            else:
                leaders = [r for r in reapers_a if r.is_leader()]
                victim = leaders[0] if leaders else rnd.choice(reapers_a)
                victim.signal(signal.SIGKILL)
                victim.wait(10)
                reapers_a[reapers_a.index(victim)] = new_reaper(config_a, "reaper-a")
                kills["reaper"] += 1
            turn += 1
        stop_writing.set()
        for w in writers:
            w.join()
        assert not errors, errors
        total = sum(sequence.values())

        def drained() -> bool:
            for p in inboxes:
                assert p.proc.poll() is None, f"an inbox exited:\n{p.log()[-3000:]}"
            return (
                _count(engine, log_table.name) >= total
                and _count(engine, f"{prefix}_a") == 0
                and _count(engine, f"{prefix}_b") == 0
            )

        wait_until(drained, 90 + CHAOS_SECONDS, lambda: (
            f"the chain to drain: applied {_count(engine, log_table.name)} of {total}; "
            f"outbox A {_count(engine, f'{prefix}_a')}, outbox B {_count(engine, f'{prefix}_b')}"
        ), interval=0.25)
    finally:
        stop_writing.set()
        for w in writers:
            if w.is_alive():
                w.join()
        _stop_all(everyone())

    with engine.connect() as c:
        got_balance = dict(c.execute(sa.select(balances.c.k, balances.c.balance)).all())
        applied = c.execute(sa.select(log_table.c.k, log_table.c.s).order_by(log_table.c.id)).all()
    engine.dispose()
    assert got_balance == expected_sum, "a balance differs from the exactly-once sum"
    per_key: dict[str, list[int]] = {k: [] for k in keys}
    for k, s in applied:
        per_key[k].append(s)
    for k in keys:
        assert per_key[k] == list(range(sequence[k])), f"key {k}: not applied exactly once in order: {per_key[k][:20]}…"

    expected = [(k, f"{k}:{s}") for k in keys for s in range(sequence[k])]
    report = verify_topic(kafka_bootstrap, topic2, expected, timeout=60)
    assert report.ok, str(report)
    print(f"chain: {total} records, kills {kills}, topic 2 duplicates {report.duplicate_count}")
