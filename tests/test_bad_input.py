"""Bad input: invalid records, hostile configuration, malformed rows, missing tables and
privileges, and secrets in Kafka client settings.

* invalid records are refused at stash time and nothing of the transaction's batch is written;
* a table name or topic smuggling SQL is refused by configuration checks before any SQL runs;
  a hostile *key* is only ever a bound value;
* malformed rows already in a goharvest-layout table are skipped and reported while every
  other key flows;
* a missing table or a role without privileges fails at start-up, naming the reason;
* SASL/TLS settings in ``baseKafkaConfig`` reach every Kafka client unchanged and are masked in
  logs and ``--print-config``.
"""

from __future__ import annotations

import logging
import uuid

import pytest
import sqlalchemy as sa
import yaml

from pyharvest import Config, Harvest, Limits, OutboxRecord, stasher
from pyharvest._cli import main as reaper
from pyharvest.bindings.sql import create_binding, create_outbox_table
from pyharvest.core.errors import BindingError
from pyharvest.core.outbox.records import InvalidRecordError
from pyharvest.errors import ConfigError
from pyharvest.plugins.api import GOHARVEST
from tests.helpers.fakes import FakeBinding, FakeKafka
from tests.helpers.outbox import outbox_count
from tests.helpers.topics import create_topic, read_topic, values_per_key
from tests.helpers.waiting import wait_until

# ---------------------------------------------------------------------- stash time


def _renamed(topic: str) -> OutboxRecord:
    """A record whose topic was reassigned after it was built (which checked the first one)."""
    record = OutboxRecord("t", "k", b"v")
    record.topic = topic
    return record


@pytest.mark.parametrize(
    "record, reason",
    [
        (_renamed("bad topic!"), "not a valid Kafka topic name"),
        (OutboxRecord("t", "", b"v"), "key must be a non-empty string"),
        (OutboxRecord("t", "k", b"v", headers=[("", "x")]), "header #0 key"),
        (OutboxRecord("t", "k", 42), "value must be bytes, str or None"),  # type: ignore[arg-type]
    ],
)
def test_invalid_records_are_refused_and_the_batch_is_not_written(database_url, table_name, record, reason):
    create_outbox_table(database_url, table_name)
    engine = sa.create_engine(database_url)
    try:
        with pytest.raises(InvalidRecordError, match=reason), engine.begin() as conn:
            stasher.Stasher(table_name).prepare(conn).stash_many([OutboxRecord("t", "ok", b"fine"), record])
    finally:
        engine.dispose()
    assert outbox_count(database_url, table_name) == 0


def test_a_row_naming_a_topic_kafka_refuses_is_read_back_for_the_harvester_to_report(database_url, table_name):
    # OutboxRecord refuses such a topic when it is built; a row written around the stasher (by
    # hand, or by goharvest) still reaches the harvester, whose delivery error and poison
    # policy handle it, rather than failing every mark that reads it.
    import uuid

    create_outbox_table(database_url, table_name)
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            stasher.Stasher(table_name).stash(conn, OutboxRecord("t", "k", b"v"))
            conn.execute(sa.text(f"UPDATE {table_name} SET kafka_topic = 'nc bad!'"))
    finally:
        engine.dispose()
    binding = create_binding(database_url, table_name)
    try:
        (record,) = binding.mark(str(uuid.uuid4()), 10)
    finally:
        binding.dispose()
    assert (record.topic, record.key, record.value) == ("nc bad!", "k", b"v")


# ---------------------------------------------------------------------- hostile identifiers


@pytest.mark.parametrize(
    "field, value",
    [
        ("outbox_table", "outbox; DROP TABLE users"),
        ("outbox_table", 'outbox" OR 1=1 --'),
        ("outbox_table", "a.b.c"),
        ("leader_topic", "x'; DROP TABLE users; --"),
        ("leader_group_id", "g OR 1=1"),
    ],
)
def test_sql_in_config_identifiers_never_reaches_the_database(field, value):
    binding = FakeBinding()
    statements: list[str] = []

    def factory():
        statements.append("binding created")
        return binding

    cfg = Config(data_source="postgresql+psycopg://nobody@127.0.0.1:1/x", **{field: value})
    with pytest.raises(ConfigError) as e:
        if field == "outbox_table":
            create_binding(cfg.data_source, value)
        else:
            Harvest(cfg, binding=factory, kafka=FakeKafka()).start()
    assert statements == []
    assert e.value.field in ("outboxTable", "leaderTopic", "leaderGroupID")


def test_hostile_key_is_only_a_bound_value(database_url, table_name, capsys):
    create_outbox_table(database_url, table_name)
    key = "k'); DELETE FROM x; --\""
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        stasher.stash(conn, OutboxRecord("t", key, b"v"), table=table_name)
    engine.dispose()
    code = reaper(["quarantine", "replay", "--data-source", database_url, "--table", table_name, "--key", key])
    assert code == 1 and "is not quarantined" in capsys.readouterr().err
    assert outbox_count(database_url, table_name) == 1


# ---------------------------------------------------------------------- malformed rows


@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_malformed_goharvest_rows_are_skipped_and_reported_without_stalling_other_keys(
    dialect, database_url, table_name, topic_name, kafka_config, kafka_bootstrap
):
    if dialect != "postgresql":
        pytest.skip("the goharvest layout (TEXT[] headers) is PostgreSQL's")
    create_outbox_table(database_url, table_name, layout=GOHARVEST)
    create_topic(kafka_bootstrap, topic_name, partitions=2)
    engine = sa.create_engine(database_url)
    insert = sa.text(
        f"INSERT INTO {table_name} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
        "VALUES (now(), :t, :k, :v, CAST(:hk AS TEXT[]), CAST(:hv AS TEXT[]))"
    )
    rows = []
    for i in range(20):
        rows.append({"t": topic_name, "k": f"good-{i % 4}", "v": f"g{i}", "hk": "{h}", "hv": "{x}"})
        if i % 7 == 3:  # goharvest's layout lets a writer store header arrays of unequal length
            rows.append({"t": topic_name, "k": f"broken-{i}", "v": "bad", "hk": "{a,b}", "hv": "{only-one}"})
    with engine.begin() as conn:
        for r in rows:
            conn.execute(insert, r)
    engine.dispose()
    reported = []
    binding = create_binding(database_url, table_name, on_malformed=reported.append)
    cfg = Config(
        base_kafka_config=dict(kafka_config), leader_group_id=f"malformed-{uuid.uuid4().hex[:8]}",
        data_source=database_url, outbox_table=table_name,
        limits=Limits(heartbeat_timeout=2.0, min_poll_interval=0.05),
    )
    with Harvest(cfg, binding=binding):
        wait_until(lambda: outbox_count(database_url, table_name) == 3, 60, "every good row to be published")
    assert len({e.row_id for e in reported}) == 3  # each malformed row reported (again per leader id)
    assert {e.row_id for e in reported} and all("kafka_header_keys has 2 entries" in str(e) for e in reported)
    got = values_per_key(read_topic(kafka_bootstrap, topic_name, expect=20))
    assert sorted(got) == [f"good-{k}" for k in range(4)]
    assert sum(len(v) for v in got.values()) >= 20


# ---------------------------------------------------------------------- start-up failures


def test_missing_table_fails_at_start_up_with_the_reason(database_url, tmp_path, capsys):
    cfg = Config(data_source=database_url, outbox_table="no_such_outbox", leader_group_id="x",
                 base_kafka_config={"bootstrap.servers": "127.0.0.1:1"})
    h = Harvest(cfg)
    with pytest.raises(BindingError, match="does not exist"):
        h.start()
    path = tmp_path / "reaper.yaml"
    path.write_text(yaml.safe_dump({"harvest": {"dataSource": database_url, "outboxTable": "no_such_outbox",
                                                "baseKafkaConfig": {"bootstrap.servers": "127.0.0.1:1"}}}))
    assert reaper(["-f", str(path)]) == 1
    err = capsys.readouterr().err
    assert "no_such_outbox" in err and "does not exist" in err and "init-db" in err


@pytest.fixture
def unprivileged_role(dialect, database_url):
    if dialect != "postgresql":
        pytest.skip("roles and grants: PostgreSQL covers it")
    role = f"pyh_noprivs_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(database_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
    yield role, sa.make_url(database_url).set(username=role, password=None).render_as_string(hide_password=False)
    with engine.connect() as c:
        c.execute(sa.text(f"DROP OWNED BY {role}"))
        c.execute(sa.text(f"DROP ROLE {role}"))
    engine.dispose()


def test_role_without_privileges_fails_at_start_up_with_the_reason(unprivileged_role, database_url, table_name):
    role, url = unprivileged_role
    create_outbox_table(database_url, table_name)
    with pytest.raises(BindingError, match=r"refused SELECT on .*permission denied.*GRANT SELECT ON"):
        create_binding(url, table_name)
    engine = sa.create_engine(database_url)
    with engine.begin() as c:
        c.execute(sa.text(f"GRANT SELECT ON {table_name} TO {role}"))
    with pytest.raises(BindingError, match=r"refused UPDATE on .*GRANT UPDATE ON .*--grants reaper"):
        create_binding(url, table_name)
    with engine.begin() as c:
        c.execute(sa.text(f"GRANT UPDATE, DELETE ON {table_name} TO {role}"))
    engine.dispose()
    create_binding(url, table_name).dispose()  # enough privileges now
    # The same through a harvester: start() raises, before any Kafka client is made.
    cfg = Config(data_source=url, outbox_table=table_name, poison_policy="quarantine",
                 base_kafka_config={"bootstrap.servers": "127.0.0.1:1"})
    with pytest.raises(BindingError, match="quarantine.*reaper init-db"):
        Harvest(cfg).start()  # may not create the quarantine table: init-db, the owner, does


# ---------------------------------------------------------------------- SASL / TLS pass-through

SECURE = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "SCRAM-SHA-512",
    "sasl.username": "svc-outbox",
    "sasl.password": "s3cr3t-sasl",
    "ssl.ca.location": "/etc/ssl/ca.pem",
    "ssl.key.password": "s3cr3t-key",
    "ssl.keystore.password": "s3cr3t-keystore",
    "sasl.oauthbearer.client.secret": "s3cr3t-oauth",
}
SECRETS = ("s3cr3t-sasl", "s3cr3t-key", "s3cr3t-keystore", "s3cr3t-oauth")


class RecordingKafka(FakeKafka):
    def __init__(self) -> None:
        super().__init__()
        self.configs: dict[str, list[dict]] = {"producer": [], "leader_consumer": [], "ensure_topic": []}

    def producer(self, config):
        self.configs["producer"].append(dict(config))
        return super().producer(config)

    def leader_consumer(self, config):
        self.configs["leader_consumer"].append(dict(config))
        return super().leader_consumer(config)

    def ensure_topic(self, config, topic, partitions=1, timeout=10.0):
        self.configs["ensure_topic"].append(dict(config))
        return super().ensure_topic(config, topic, partitions, timeout)


def test_sasl_and_tls_settings_reach_every_kafka_client_and_are_masked_in_logs(caplog):
    kafka = RecordingKafka()
    cfg = Config(base_kafka_config={"bootstrap.servers": "broker:9093", **SECURE}, leader_group_id="secure",
                 data_source="postgresql+psycopg://app:dbpass@db/app",
                 limits=Limits(heartbeat_timeout=0.5, min_poll_interval=0.01))
    caplog.set_level(logging.DEBUG)
    with Harvest(cfg, binding=FakeBinding(), kafka=kafka) as harvest:
        # Every client created and a heartbeat back: what gets logged at start has been logged.
        wait_until(lambda: all(kafka.configs.values()) and harvest.is_leader and kafka.cluster.heartbeats >= 2, 30,
                   "every client and a leader's heartbeats")
    for client, configs in kafka.configs.items():
        assert configs, f"no {client} was created"
        for c in configs:
            for k, v in SECURE.items():
                assert c.get(k) == v, f"{client} lacks {k}"
    text = caplog.text + repr(cfg) + str(cfg.resolve())
    for secret in (*SECRETS, "dbpass"):
        assert secret not in text, f"{secret!r} leaked into logs"
    assert "sasl.username" in caplog.text and "svc-outbox" in caplog.text  # not a secret: shown


def test_print_config_masks_kafka_and_database_secrets(tmp_path, capsys):
    path = tmp_path / "reaper.yaml"
    path.write_text(yaml.safe_dump({"harvest": {
        "baseKafkaConfig": {"bootstrap.servers": "broker:9093", **SECURE},
        "producerKafkaConfig": {"sasl.password": "s3cr3t-sasl"},
        "dataSource": "host=db port=5432 user=app password=dbpass dbname=app",
    }}))
    assert reaper(["-f", str(path), "--print-config"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)["harvest"]
    assert printed["baseKafkaConfig"]["sasl.password"] == "***"
    assert printed["baseKafkaConfig"]["security.protocol"] == "SASL_SSL"
    for secret in (*SECRETS, "dbpass"):
        assert secret not in out
