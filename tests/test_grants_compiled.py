"""The GRANT statements of each component, compiled for every dialect (SQL Server and Oracle
cannot run here: their statements are asserted as text), ``reaper schema --grants`` with its
sources of the dialect (``--binding``, ``-f``, ``--data-source``), and the start-up probes'
SQL. ``tests/test_grants.py`` proves them with real roles on PostgreSQL and MariaDB."""

from __future__ import annotations

import pytest
import yaml

from pyharvest._cli import main as reaper
from pyharvest.bindings.sql.component_grants import component_grants
from pyharvest.plugins.api import OutboxTable, load_dialect, parse_table_name, privilege_probe

EXPECTED = {
    ("postgresql", "reaper"): [
        "GRANT USAGE ON SCHEMA app TO outbox_reaper;",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON app.outbox TO outbox_reaper;",
        "GRANT SELECT, INSERT ON app.outbox_quarantine TO outbox_reaper;",
    ],
    ("postgresql", "stasher"): ["GRANT USAGE ON SCHEMA app TO outbox_reaper;",
                                "GRANT INSERT ON app.outbox TO outbox_reaper;"],
    ("mysql", "reaper"): [
        "GRANT SELECT, INSERT, UPDATE, DELETE ON app.outbox TO 'outbox_reaper'@'%';",
        "GRANT SELECT, INSERT ON app.outbox_quarantine TO 'outbox_reaper'@'%';",
    ],
    ("mysql", "stasher"): ["GRANT INSERT ON app.outbox TO 'outbox_reaper'@'%';"],
    ("mssql", "reaper"): [
        "GRANT SELECT, INSERT, UPDATE, DELETE ON app.outbox TO outbox_reaper;",
        "GRANT SELECT, INSERT ON app.outbox_quarantine TO outbox_reaper;",
    ],
    ("mssql", "stasher"): ["GRANT INSERT ON app.outbox TO outbox_reaper;"],
    ("oracle", "reaper"): [
        "GRANT SELECT, INSERT, UPDATE, DELETE ON app.outbox TO outbox_reaper;",
        "GRANT SELECT, INSERT ON app.outbox_quarantine TO outbox_reaper;",
    ],
    ("oracle", "stasher"): ["GRANT INSERT ON app.outbox TO outbox_reaper;"],
}


def grants_printed(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert reaper(["schema", *args]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if not line.startswith("--")]


@pytest.mark.parametrize(("dialect", "component"), list(EXPECTED), ids=lambda v: str(v))
def test_grants_of_each_component_compiled_per_dialect(
    capsys: pytest.CaptureFixture[str], dialect: str, component: str
) -> None:
    role = "outbox_reaper@%" if dialect == "mysql" else "outbox_reaper"
    assert grants_printed(capsys, "--binding", dialect, "--table", "app.outbox", "--shards", "4", "--poison-policy",
                          "quarantine", "--grants", component, "--role", role) == EXPECTED[(dialect, component)]


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "mssql", "oracle"])
def test_the_inbox_grants_per_dialect(capsys: pytest.CaptureFixture[str], dialect: str) -> None:
    lines = grants_printed(capsys, "--binding", dialect, "--grants", "inbox", "--role", "billing_inbox")
    tables = [line.split(" ON ")[1].split(" TO ")[0] for line in lines if " ON SEQUENCE " not in line]
    assert tables == ["pyharvest_inbox_checkpoint", "pyharvest_inbox_dedupe", "pyharvest_inbox_dead_letter"]
    assert lines[0].startswith("GRANT SELECT, INSERT, UPDATE ON")
    assert lines[1].startswith("GRANT SELECT, INSERT, DELETE ON")
    assert lines[2].startswith("GRANT SELECT, INSERT, UPDATE, DELETE ON")
    # PostgreSQL's serial id: its sequence too; IDENTITY and AUTO_INCREMENT need nothing more.
    sequence = [line for line in lines if " ON SEQUENCE " in line]
    assert sequence == (["GRANT USAGE ON SEQUENCE pyharvest_inbox_dead_letter_id_seq TO billing_inbox;"]
                        if dialect == "postgresql" else [])


def test_the_plain_harvester_needs_no_insert_and_verify_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert grants_printed(capsys, "--binding", "postgresql", "--grants", "reaper", "--role", "r") == [
        "GRANT SELECT, UPDATE, DELETE ON outbox TO r;"
    ]
    assert reaper(["schema", "--binding", "postgresql", "--grants", "verify", "--role", "r"]) == 0
    assert "reads Kafka only" in capsys.readouterr().out
    assert reaper(["schema", "--binding", "sqlite", "--grants", "reaper", "--role", "r"]) == 0
    assert "no roles or grants" in capsys.readouterr().out


def test_schema_takes_the_dialect_table_and_policy_from_a_file_or_a_data_source(
    capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "reaper.yaml"
    path.write_text(yaml.safe_dump({
        "harvest": {"dataSource": "mysql+pymysql://app:s3cret@db/app", "outboxTable": "billing_outbox",
                    "poisonPolicy": "quarantine", "shards": 3},
        "inbox": {"dataSource": "postgresql+psycopg://inbox:s3cret@db/app", "groupID": "g", "topics": ["t"],
                  "checkpointTable": "cp"},
    }))
    assert grants_printed(capsys, "-f", str(path), "--grants", "reaper", "--role", "r") == [
        "GRANT SELECT, INSERT, UPDATE, DELETE ON billing_outbox TO 'r';",
        "GRANT SELECT, INSERT ON billing_outbox_quarantine TO 'r';",
    ]
    inbox = grants_printed(capsys, "-f", str(path), "--grants", "inbox", "--role", "r")
    assert inbox[0] == "GRANT SELECT, INSERT, UPDATE ON cp TO r;"  # the inbox section's dialect and tables
    # --binding beside -f overrides the file's dialect; the table stays the file's.
    assert grants_printed(capsys, "-f", str(path), "--binding", "oracle", "--grants", "stasher", "--role", "r") == [
        "GRANT INSERT ON billing_outbox TO r;"
    ]
    ddl = "\n".join(grants_printed(capsys, "--data-source", "postgresql+psycopg://app:s3cret@db/app"))
    assert "CREATE TABLE IF NOT EXISTS outbox (" in ddl and "s3cret" not in ddl
    assert "CREATE TABLE IF NOT EXISTS billing_outbox" in grants_printed(capsys, "-f", str(path), "--statements")[0]


def test_schema_without_a_dialect_or_grants_without_a_role_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert reaper(["schema"]) == 2
    assert "--binding" in capsys.readouterr().err
    assert reaper(["schema", "--binding", "postgresql", "--grants", "reaper"]) == 2
    assert "--role" in capsys.readouterr().err


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "mssql", "oracle", "sqlite"])
def test_the_start_up_probes_touch_no_row_on_every_dialect(dialect: str) -> None:
    target = load_dialect(dialect).sqlalchemy_dialect()
    outbox = OutboxTable.build(parse_table_name("outbox"), key_hash=True)
    for grant in component_grants("reaper", outbox, quarantine=True, shards=2):
        for privilege in grant.privileges:
            sql = " ".join(str(privilege_probe(grant.table, privilege).compile(dialect=target)).split())
            assert sql.startswith({"SELECT": "SELECT", "INSERT": "INSERT INTO", "UPDATE": "UPDATE",
                                   "DELETE": "DELETE FROM"}[privilege]), sql
            assert sql.endswith("WHERE 1 = 0"), sql
            if privilege == "INSERT":
                assert "(id," not in sql  # the generated id is left to the database
