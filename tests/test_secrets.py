"""No secret leaves the process: the secured set-up (SASL/SCRAM over TLS, a database role with a
password), ``reaper`` run at debug level with its operations server, and everything it wrote
grepped for the passwords: its log, ``--print-config``, ``reaper acls``, the operations
server's every page (which also never shows a record's value), and the one-line errors of a
wrong password and of a missing grant.

The SASL password comes from the file and the database's from the environment
(``PYHARVEST_HARVEST__DATASOURCE``), the two ways a password reaches ``reaper`` today.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from benchmarks.children import python_module
from pyharvest import OutboxRecord, stasher
from pyharvest._commands.acls import acl_script
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.fixtures.databases import server_url
from tests.helpers.fixtures.secure_kafka import SecureKafka, parse_acl_commands
from tests.helpers.least_privilege import login_role, printed
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.secure, pytest.mark.kafka]

VALUE = f"record-value-{uuid.uuid4().hex}"


@pytest.fixture
def admin_url() -> str:
    return server_url("postgresql")


def leaks(text: str, secrets: list[str]) -> list[str]:
    forms = {s for secret in secrets for s in (secret, urllib.parse.quote(secret), urllib.parse.quote_plus(secret))}
    return sorted(f for f in forms if f in text)


def reaper(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(python_module("pyharvest", *args), env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_no_secret_in_logs_config_acls_ops_pages_or_errors(
    secure_kafka: SecureKafka, admin_url: str, tmp_path: Path
) -> None:
    user = secure_kafka.user("secrets")
    topic = secure_kafka.create_topic(f"secrets-{uuid.uuid4().hex[:8]}")
    table = f"outbox_{uuid.uuid4().hex[:10]}"
    create_outbox_table(admin_url, table)
    harvest = {
        "baseKafkaConfig": dict(user.config), "leaderGroupID": f"secrets-{uuid.uuid4().hex[:8]}", "outboxTable": table,
        "limits": {"heartbeatTimeout": "2s"},
    }
    secure_kafka.grant(parse_acl_commands(acl_script({"harvest": harvest}, topics=[topic])))
    path = tmp_path / "reaper.yaml"
    path.write_text(yaml.safe_dump({"harvest": harvest, "logging": {"level": "Debug"}, "metrics": {"port": 0}}))
    written: list[str] = []

    with login_role(admin_url, "postgresql", printed("postgresql", table, "reaper")) as reaper_url:
        secrets = [user.password, str(sa.make_url(reaper_url).password)]
        env = {**os.environ, "PYHARVEST_HARVEST__DATASOURCE": reaper_url}
        engine = sa.create_engine(admin_url)
        with engine.begin() as tx:
            for n in range(20):
                stasher.Stasher(table).stash(tx, OutboxRecord(topic, f"k{n % 3}", f"{VALUE}-{n}".encode()))
        for args in (["-f", str(path), "--print-config"], ["acls", "-f", str(path), "--topic", topic]):
            done = reaper(*args, env=env)
            assert done.returncode == 0, done.stderr
            written += [done.stdout, done.stderr]
        assert "sasl.password: '***'" in written[0] and user.name in written[2]

        process = subprocess.Popen(python_module("pyharvest", "-f", str(path)), env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)  # type: ignore[arg-type]
        reader.start()
        try:
            def port() -> int | None:
                found = re.search(r"listening on [\d.]+:(\d+)", "".join(lines))
                return int(found.group(1)) if found else None

            wait_until(lambda: port() is not None or process.poll() is not None, 120, "the operations server")
            assert port() is not None, "".join(lines)
            with engine.connect() as c:
                wait_until(lambda: c.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one() == 0, 120,
                           "the outbox to drain")
            pages = []
            for page in ("/", "/metrics", "/healthz", "/readyz", "/nowhere", "/status"):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port()}{page}", timeout=10) as answer:  # noqa: S310
                        pages.append(answer.read().decode())
                except urllib.error.HTTPError as e:
                    pages.append(e.read().decode())
            assert "pyharvest_records_purged_total" in pages[1]
            for text in pages:
                assert VALUE not in text, "an operations page shows a record's value"
            written += pages
        finally:
            process.send_signal(signal.SIGTERM)
            out, _ = process.communicate(timeout=120)
            reader.join(10)
            written += [out, "".join(lines)]
        assert "purged" in written[-1] or "acquired leader status" in written[-1], written[-1][-2000:]

        # A wrong SASL password and a missing grant: each ends reaper with a one-line error.
        wrong = f"wrong-{uuid.uuid4().hex}"
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({"harvest": {**harvest, "baseKafkaConfig": {**user.config,
                                                                                  "sasl.password": wrong}}}))
        done = reaper("-f", str(bad), env=env)
        assert done.returncode == 1 and f"refused the login of {user.principal}" in done.stderr, done.stderr
        written += [done.stdout, done.stderr]
        secrets.append(wrong)
    with login_role(admin_url, "postgresql", lambda grantee: [f"GRANT SELECT ON {table} TO {grantee}"]) as url:
        secrets.append(str(sa.make_url(url).password))
        done = reaper("-f", str(path), env={**os.environ, "PYHARVEST_HARVEST__DATASOURCE": url})
        assert done.returncode == 1 and "GRANT UPDATE ON" in done.stderr, done.stderr
        written += [done.stdout, done.stderr]
    engine.dispose()

    everything = "\n".join(written)
    assert leaks(everything, secrets) == [], "a password reached what reaper wrote"
    assert user.name in everything  # the user name is no secret: shown, so an operator knows who was refused
