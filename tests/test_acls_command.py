"""``reaper acls`` and the ACL descriptions behind it, without a broker: which ACLs each mode
needs, the principal a client's settings log in as, and the commands' shape. That each
printed ACL is needed and enough is proven on the secured broker (tests/test_kafka_acls.py,
tests/test_kafka_acl_refusals.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from pyharvest import Config
from pyharvest._cli import main as reaper
from pyharvest.core.config.kafka_acls import (
    describe_principal,
    harvest_acls,
    is_authorization_failure,
    principal_of,
    refused,
)

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


def doc_tables(heading: str) -> dict[str, list[tuple[str, ...]]]:
    """The tables of a section of docs/operations.md, by the bold title above each: its rows."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    section = text.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
    tables: dict[str, list[tuple[str, ...]]] = {}
    title = ""
    for line in section.splitlines():
        if line.startswith("**"):
            title = line.split("**")[1]
        elif line.startswith("| ") and not line.startswith("| resource") and not line.startswith("| component"):
            tables.setdefault(title, []).append(tuple(c.strip() for c in line.strip("|").split("|")))
    return tables


def test_the_documented_acl_tables_are_what_reaper_acls_prints() -> None:
    from pyharvest.core.config.kafka_acls import inbox_acls, verify_acls

    def rows(acls: list) -> list[tuple[str, str]]:
        return [(a.resource.replace("-", " "), ", ".join(a.operations)) for a in acls]

    def config(**harvest: object) -> Config:
        return Config.from_mapping({"baseKafkaConfig": SASL, "leaderGroupID": "g", **harvest}).resolve()

    tables = {title.split(" (")[0].rstrip(","): [(r[0], r[2]) for r in table]
              for title, table in doc_tables("Kafka ACLs").items()}
    plain = harvest_acls(config(), ["t"])
    assert tables["At least once"] == rows(plain)
    exactly_once = harvest_acls(config(delivery="exactly-once"), ["t"])
    assert tables["Exactly once"] == rows([a for a in exactly_once if a not in plain])
    consumer = rows(harvest_acls(config(groupProtocol="consumer"), ["t"]))
    assert consumer[0] == ("group", "Read, " + tables["`groupProtocol: consumer`"][0][1])
    assert tables["The inbox"] == rows(inbox_acls("g", ["t"]))
    assert tables["`reaper verify`"] == rows(verify_acls("t"))


def test_the_documented_grants_table_is_what_reaper_schema_prints() -> None:
    from pyharvest.bindings.sql.component_grants import component_grants
    from pyharvest.inbox import InboxConfig, InboxTables
    from pyharvest.plugins.api import OutboxTable, parse_table_name

    documented = [(r[0], r[2]) for r in doc_tables("Database grants")[""]]
    outbox = OutboxTable.build(parse_table_name("outbox"), key_hash=True)
    reaper_grants = component_grants("reaper", outbox, quarantine=True, shards=2)
    names = InboxConfig()
    inbox = InboxTables.build(names.checkpoint_table, names.dedupe_table, names.dead_letter_table).grants()
    assert documented == [
        ("reaper", "SELECT, UPDATE, DELETE"),
        ("reaper, `shards` > 1", "INSERT"),
        ("reaper, `poisonPolicy: quarantine`", ", ".join(reaper_grants[1].privileges)),
        ("stasher", ", ".join(component_grants("stasher", outbox)[0].privileges)),
        *(("inbox", ", ".join(g.privileges)) for g in inbox),
        ("`reaper verify`", "—"),
    ]
    assert reaper_grants[0].privileges == ("SELECT", "UPDATE", "DELETE", "INSERT")
    assert component_grants("reaper", outbox)[0].privileges == ("SELECT", "UPDATE", "DELETE")
    assert component_grants("verify", outbox) == []
