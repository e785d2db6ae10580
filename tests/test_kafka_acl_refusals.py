"""Each ACL ``reaper acls`` prints is needed: with any one taken away, the harvester (the inbox,
``reaper verify``) fails at start or at its first use of it, with an error naming the operation
to grant, the resource and the principal, and never loops on a retriable-looking error.

The ACLs are those of ``tests/test_kafka_acls.py``'s runs, on the secured broker
(``make kafka-secure``); each case is a principal holding all of them but one.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

import pytest

from pyharvest import Config, Harvest
from pyharvest._commands.acls import acl_script
from pyharvest.errors import KafkaAuthorizationError
from pyharvest.events import DeliveryFailed
from tests.helpers.fixtures.secure_kafka import AclEntry, SecureKafka, parse_acl_commands
from tests.helpers.least_privilege import harvest_section, stash_records

pytestmark = [pytest.mark.secure, pytest.mark.kafka]

HARVEST_MODES = {
    "at-least-once": {},
    "sharded": {"shards": 2},
    "exactly-once": {"delivery": "exactly-once"},
    "group-protocol-consumer": {"groupProtocol": "consumer"},
}
# (mode, the ACL taken away: operation and which resource) — every entry each mode's ACLs hold.
HARVEST_CASES = [
    *((mode, op, "leader group") for mode in HARVEST_MODES for op in ("Read",)),
    *((mode, op, "leader topic") for mode in ("at-least-once", "sharded") for op in ("Read", "Write", "Create")),
    ("at-least-once", "Write", "outbox topic"),
    ("exactly-once", "Write", "outbox topic"),
    ("exactly-once", "Write", "transactional ids"),
    *(("exactly-once", op, "progress topic") for op in ("Read", "Write", "Create")),
    ("group-protocol-consumer", "AlterConfigs", "leader group"),
]


def role_of(entry: AclEntry, section: dict[str, object], topic: str) -> str:
    group = str(section["leaderGroupID"])
    if entry.resource == "--group":
        return "leader group"
    if entry.resource == "--transactional-id":
        return "transactional ids"
    return {f"{group}.neli": "leader topic", f"{group}.progress": "progress topic", topic: "outbox topic"}[entry.name]


def start_until_refused(config: Config, timeout: float = 90.0) -> tuple[KafkaAuthorizationError | None, list[object]]:
    """Run the harvester until it fails (its error) or, refusing nothing at start, until a
    delivery fails (the events)."""
    events: list[object] = []
    harvest = Harvest(config, on_event=events.append)
    try:
        harvest.start()
    except KafkaAuthorizationError as e:
        return e, events
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if harvest.join(0.2):
                return None, events
            if any(isinstance(e, DeliveryFailed) for e in events):
                return None, events
        raise AssertionError(f"the harvester neither failed nor reported a failed delivery within {timeout:g}s")
    except KafkaAuthorizationError as e:
        return e, events
    finally:
        harvest.stop()
        with contextlib.suppress(KafkaAuthorizationError):
            harvest.join(60)


@pytest.mark.parametrize(("mode", "operation", "role"), HARVEST_CASES, ids=lambda v: str(v).replace(" ", "-"))
def test_a_harvester_missing_any_one_acl_fails_naming_it_and_the_principal(
    secure_kafka: SecureKafka, tmp_path: Path, mode: str, operation: str, role: str
) -> None:
    user = secure_kafka.user("refused")
    topic = secure_kafka.create_topic(f"refused-{uuid.uuid4().hex[:8]}", partitions=2)
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    section = harvest_section(user, url, f"refused-{uuid.uuid4().hex[:8]}", **HARVEST_MODES[mode])
    entries = parse_acl_commands(acl_script({"harvest": section}, topics=[topic]))
    missing = [e for e in entries if e.operation == operation and role_of(e, section, topic) == role]
    assert len(missing) == 1, f"{mode} holds no {operation} on the {role}: {[str(e) for e in entries]}"
    secure_kafka.grant([e for e in entries if e not in missing])
    stash_records(url, topic, int(HARVEST_MODES[mode].get("shards", 1)))

    error, events = start_until_refused(Config.from_mapping(section))
    if role == "outbox topic":
        # A record whose topic the principal may not write is refused for good: its key waits
        # (poisonPolicy block; quarantine parks it), the others flow, and the hint says what to grant.
        assert error is None
        failed = next(e for e in events if isinstance(e, DeliveryFailed))
        assert not failed.retriable and failed.topic == topic
        assert f"Kafka refuses {user.principal} Write on topic {topic}" in failed.hint
        assert f"--allow-principal {user.principal} --operation Write --topic {topic}" in failed.hint
        return
    assert error is not None, f"no refusal of {operation} on the {role}: {events[-3:]}"
    assert error.principal == user.principal
    assert operation in error.operations
    name = missing[0].name
    assert (error.resource, error.name) == (missing[0].resource[2:], name), str(error)
    text = str(error)
    assert user.principal in text and operation in text and "kafka-acls.sh" in text and user.password not in text


@pytest.mark.parametrize("removed", ["Read on the group", "Read on the topic"])
def test_an_inbox_missing_either_acl_fails_at_its_first_poll_naming_it(
    secure_kafka: SecureKafka, tmp_path: Path, removed: str
) -> None:
    from pyharvest.inbox import Inbox, InboxConfig

    user = secure_kafka.user("inbox-refused")
    topic = secure_kafka.create_topic(f"inbox-refused-{uuid.uuid4().hex[:8]}")
    section = {"baseKafkaConfig": dict(user.config), "groupID": f"inbox-{uuid.uuid4().hex[:8]}", "topics": [topic],
               "dataSource": f"sqlite:///{tmp_path / 'inbox.db'}"}
    entries = parse_acl_commands(acl_script({"inbox": section}))
    assert [str(e) for e in entries] == [f"Read on group {section['groupID']}", f"Read on topic {topic}"]
    kind = "--group" if removed.endswith("group") else "--topic"
    secure_kafka.grant([e for e in entries if e.resource != kind])

    inbox = Inbox(InboxConfig.from_mapping(section), lambda tx, message: None).start()
    try:
        with pytest.raises(KafkaAuthorizationError) as refusal:
            assert inbox.join(60), "the inbox kept running without its ACL"
    finally:
        inbox.stop()
    error = refusal.value
    assert error.principal == user.principal and error.operations == ("Read",)
    assert (error.resource, error.name) == ((kind[2:], section["groupID"] if kind == "--group" else topic))
    assert "kafka-acls.sh" in str(error) and user.password not in str(error)


def test_reaper_verify_without_read_on_the_topic_fails_naming_it(
    secure_kafka: SecureKafka, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from pyharvest._cli import main as reaper

    user = secure_kafka.user("verify-refused")
    topic = secure_kafka.create_topic(f"verify-refused-{uuid.uuid4().hex[:8]}")
    path = tmp_path / "reaper.yaml"
    path.write_text(yaml.safe_dump({"harvest": {"baseKafkaConfig": dict(user.config)}}))
    expected = tmp_path / "expected.jsonl"
    expected.write_text('{"key": "k", "id": "v"}\n')
    started = time.monotonic()
    assert reaper(["verify", "-f", str(path), "--topic", topic, "--expected", str(expected), "--timeout", "60"]) == 1
    err = capsys.readouterr().err
    assert f"Kafka refused {user.principal} Read on topic {topic!r}" in err, err
    assert f"--allow-principal {user.principal} --operation Read --topic {topic}" in err
    assert user.password not in err
    assert time.monotonic() - started < 30, "it waited out its timeout instead of failing at once"


@pytest.mark.parametrize("wrong", ["password", "ca"])
def test_a_refused_login_or_tls_handshake_is_named_at_start(secure_kafka: SecureKafka, tmp_path: Path, wrong: str) -> None:
    from pyharvest.errors import TopicError

    user = secure_kafka.user("login")
    settings = dict(user.config)
    if wrong == "password":
        settings["sasl.password"] = "not-" + user.password
    else:
        settings["ssl.ca.location"] = str(tmp_path / "other-ca.pem")
        (tmp_path / "other-ca.pem").write_text((Path(__file__).parent / "helpers" / "fixtures" / "other_ca.pem").read_text())
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    stash_records(url, "unused")
    with pytest.raises(TopicError) as failed:
        Harvest(Config.from_mapping(harvest_section(user, url, "login") | {"baseKafkaConfig": settings})).start()
    text = str(failed.value)
    if wrong == "password":
        assert f"refused the login of {user.principal}" in text and "sasl.password" in text
        assert user.password not in text
    else:
        assert "TLS handshake" in text and "ssl.ca.location" in text
