"""Database roles with only the grants ``reaper schema --grants`` prints, on PostgreSQL and
MariaDB with real roles: the stasher stashes, the reaper harvests (sharded, quarantining a
poison record), the inbox applies (dead-lettering one message), each as a role of its own;
``init-db`` (the test's administrator, the tables' owner) does every piece of DDL. With any one
privilege taken away, the component fails at start (the stasher at its first stash) with an
error naming the privilege, the table and the ``GRANT`` that gives it.

SQL Server's and Oracle's statements are compiled and asserted in ``tests/test_grants_compiled.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from pyharvest import Config, Harvest, Limits, OutboxRecord, stasher
from pyharvest.bindings.sql import create_outbox_table
from pyharvest.bindings.sql.component_grants import Grant, component_grants
from pyharvest.errors import MissingGrantError
from pyharvest.inbox import Inbox, InboxConfig, InboxTables
from pyharvest.plugins.api import OutboxTable, grant_statements, load_dialect, parse_table_name
from tests.helpers.least_privilege import login_role, printed
from tests.helpers.topics import create_topic, read_topic, values_per_key
from tests.helpers.waiting import wait_until

ROLES = ("postgresql", "mysql")


@pytest.fixture
def roles_dialect(dialect: str) -> str:
    if dialect not in ROLES:
        pytest.skip(f"roles are proven on PostgreSQL and MariaDB; {dialect}'s grants are compiled")
    return dialect


def stash(url: str, table: str, records: list[OutboxRecord]) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as tx:
            for r in records:
                stasher.Stasher(table).stash(tx, r)
    finally:
        engine.dispose()


def rows(admin_url: str, table: str) -> int:
    engine = sa.create_engine(admin_url)
    try:
        with engine.connect() as c:
            return int(c.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.kafka
def test_stasher_reaper_and_inbox_work_with_exactly_the_printed_grants(
    roles_dialect: str, database_url: str, table_name: str, kafka_bootstrap: str
) -> None:
    dialect, admin = roles_dialect, database_url
    create_outbox_table(admin, table_name, quarantine=True, shards=2)  # init-db, as the tables' owner
    topic = f"grants-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, partitions=2)
    records = [OutboxRecord(topic, f"key-{n % 5}", f"v{n}".encode()) for n in range(30)]
    poison = OutboxRecord(topic, "poison", b"x" * 5000)  # larger than the producer's message.max.bytes
    tag = uuid.uuid4().hex[:8]
    inbox_tables = InboxTables.build(f"ibx_cp_{tag}", f"ibx_dd_{tag}", f"ibx_dl_{tag}")
    inbox_tables.create(sa.create_engine(admin))

    with login_role(admin, dialect, printed(dialect, table_name, "stasher")) as stasher_url:
        stash(stasher_url, table_name, [*records[:10], poison, *records[10:]])

    with login_role(admin, dialect, printed(dialect, table_name, "reaper", policy="quarantine", shards=2)) as reaper_url:
        config = Config(
            base_kafka_config={"bootstrap.servers": kafka_bootstrap}, producer_kafka_config={"message.max.bytes": 2000},
            leader_group_id=f"grants-{tag}", data_source=reaper_url, outbox_table=table_name, shards=2,
            poison_policy="quarantine", limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05,
                                                      max_delivery_attempts=1),
        )
        with Harvest(config):
            wait_until(lambda: rows(admin, table_name) == 1 and rows(admin, f"{table_name}_quarantine") == 1, 120,
                       "every record but the poison one published, the poison one quarantined")
    got = values_per_key(read_topic(kafka_bootstrap, topic, expect=len(records)))
    for key in {r.key for r in records}:
        assert list(got[key]) == [r.value for r in records if r.key == key]

    def inbox_grants(grantee: str) -> list[str]:
        return [s for g in inbox_tables.grants()
                for s in grant_statements(load_dialect(dialect), g.table, g.privileges, grantee, serial_id=g.serial_id)]

    with login_role(admin, dialect, inbox_grants) as inbox_url:
        applied: list[bytes] = []

        def handler(tx: object, message: object) -> None:
            if message.value == b"v7":  # type: ignore[attr-defined]
                raise ValueError("refused by the handler")  # parked in the dead-letter table
            applied.append(message.value)  # type: ignore[attr-defined]

        config_ = InboxConfig(
            base_kafka_config={"bootstrap.servers": kafka_bootstrap}, group_id=f"grants-{tag}", topics=[topic],
            data_source=inbox_url, checkpoint_table=inbox_tables.checkpoint.name, dedupe_table=inbox_tables.dedupe.name,
            dead_letter_table=inbox_tables.dead_letter.name, create_tables=False, error_policy="dead-letter",
        )
        with Inbox(config_, handler):
            wait_until(lambda: rows(admin, inbox_tables.dead_letter.name) >= 2 and len(applied) >= 24, 120,
                       "the inbox to apply every message but key-2's, parked behind v7")
    engine = sa.create_engine(admin)
    with engine.begin() as c:
        for t in (inbox_tables.checkpoint, inbox_tables.dedupe, inbox_tables.dead_letter):
            c.execute(sa.text(f"DROP TABLE {t.name}"))
    engine.dispose()


# (component, privilege, which table) — every privilege the printed grants hold, one at a time.
REAPER_CASES = [("SELECT", "outbox"), ("UPDATE", "outbox"), ("DELETE", "outbox"), ("INSERT", "outbox"),
                ("SELECT", "quarantine"), ("INSERT", "quarantine")]


def all_but(dialect: str, grants: list[Grant], privilege: str, table: sa.Table) -> Callable[[str], list[str]]:
    def statements(grantee: str) -> list[str]:
        out: list[str] = []
        for g in grants:
            kept = tuple(p for p in g.privileges if not (g.table is table and p == privilege))
            out += grant_statements(load_dialect(dialect), g.table, kept, grantee, serial_id=g.serial_id)
        return out

    assert any(g.table is table and privilege in g.privileges for g in grants), (privilege, table.name)
    return statements


@pytest.mark.parametrize(("privilege", "which"), REAPER_CASES, ids=lambda v: str(v))
def test_a_reaper_missing_any_one_grant_fails_at_start_naming_it(
    roles_dialect: str, database_url: str, table_name: str, privilege: str, which: str
) -> None:
    dialect, admin = roles_dialect, database_url
    create_outbox_table(admin, table_name, quarantine=True, shards=2)
    outbox = OutboxTable.build(parse_table_name(table_name), key_hash=True)
    grants = component_grants("reaper", outbox, quarantine=True, shards=2)
    table = grants[0].table if which == "outbox" else grants[1].table
    with login_role(admin, dialect, all_but(dialect, grants, privilege, table)) as url:
        config = Config(base_kafka_config={"bootstrap.servers": "127.0.0.1:1"}, data_source=url,
                        outbox_table=table_name, shards=2, poison_policy="quarantine")
        with pytest.raises(MissingGrantError) as refused:
            Harvest(config).start()
    error = refused.value
    assert (error.privilege, error.table) == (privilege, table.name)
    text = str(error)
    assert f"GRANT {privilege} ON" in text and "--grants reaper" in text
    assert sa.make_url(url).password not in text


def test_a_stasher_without_insert_fails_at_its_first_stash_naming_it(
    roles_dialect: str, database_url: str, table_name: str
) -> None:
    create_outbox_table(database_url, table_name)
    outbox = OutboxTable.build(parse_table_name(table_name))

    def select_only(grantee: str) -> list[str]:  # MariaDB lets a user without any privilege in a database not even connect
        return grant_statements(load_dialect(roles_dialect), outbox.table, ("SELECT",), grantee)

    with login_role(database_url, roles_dialect, select_only) as url, pytest.raises(MissingGrantError) as refused:
        stash(url, table_name, [OutboxRecord("t", "k", b"v")])
    assert (refused.value.privilege, refused.value.table) == ("INSERT", table_name)
    assert f"GRANT INSERT ON {table_name}" in str(refused.value) and "--grants stasher" in str(refused.value)


INBOX_CASES = [(p, t) for t, ps in (("checkpoint", ("SELECT", "INSERT", "UPDATE")), ("dedupe", ("SELECT", "INSERT", "DELETE")),
                                    ("dead_letter", ("SELECT", "INSERT", "UPDATE", "DELETE"))) for p in ps]


@pytest.mark.parametrize(("privilege", "which"), INBOX_CASES, ids=lambda v: str(v))
def test_an_inbox_missing_any_one_grant_fails_at_start_naming_it(
    roles_dialect: str, database_url: str, privilege: str, which: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    tables = InboxTables.build(f"ibx_cp_{tag}", f"ibx_dd_{tag}", f"ibx_dl_{tag}")
    engine = sa.create_engine(database_url)
    tables.create(engine)
    table = getattr(tables, which)
    try:
        with login_role(database_url, roles_dialect, all_but(roles_dialect, tables.grants(), privilege, table)) as url:
            config = InboxConfig(
                base_kafka_config={"bootstrap.servers": "127.0.0.1:1"}, group_id="g", topics=["t"], data_source=url,
                checkpoint_table=tables.checkpoint.name, dedupe_table=tables.dedupe.name,
                dead_letter_table=tables.dead_letter.name, create_tables=False,
            )
            inbox = Inbox(config, lambda tx, m: None).start()
            with pytest.raises(MissingGrantError) as refused:
                inbox.join(60)
            inbox.stop()
    finally:
        with engine.begin() as c:
            for t in (tables.checkpoint, tables.dedupe, tables.dead_letter):
                c.execute(sa.text(f"DROP TABLE {t.name}"))
        engine.dispose()
    assert (refused.value.privilege, refused.value.table) == (privilege, table.name)
    assert "--grants inbox" in str(refused.value)
