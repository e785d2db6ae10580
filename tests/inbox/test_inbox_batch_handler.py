"""The batch handler on real databases and a real broker: each message applied once
through a SIGKILL inside an open transaction and a rerun; a failing message inside a batch
parks only its key; replay through the batch handler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from benchmarks.children import python_module
from pyharvest.inbox import Inbox, InboxMessage, InboxTables, request_replay
from tests.helpers.inbox.batch_handler import log_table
from tests.helpers.inbox.tools import identity, inbox_config, produce
from tests.helpers.topics import create_topic
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
HANDLER = ["--batch-handler", "tests.helpers.inbox.batch_handler:apply"]


@pytest.fixture
def engine(database_url: str):
    e = sa.create_engine(database_url)
    yield e
    e.dispose()


def checkpoints(engine: sa.Engine, prefix: str, group: str) -> dict[int, int | None]:
    cp = InboxTables.build(f"{prefix}_cp", f"{prefix}_dd", f"{prefix}_dl").checkpoint
    with engine.connect() as c:
        rows = c.execute(sa.select(cp.c.kafka_partition, cp.c.next_offset).where(cp.c.group_id == group)).all()
    return dict(rows)  # type: ignore[arg-type]


class InboxProcess:
    """``reaper inbox --batch-handler tests.helpers.inbox.batch_handler:apply``."""

    def __init__(self, config: Path, log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [*python_module("pyharvest"), "inbox", "-f", str(config), *HANDLER],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=env,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)


def script(partition: int, keys: list[str], originals: int, first_record: int) -> tuple[list, list[tuple[str, int]]]:
    """Messages for one partition: ``originals`` records round robin over ``keys``, and after
    every 37th a republished copy of the record 20 before it (same identity, same value).
    Returns the messages and, per offset, the (key, seq) applied there or None for a copy."""
    messages: list = []
    at_offset: list = []
    seq = dict.fromkeys(keys, 0)
    bodies: list[tuple[str, bytes, list]] = []
    for i in range(originals):
        k = keys[i % len(keys)]
        body = json.dumps({"k": k, "s": seq[k]}).encode()
        entry = (k, body, identity("batch/outbox", first_record + i))
        bodies.append(entry)
        messages.append(entry)
        at_offset.append((k, seq[k]))
        seq[k] += 1
        if i % 37 == 36:
            messages.append(bodies[i - 20])
            at_offset.append(None)
    return messages, at_offset


def test_each_message_applied_once_through_a_kill_inside_a_transaction(
    tmp_path, kafka_bootstrap, topic_name, database_url, table_name, engine
):
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    log = log_table(table_name)
    log.metadata.create_all(engine)
    expected: dict[int, list] = {}
    for p in (0, 1):
        keys = [f"p{p}k{i}" for i in range(4)]
        messages, expected[p] = script(p, keys, 600, first_record=1 + p * 10_000)
        produce(kafka_bootstrap, topic_name, messages, partition=p)
    group = f"batch-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "inbox.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "inbox": {
                    "baseKafkaConfig": {
                        "bootstrap.servers": kafka_bootstrap,
                        "session.timeout.ms": 6000,
                        "heartbeat.interval.ms": 500,
                    },
                    "groupID": group,
                    "topics": [topic_name],
                    "dataSource": database_url,
                    "checkpointTable": f"{table_name}_cp",
                    "dedupeTable": f"{table_name}_dd",
                    "deadLetterTable": f"{table_name}_dl",
                    "limits": {"maxBatchSize": 100, "maxBatchDuration": "2s"},
                },
                "logging": {"level": "Info"},
            }
        )
    )
    stall = tmp_path / "stalled"
    env = {**os.environ, "BATCH_PREFIX": table_name, }
    first = InboxProcess(
        config, tmp_path / "first.log", {**env, "BATCH_STALL_FILE": str(stall), "BATCH_STALL_AFTER": "5"}
    )
    try:
        wait_until(lambda: stall.exists() or first.proc.poll() is not None, 60, "the fifth transaction")
        assert first.proc.poll() is None, first.log()
        first.stop(signal.SIGKILL)  # inside the fifth transaction: its rows written, not committed
    finally:
        first.stop(signal.SIGKILL)

    def applied() -> list[tuple[int, int, str, int]]:
        with engine.connect() as c:
            return [
                tuple(r)
                for r in c.execute(
                    sa.select(log.c.kafka_partition, log.c.kafka_offset, log.c.k, log.c.s).order_by(log.c.id)
                )
            ]  # type: ignore[misc]

    def committed_effects(stored: dict[int, int | None]) -> set[tuple[int, int]]:
        return {(p, o) for p in (0, 1) for o, e in enumerate(expected[p][: stored.get(p) or 0]) if e is not None}

    stored = checkpoints(engine, table_name, group)
    got = applied()
    assert 0 < len(got) < 1200, "killed in the middle"
    assert {(p, o) for p, o, _, _ in got} == committed_effects(stored), "effects and checkpoints committed together"
    assert len(got) == len({(p, o) for p, o, _, _ in got})

    second = InboxProcess(config, tmp_path / "second.log", env)
    try:
        total = {p: len(expected[p]) for p in (0, 1)}
        wait_until(lambda: checkpoints(engine, table_name, group) == total or second.proc.poll() is not None, 90, "all")
        assert second.proc.poll() is None, second.log()
    finally:
        assert second.stop() == 0, second.log()
    got = applied()
    assert sorted((p, o) for p, o, _, _ in got) == sorted(committed_effects(total)), "each message once, copies dropped"
    per_key: dict[str, list[int]] = {}
    for _, _, k, s in got:
        per_key.setdefault(k, []).append(s)
    assert all(seqs == list(range(len(seqs))) for seqs in per_key.values()), "each key's messages in order"
    assert sum(len(s) for s in per_key.values()) == 1200


def test_a_failing_message_parks_only_its_key_and_replays_through_the_batch_handler(
    kafka_config, kafka_bootstrap, topic_name, database_url, table_name, engine
):
    create_topic(kafka_bootstrap, topic_name, partitions=1)
    events = sa.Table(
        f"{table_name}_ev",
        sa.MetaData(),
        sa.Column("event_id", sa.String(50), primary_key=True),
        sa.Column("k", sa.String(50), nullable=False),
        sa.Column("kafka_offset", sa.BigInteger, nullable=False),
    )
    events.metadata.create_all(engine)
    with engine.begin() as c:  # a row the bad message collides with
        c.execute(sa.insert(events), {"event_id": "e7", "k": "elsewhere", "kafka_offset": -1})
    insert = sa.insert(events)
    calls: list[int] = []

    def apply_all(tx: sa.Connection, messages: list[InboxMessage]) -> None:
        calls.append(len(messages))
        tx.execute(
            insert,
            [{"event_id": (m.value or b"").decode(), "k": m.key_text, "kafka_offset": m.offset} for m in messages],
        )

    keys = ["a", "b", "c"]
    # Offsets 0..29 round robin over a, b, c; offset 7 (key b) carries the taken id e7.
    produce(kafka_bootstrap, topic_name, [(keys[i % 3], f"e{i}".encode(), identity("o", i + 1)) for i in range(30)])
    config = inbox_config(kafka_config, database_url, topic_name, table_name, error_policy="dead-letter")
    tables = InboxTables.build(f"{table_name}_cp", f"{table_name}_dd", f"{table_name}_dl")
    tables.create(engine)
    dl = tables.dead_letter

    def stored() -> list[tuple[str, int]]:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(sa.select(dl.c.status, dl.c.kafka_offset).order_by(dl.c.id))]  # type: ignore[misc]

    def applied() -> list[tuple[str, int]]:
        with engine.connect() as c:
            return sorted(
                (k, o)
                for k, o in c.execute(sa.select(events.c.k, events.c.kafka_offset).where(events.c.kafka_offset >= 0))
            )

    with Inbox(config, batch_handler=apply_all) as inbox:
        wait_until(lambda: checkpoints(engine, table_name, config.group_id).get(0) == 30, 60, "all 30 consumed")
        wait_until(lambda: inbox.stats.dead_lettered + inbox.stats.parked >= 8, 5, "the commit's counters")
        assert stored() == [("dead", 7)] + [("parked", o) for o in range(10, 30, 3)], "only key b parks"
        with engine.connect() as c:
            assert "e7" in c.execute(sa.select(dl.c.error).where(dl.c.status == "dead")).scalar_one()
        expected = [(keys[o % 3], o) for o in range(30) if o % 3 != 1 or o < 7]
        assert applied() == sorted(expected), "every other message applied, once"
        s = inbox.stats
        assert (s.applied, s.dead_lettered, s.parked) == (22, 1, 7)
        # The operator removes the collision and asks for b's replay: the owner applies b's
        # stored messages in order through the batch handler, in one call.
        with engine.begin() as c:
            c.execute(sa.delete(events).where(events.c.event_id == "e7"))
            calls.clear()
            assert request_replay(c, dl, config.group_id, key=b"b") == 8
        wait_until(lambda: stored() == [], 30, "the replay")
        assert calls == [8]
        produce(kafka_bootstrap, topic_name, [("b", b"e30", identity("o", 31))])
        wait_until(lambda: len(applied()) == 31, 30, "key b flowing again")
    assert applied() == sorted([(keys[o % 3], o) for o in range(30)] + [("b", 30)])


def test_the_docs_batch_handler_example_runs_as_written(tmp_path, kafka_bootstrap, topic_name, database_url, engine):
    example = ROOT / "docs" / "examples" / "inbox" / "payments.py"
    with engine.begin() as c:
        c.execute(sa.text("DROP TABLE IF EXISTS payments"))
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    messages = [(f"acct-{i % 5}", str(i).encode(), identity("billing/outbox", i)) for i in range(40)]
    produce(kafka_bootstrap, topic_name, [*messages, messages[3]], partition=None)  # and a republished copy
    env = {
        **os.environ,
        "DATA_SOURCE": database_url,
        "BOOTSTRAP_SERVERS": kafka_bootstrap,
        "GROUP_ID": f"payments-{uuid.uuid4().hex[:8]}",
        "TOPIC": topic_name,
    }
    log_path = tmp_path / "example.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(example)], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env
        )

    def total() -> tuple[int, int]:
        try:
            with engine.connect() as c:
                return tuple(c.execute(sa.text("SELECT COUNT(*), SUM(amount) FROM payments")).one())  # type: ignore[return-value]
        except sa.exc.DBAPIError:
            return (0, 0)  # not created yet

    try:
        wait_until(lambda: total()[0] >= 40 or proc.poll() is not None, 60, "the example to apply 40 payments")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert total() == (40, sum(range(40))), "each payment once; the copy dropped"
    finally:
        proc.kill()
        proc.wait(10)
        with engine.begin() as c:
            c.execute(sa.text("DROP TABLE IF EXISTS payments"))
