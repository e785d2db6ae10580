"""``-f reaper.yaml`` (or ``inbox.yaml``) for the maintenance commands: the connection and the
table come from the file, environment overrides applied, so no password is on the command
line. Each runs the real ``reaper`` command against a live database."""

from __future__ import annotations

import os
import subprocess

import pytest
import sqlalchemy as sa

from benchmarks.children import python_module
from pyharvest import OutboxRecord
from pyharvest.bindings.sql import create_binding
from pyharvest.core.ports.database import QuarantineEntry
from tests.helpers.outbox import stash_all


def reaper(*args: str, env: dict[str, str] | None = None, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*python_module("pyharvest"), *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}, cwd=cwd,
    )


def tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return {t.lower() for t in sa.inspect(engine).get_table_names()}
    finally:
        engine.dispose()


def test_init_db_and_quarantine_take_the_outbox_from_the_file(tmp_path, database_url, table_name):
    cfg = tmp_path / "reaper.yaml"
    # The file names no data source: it comes from the environment, as a password would.
    cfg.write_text(f"harvest:\n  outboxTable: {table_name}\n  poisonPolicy: quarantine\n")
    env = {"PYHARVEST_HARVEST__DATA_SOURCE": database_url}
    created = reaper("init-db", "-f", str(cfg), env=env)
    assert created.returncode == 0, created.stderr
    assert f"outbox table {table_name!r} is ready" in created.stdout
    # poisonPolicy: quarantine in the file also creates the quarantine table.
    assert {table_name.lower(), f"{table_name}_quarantine".lower()} <= tables(database_url)

    stash_all(database_url, table_name, [OutboxRecord("t", "k", "v")])
    binding = create_binding(database_url, table_name, quarantine=True)
    try:
        binding.quarantine([QuarantineEntry(binding.mark("leader", 10)[0], "MSG_SIZE_TOO_LARGE: too big", 3)])
    finally:
        binding.dispose()

    listed = reaper("quarantine", "list", "-f", str(cfg), env=env)
    assert listed.returncode == 0, listed.stderr
    assert f"1 quarantined key(s) in outbox {table_name!r}" in listed.stdout and "too big" in listed.stdout
    replayed = reaper("quarantine", "replay", "-f", str(cfg), "--key", "k", env=env)
    assert replayed.returncode == 0, replayed.stderr
    assert "no quarantined keys" in reaper("quarantine", "list", "-f", str(cfg), env=env).stdout


def test_a_flag_beside_the_file_overrides_it(tmp_path, database_url, table_name):
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(f"harvest:\n  dataSource: {database_url}\n  outboxTable: not_this_one\n")
    created = reaper("init-db", "-f", str(cfg), "--table", table_name)
    assert created.returncode == 0, created.stderr
    assert table_name.lower() in tables(database_url) and "not_this_one" not in tables(database_url)
    missing = reaper("quarantine", "list", "-f", str(cfg))
    assert missing.returncode == 1 and "not_this_one" in missing.stderr


def test_the_file_or_the_flags_are_required():
    result = reaper("quarantine", "list")
    assert result.returncode == 2
    assert "-f reaper.yaml" in result.stderr and "--data-source" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_file_without_a_harvest_section_is_a_one_line_error(tmp_path):
    cfg = tmp_path / "inbox.yaml"
    cfg.write_text("inbox: {}\n")
    result = reaper("init-db", "-f", str(cfg))
    assert result.returncode == 2 and "no 'harvest:' section" in result.stderr


def test_inbox_dead_letters_take_the_data_source_from_the_environment(tmp_path, database_url):
    cfg = tmp_path / "inbox.yaml"
    cfg.write_text(
        "inbox:\n  baseKafkaConfig:\n    bootstrap.servers: 127.0.0.1:9\n  groupID: billing\n  topics: [payments]\n"
        "  dataSource: postgresql+psycopg://nobody:wrong@127.0.0.1:1/none\n"
    )
    env = {"PYHARVEST_INBOX__DATA_SOURCE": database_url}
    assert reaper("inbox", "-f", str(cfg), "--init-db", env=env).returncode == 0
    listed = reaper("inbox", "-f", str(cfg), "--dead-letters", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "0 stored message(s)" in listed.stdout
    replayed = reaper("inbox", "-f", str(cfg), "--replay", env=env)
    assert replayed.returncode == 0 and "nothing is stored in group 'billing'" in replayed.stdout
    # A key (or topic) that matches nothing is most likely mistyped: said so, and a failure.
    missed = reaper("inbox", "-f", str(cfg), "--replay", "--key", "nosuchkey", env=env)
    assert missed.returncode == 1 and "Traceback" not in missed.stderr
    assert "nothing is stored for key 'nosuchkey' in group 'billing'" in missed.stderr
    assert "replay requested" not in missed.stdout


@pytest.mark.kafka
def test_verify_takes_kafka_from_the_file(tmp_path, kafka_bootstrap, topic_name):
    from confluent_kafka import Producer

    from tests.helpers.topics import create_topic

    create_topic(kafka_bootstrap, topic_name, partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(3):
        producer.produce(topic_name, f"m{i}", "k")
    assert producer.flush(30) == 0
    expected = tmp_path / "expected.jsonl"
    expected.write_text("".join(f'{{"key": "k", "id": "m{i}"}}\n' for i in range(3)))
    cfg = tmp_path / "reaper.yaml"
    cfg.write_text(f"harvest:\n  baseKafkaConfig:\n    bootstrap.servers: {kafka_bootstrap}\n")
    result = reaper("verify", "-f", str(cfg), "--topic", topic_name, "--expected", str(expected), "--timeout", "30")
    assert result.returncode == 0, result.stdout + result.stderr
