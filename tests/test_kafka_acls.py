"""Least privilege on a broker that enforces it (``make kafka-secure``: TLS, SASL/SCRAM,
ACLs with ``allow.everyone.if.no.acl.found=false``).

Each mode runs as a principal holding exactly the ACLs ``reaper acls`` prints for its
configuration (applied as an administrator would run the printed commands), and publishes
everything, in order per key; ``reaper verify`` and the inbox read it back as principals
holding only their own ACLs. ``tests/test_kafka_acl_refusals.py`` takes each ACL away in turn.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from pyharvest import Config, Harvest
from pyharvest._commands.acls import acl_script
from pyharvest.core.config.kafka_acls import inbox_acls, verify_acls
from pyharvest.verify import verify_topic
from tests.helpers.fixtures.secure_kafka import AclEntry, SecureKafka, parse_acl_commands
from tests.helpers.least_privilege import harvest_section, stash_records
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.secure, pytest.mark.kafka]

MODES = {
    "at-least-once": {},
    "exactly-once": {"delivery": "exactly-once"},
    "sharded": {"shards": 3},
    "sharded-exactly-once": {"shards": 2, "delivery": "exactly-once"},
    "group-protocol-consumer": {"groupProtocol": "consumer"},
}


def granted_by_reaper_acls(kafka: SecureKafka, sections: dict[str, object], topics: list[str]) -> list[AclEntry]:
    """The ACLs `reaper acls` prints for ``sections``, granted as its commands would."""
    entries = parse_acl_commands(acl_script(sections, topics=topics))
    kafka.grant(entries)
    return entries


def outbox_rows(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return int(c.execute(sa.text("SELECT COUNT(*) FROM outbox")).scalar_one())
    finally:
        engine.dispose()


def read_back_as_verifier(kafka: SecureKafka, topic: str, expected: list[tuple[str, str]]) -> None:
    """`reaper verify`'s read, as a principal holding only Read on the topic."""
    reader = kafka.user("verify")
    kafka.grant(parse_acl_commands("\n".join(a.command(reader.principal, kafka.bootstrap) for a in verify_acls(topic))))
    config = {k: v for k, v in reader.config.items() if k != "bootstrap.servers"}
    report = verify_topic(kafka.bootstrap, topic, expected, timeout=60, consumer_config=config)
    assert report.ok, report
    assert report.received_count >= len(expected) and report.reorder_count == 0


@pytest.mark.parametrize("mode", list(MODES))
def test_each_mode_publishes_everything_in_order_with_exactly_the_acls_reaper_acls_prints(
    secure_kafka: SecureKafka, tmp_path: Path, mode: str
) -> None:
    user = secure_kafka.user("harvest")
    topic = secure_kafka.create_topic(f"acl-{mode}-{uuid.uuid4().hex[:8]}", partitions=2)
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    section = harvest_section(user, url, f"acl-{uuid.uuid4().hex[:8]}", **MODES[mode])
    entries = granted_by_reaper_acls(secure_kafka, {"harvest": section}, [topic])
    assert {e.principal for e in entries} == {user.principal}
    expected = stash_records(url, topic, int(MODES[mode].get("shards", 1)))

    config = Config.from_mapping(section)
    with Harvest(config) as harvest:
        wait_until(lambda: outbox_rows(url) == 0, 120, "the outbox to drain")
        harvest.stop()
    read_back_as_verifier(secure_kafka, topic, expected)


def test_reaper_acls_prints_the_inbox_acls_and_an_inbox_consumes_with_only_those(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    from pyharvest.inbox import Inbox, InboxConfig

    topic = secure_kafka.create_topic(f"acl-inbox-{uuid.uuid4().hex[:8]}", partitions=2)
    producer = Producer(dict(secure_kafka.admin_config))
    sent = [(f"key-{n % 4}", f"v{n}") for n in range(40)]
    for key, value in sent:
        producer.produce(topic, value.encode(), key.encode())
    assert producer.flush(30) == 0

    user = secure_kafka.user("inbox")
    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    section = {"baseKafkaConfig": dict(user.config), "groupID": f"inbox-{uuid.uuid4().hex[:8]}", "topics": [topic],
               "dataSource": url}
    script = acl_script({"inbox": section})
    entries = parse_acl_commands(script)
    assert entries == parse_acl_commands("\n".join(
        a.command(user.principal, secure_kafka.bootstrap) for a in inbox_acls(section["groupID"], [topic])))
    secure_kafka.grant(entries)

    applied: list[tuple[str, str]] = []
    config = InboxConfig.from_mapping(section)

    def handler(tx: object, message: object) -> None:
        applied.append((message.key.decode(), message.value.decode()))  # type: ignore[attr-defined]

    with Inbox(config, handler):
        wait_until(lambda: len(applied) >= len(sent), 120, "the inbox to apply every message")
    for key in {k for k, _ in sent}:
        assert [v for k, v in applied if k == key] == [v for k, v in sent if k == key]


def test_reaper_acls_from_a_file_runs_as_kafka_acls_sh(secure_kafka: SecureKafka, tmp_path: Path) -> None:
    """The printed commands, run by Apache Kafka's own kafka-acls.sh, grant what they say."""
    import subprocess

    from tests.helpers.fixtures.secure_kafka import read_properties

    tool = secure_kafka.directory / "bin" / "kafka-acls.sh"
    if not tool.exists():
        pytest.skip(f"no kafka-acls.sh at {tool} (`make kafka-secure` installs it)")
    user = secure_kafka.user("tool")
    path = tmp_path / "reaper.yaml"
    section = harvest_section(user, "sqlite:///x.db", f"tool-{uuid.uuid4().hex[:8]}", delivery="exactly-once")
    path.write_text(yaml.safe_dump({"harvest": section}))
    from benchmarks.children import python_module

    done = subprocess.run(
        [*python_module("pyharvest", "acls", "-f", str(path), "--topic-prefix", "orders."),
         "--command-config", str(secure_kafka.directory / "admin-java.properties")],
        capture_output=True, text=True, timeout=60, check=True,
    )
    commands = [line for line in done.stdout.splitlines() if line.startswith("kafka-acls.sh")]
    for command in commands:
        subprocess.run(command.replace("kafka-acls.sh", str(tool), 1), shell=True, check=True,  # noqa: S602
                       capture_output=True, text=True, timeout=120)
    expected = parse_acl_commands(done.stdout)
    secure_kafka._wait_for_acls(expected, present=True)
    assert read_properties(secure_kafka.directory / "admin.properties")["sasl.username"] == "admin"
