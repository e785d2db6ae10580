"""What the least-privilege tests share: a harvester's section that logs in as a user of the
secured Kafka (``make kafka-secure``), records stashed to be read back in order, and database
roles holding exactly the statements ``reaper schema --grants`` prints."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator

import sqlalchemy as sa

from pyharvest import OutboxRecord, stasher
from pyharvest._commands.schema import SchemaTarget, grants_of
from pyharvest.bindings.sql import create_outbox_table
from tests.helpers.fixtures.secure_kafka import SecureUser

#: stash_records' keys and records per key.
KEYS, PER_KEY = 8, 15


def harvest_section(user: SecureUser, url: str, group: str, **mode: object) -> dict[str, object]:
    return {
        "baseKafkaConfig": dict(user.config), "leaderGroupID": group, "dataSource": url,
        "limits": {"heartbeatTimeout": "2s", "minPollInterval": "50ms"}, **mode,
    }


def stash_records(url: str, topic: str, shards: int = 1) -> list[tuple[str, str]]:
    """KEYS x PER_KEY records, interleaved over keys; the (key, value) pairs in stash order."""
    create_outbox_table(url, shards=shards)
    engine = sa.create_engine(url)
    expected = []
    with engine.begin() as tx:
        for n in range(PER_KEY):
            for k in range(KEYS):
                key, value = f"key-{k}", f"key-{k}:{n}"
                stasher.stash(tx, OutboxRecord(topic, key, value.encode()))
                expected.append((key, value))
    engine.dispose()
    return expected


@contextlib.contextmanager
def login_role(admin_url: str, dialect: str, grants: Callable[[str], list[str]]) -> Iterator[str]:
    """A new login role with a password, holding the ``grants(grantee)`` statements; dropped
    afterwards. Yields its URL."""
    name = f"pyh_{uuid.uuid4().hex[:10]}"
    password = f"pw-{uuid.uuid4().hex[:12]}"
    grantee = f"{name}@%" if dialect == "mysql" else name
    engine = sa.create_engine(admin_url)
    create, drop = (
        (f"CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'", [f"DROP USER '{name}'@'%'"])
        if dialect == "mysql"
        else (f"CREATE ROLE {name} LOGIN PASSWORD '{password}'", [f"DROP OWNED BY {name}", f"DROP ROLE {name}"])
    )
    try:
        with engine.begin() as c:
            c.execute(sa.text(create))
            for statement in grants(grantee):
                c.execute(sa.text(statement))
        yield sa.make_url(admin_url).set(username=name, password=password).render_as_string(hide_password=False)
    finally:
        with engine.begin() as c:
            for statement in drop:
                c.execute(sa.text(statement))
        engine.dispose()


def script_without_comments(script: str) -> list[str]:
    lines = [line for line in script.splitlines() if line and not line.startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def printed(dialect: str, table: str, component: str, **how: object) -> Callable[[str], list[str]]:
    """The statements `reaper schema --grants COMPONENT --role GRANTEE` prints."""
    target = SchemaTarget(dialect, table, str(how.get("policy", "block")), int(how.get("shards", 1)), None)
    return lambda grantee: script_without_comments(grants_of(target, component, grantee))
