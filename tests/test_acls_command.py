"""``reaper acls`` and the ACL descriptions behind it, without a broker: which ACLs each mode
needs, the principal a client's settings log in as, and the commands' shape. That each
printed ACL is needed and enough is proven on the secured broker (tests/test_kafka_acls.py,
tests/test_kafka_acl_refusals.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from pyharvest._cli import main as reaper
from pyharvest.core.acls import describe_principal, harvest_acls, is_authorization_failure, principal_of, refused
from pyharvest.core.config import Config

SASL = {"bootstrap.servers": "kafka:9093", "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "svc-outbox", "sasl.password": "s3cr3t"}


def acls_of(**harvest: object) -> list[str]:
    config = Config.from_mapping({"baseKafkaConfig": SASL, "leaderGroupID": "billing", **harvest}).resolve()
    return [a.describe() for a in harvest_acls(config, ["orders"])]


def test_each_mode_needs_its_own_acls_and_no_more() -> None:
    base = ["Read on group 'billing'", "Read, Write, Create on topic 'billing.neli'", "Write on topic 'orders'"]
    assert acls_of() == base
    assert acls_of(shards=4) == base
    assert acls_of(groupProtocol="consumer")[0] == "Read, AlterConfigs on group 'billing'"
    assert acls_of(delivery="exactly-once") == [
        *base[:2],
        "Write on transactional-id 'pyharvest.billing.*'",
        "Read, Write, Create on topic 'billing.progress'",
        base[2],
    ]


@pytest.mark.parametrize(("settings", "principal"), [
    (SASL, "User:svc-outbox"),
    ({**SASL, "sasl.mechanisms": "PLAIN"}, "User:svc-outbox"),
    ({**SASL, "sasl.mechanisms": "OAUTHBEARER"}, None),
    ({**SASL, "sasl.mechanisms": "GSSAPI"}, None),
    ({"security.protocol": "SSL", "ssl.certificate.location": "/etc/client.pem"}, None),
    ({"security.protocol": "SSL"}, "User:ANONYMOUS"),
    ({}, "User:ANONYMOUS"),
])
def test_the_principal_a_client_logs_in_as(settings: dict[str, object], principal: str | None) -> None:
    assert principal_of(settings) == principal
    assert describe_principal(settings).startswith(principal or "the principal the broker maps")


def test_a_refusal_names_the_acl_and_the_principal_never_the_password() -> None:
    config = Config.from_mapping({"baseKafkaConfig": SASL, "leaderGroupID": "billing"}).resolve()
    acl = harvest_acls(config)[0]
    error = refused(SASL, acl, "Broker: Group authorization failed")
    text = str(error)
    assert error.principal == "User:svc-outbox" and error.operations == ("Read",)
    assert "Kafka refused User:svc-outbox Read on group 'billing' (Broker: Group authorization failed)" in text
    assert "kafka-acls.sh --bootstrap-server kafka:9093" in text and "s3cr3t" not in text
    assert is_authorization_failure("TRANSACTIONAL_ID_AUTHORIZATION_FAILED") and not is_authorization_failure("_FATAL")


def run_acls(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = reaper(["acls", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_reaper_acls_prints_runnable_commands_for_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "reaper.yaml"
    path.write_text(yaml.safe_dump({"harvest": {"baseKafkaConfig": SASL, "leaderGroupID": "billing"}}))
    code, out, _ = run_acls(capsys, "-f", str(path), "--topic", "orders", "--topic", "refunds")
    assert code == 0
    commands = [shlex.split(line) for line in out.splitlines() if not line.startswith("#")]
    assert all(c[:6] == ["kafka-acls.sh", "--bootstrap-server", "kafka:9093", "--command-config", "admin.properties",
                         "--add"] for c in commands)
    assert [c[c.index("--topic") + 1] if "--topic" in c else c[-1] for c in commands] == [
        "billing", "billing.neli", "orders", "refunds"]
    assert "s3cr3t" not in out
    # Without --topic, the outbox's topics are a comment saying how to give them.
    code, out, _ = run_acls(capsys, "-f", str(path), "--no-create", "--principal", "User:other")
    assert code == 0 and "--operation Create" not in out and "User:other" in out
    assert "# kafka-acls.sh" in out and "--topic TOPIC" in out and "give --topic NAME" in out


def test_reaper_acls_needs_a_principal_it_can_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "reaper.yaml"
    oauth = {**SASL, "sasl.mechanisms": "OAUTHBEARER"}
    path.write_text(yaml.safe_dump({"harvest": {"baseKafkaConfig": oauth}}))
    code, _, err = run_acls(capsys, "-f", str(path))
    assert code == 2 and "--principal User:NAME" in err
    code, _, err = run_acls(capsys)
    assert code == 2 and "give -f FILE" in err
    code, _, err = run_acls(capsys, "-f", str(path), "--principal", "nobody")
    assert code == 2 and "User:NAME" in err
