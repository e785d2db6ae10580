"""Configuration: goharvest's reaper.yaml loads unchanged; bad values are named; secrets never shown."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pyharvest import Config, Limits
from pyharvest.core.config.durations import parse_duration
from pyharvest.core.config.settings import ReaperConfig, mask_data_source
from pyharvest.core.engine.harvest import HarvestEngine
from pyharvest.errors import ConfigError

GOHARVEST_YAML = """
harvest:
  baseKafkaConfig:
    bootstrap.servers: localhost:9092
  producerKafkaConfig:
    compression.type: lz4
    delivery.timeout.ms: 10000
  leaderTopic: my-app-name
  leaderGroupID: my-app-name
  dataSource: host=localhost port=5432 user=postgres password= dbname=postgres sslmode=disable
  outboxTable: outbox
  limits:
    minPollInterval: 1s
    heartbeatTimeout: 5s
    maxInFlightRecords: 1000
    minMetricsInterval: 5s
    sendConcurrency: 4
    sendBuffer: 10
logging:
  level: Debug
"""


@pytest.fixture
def load(tmp_path):
    """Read YAML text as ``reaper -f`` reads its file (:meth:`ReaperConfig.load`)."""

    def read(text: str) -> ReaperConfig:
        path = tmp_path / "reaper.yaml"
        path.write_text(text)
        return ReaperConfig.load(str(path))

    return read


def test_goharvest_reaper_yaml_loads_unchanged(load):
    rc = load(GOHARVEST_YAML)
    c = rc.harvest.resolve()
    assert c.base_kafka_config == {"bootstrap.servers": "localhost:9092"}
    assert c.producer_kafka_config == {"compression.type": "lz4", "delivery.timeout.ms": 10000}
    assert (c.leader_topic, c.leader_group_id, c.outbox_table) == ("my-app-name", "my-app-name", "outbox")
    assert c.limits.min_poll_interval == 1.0
    assert c.limits.heartbeat_timeout == 5.0
    assert c.limits.max_in_flight_records == 1000
    assert c.limits.send_concurrency == 4
    assert rc.logging.numeric_level == 10


def test_defaults_follow_goharvest():
    c = Config(data_source="sqlite://").resolve()
    lim = c.limits
    assert lim.io_error_backoff == 0.5
    assert lim.poll_duration == 0.001
    assert lim.min_poll_interval == 0.1
    assert lim.heartbeat_timeout == 5.0
    assert lim.max_poll_interval == 2.5  # heartbeatTimeout / 2
    assert lim.queue_timeout == 30.0
    assert lim.drain_interval == 2.5  # min(maxPollInterval, queueTimeout)
    assert lim.mark_backoff == 0.01
    # The two deliberate departures from goharvest (1000 and 100): see docs/performance.md.
    assert lim.max_in_flight_records == 4000
    assert lim.mark_query_records == 1000
    assert lim.min_metrics_interval == 5.0
    assert c.base_kafka_config["bootstrap.servers"] == "localhost:9092"
    assert c.leader_topic == f"{c.leader_group_id}.neli"
    assert c.outbox_table == "outbox"


def test_binding_key_is_accepted(load):
    rc = load("harvest:\n  dataSource: sqlite:///x.db\n  binding: sqlite\n")
    assert rc.harvest.binding == "sqlite"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1s", 1.0), ("500ms", 0.5), ("1m30s", 90.0), ("2h", 7200.0), ("100us", 1e-4), ("0", 0.0), (0, 0.0), ("1.5s", 1.5)],
)
def test_durations(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("yaml_text", "field", "hint"),
    [
        ("harvest:\n  limits:\n    minPollInterval: fast\n", "harvest.limits.minPollInterval", "not a duration"),
        ("harvest:\n  limits:\n    maxInFlightRecords: 0\n", "limits.maxInFlightRecords", "at least 1"),
        ("harvest:\n  limits:\n    maxInFlightRecords: lots\n", "harvest.limits.maxInFlightRecords", "whole number"),
        ("harvest:\n  limits:\n    maxInflightRecords: 5\n", "harvest.limits.maxInflightRecords", "unknown key"),
        ("harvest:\n  outboxTabel: x\n", "harvest.outboxTabel", "unknown key"),
        ("harvest:\n  baseKafkaConfig: localhost:9092\n", "harvest.baseKafkaConfig", "mapping"),
        ("harvest:\n  leaderTopic: 'bad topic!'\n", "leaderTopic", "not a valid Kafka topic"),
        ("logging:\n  level: Chatty\nharvest: {}\n", "logging.level", "expected one of"),
        ("other: 1\n", "other", "unknown top-level"),
        ("logging: {}\n", "harvest", "missing section"),
        ("harvest: [\n", "", "not valid YAML"),
    ],
)
def test_errors_name_the_field_and_the_expected_form(yaml_text, field, hint, load):
    with pytest.raises(ConfigError) as info:
        load(yaml_text).harvest.resolve()
    assert field in str(info.value)
    assert hint in str(info.value)


@pytest.mark.parametrize(
    ("yaml_text", "errors"),
    [
        # The case: a bad metrics: and no harvest: says both, in that order.
        ("metrics:\n  port: abc\n", ["metrics.port: expected a TCP port", "harvest: missing section"]),
        ("metrics:\n  port: abc\nharvest:\n  shards: 0\nlogging:\n  level: loud\n",
         ["metrics.port:", "harvest.shards: expected a whole number from 1", "logging.level: expected one of"]),
        ("logging:\n  level: loud\nharvest:\n  outboxTabel: x\n", ["logging.level:", "harvest.outboxTabel: unknown key"]),
        ("harvest:\n  outboxTabel: x\nmetrics:\n  prot: 1\n", ["harvest.outboxTabel:", "metrics.prot: unknown key"]),
    ],
)
def test_every_sections_error_is_reported_in_the_files_order(tmp_path, yaml_text, errors):
    from pyharvest.envconfig import load_reaper_config
    from tests.helpers.cli import assert_one_line_error, reaper

    path = tmp_path / "reaper.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_reaper_config(str(path), {})
    message = str(info.value)
    places = [message.find(e) for e in errors]
    assert -1 not in places and places == sorted(places), message
    assert message.startswith(errors[0]) and info.value.field == errors[0].split(":")[0]
    run = reaper("-f", str(path))  # as reaper reports it: one line, every error
    assert_one_line_error(run, f"invalid configuration: {errors[0]}", *errors[1:])


def test_a_file_with_one_error_reports_it_alone(load):
    with pytest.raises(ConfigError) as info:
        load("logging:\n  level: loud\nharvest: {}\n")
    assert "also" not in str(info.value) and info.value.field == "logging.level"


def test_secrets_never_appear_in_repr():
    c = Config(
        base_kafka_config={"bootstrap.servers": "b:9094", "sasl.password": "alice-secret", "ssl.key.password": "kp",
                           "sasl.oauthbearer.config": "clientSecret=oauth-secret"},
        data_source="postgresql+psycopg://app:hunter2@db/app",
    ).resolve()
    text = repr(c) + str(c)
    for secret in ("alice-secret", "kp'", "hunter2", "oauth-secret"):
        assert secret not in text
    assert "b:9094" in text


@pytest.mark.parametrize(
    ("source", "secret"),
    [
        ("host=db port=5432 user=app password=s3cret dbname=app", "s3cret"),
        ("host=db password='with space' dbname=app", "with space"),
        ("mysql+pymysql://root:pw@127.0.0.1/test", ":pw@"),
        ("mssql+pymssql://sa:Str0ng!@host/db?password=x", "Str0ng"),
    ],
)
def test_data_source_masking(source, secret):
    assert secret not in mask_data_source(source)


def test_limits_from_python_are_validated():
    with pytest.raises(ConfigError, match="limits.heartbeatTimeout"):
        Limits(heartbeat_timeout=0).resolve()
    with pytest.raises(ConfigError, match="limits.maxPollInterval"):
        Limits(min_poll_interval=1.0, max_poll_interval=0.5).resolve()


@pytest.mark.parametrize(
    ("yaml_text", "field", "shown"),
    [
        ("harvest:\n  limits:\n    heartbeatTimeout: 5000\n", "harvest.limits.heartbeatTimeout", "5000"),
        ("harvest:\n  limits:\n    queueTimeout: 1.5\n", "harvest.limits.queueTimeout", "1.5"),
        ("harvest:\n  limits:\n    markBackoff: '10'\n", "harvest.limits.markBackoff", "10"),
    ],
)
def test_a_duration_without_a_unit_is_refused_naming_the_key(yaml_text, field, shown, load):
    with pytest.raises(ConfigError) as info:
        load(yaml_text)
    message = str(info.value)
    assert message.startswith(f"{field}: {shown} has no unit")
    assert f"'{shown}ms'" in message and f"'{shown}s'" in message


def test_a_zero_duration_needs_no_unit(load):
    limits = load("harvest:\n  limits:\n    markBackoff: 0\n    ioErrorBackoff: '0'\n").harvest.limits
    assert (limits.mark_backoff, limits.io_error_backoff) == (0.0, 0.0)


def test_inbox_and_metrics_durations_need_a_unit_too():
    from pyharvest.bindings.ops.config import OpsConfig
    from pyharvest.inbox import InboxFile

    with pytest.raises(ConfigError, match=r"^inbox\.limits\.maxBatchDuration: 100 has no unit"):
        InboxFile.from_mapping({"inbox": {"limits": {"maxBatchDuration": 100}}})
    with pytest.raises(ConfigError, match=r"^metrics\.backlogInterval: 30 has no unit"):
        OpsConfig.from_mapping({"backlogInterval": 30})


@pytest.mark.parametrize(
    ("yaml_text", "suggestion"),
    [
        ("harvest:\n  leaderGroupId: x\n", "did you mean 'leaderGroupID'?"),
        ("harvest:\n  leader_group_id: x\n", "did you mean 'leaderGroupID'?"),
        ("harvest:\n  outboxTabel: x\n", "did you mean 'outboxTable'?"),
        ("harvest:\n  limits:\n    maxInflightRecords: 5\n", "did you mean 'maxInFlightRecords'?"),
        ("harvset: {}\n", "did you mean 'harvest'?"),
        ("logging:\n  levle: Info\nharvest: {}\n", "did you mean 'level'?"),
    ],
)
def test_a_near_miss_key_gets_a_suggestion(yaml_text, suggestion, load):
    with pytest.raises(ConfigError, match=re.escape(suggestion)):
        load(yaml_text)


def test_a_key_like_no_other_gets_no_suggestion(load):
    with pytest.raises(ConfigError) as info:
        load("harvest:\n  frobnicate: 1\n")
    assert "did you mean" not in str(info.value) and "expected one of" in str(info.value)


# ---------------------------------------------------------------- types, at construction


@pytest.mark.parametrize(
    ("build", "field", "says"),
    [
        (lambda: Config(base_kafka_config="localhost:9092"), "base_kafka_config", "mapping of Kafka properties"),
        (lambda: Config(producer_kafka_config=["acks=all"]), "producer_kafka_config", "mapping of Kafka properties"),
        (lambda: Config(identity_headers="no"), "identity_headers", "True or False"),
        (lambda: Config(outbox_table=None), "outbox_table", "a string"),
        (lambda: Config(shards="2"), "shards", "whole number"),
        (lambda: Config(limits=5), "limits", "a Limits"),
        (lambda: Config(limits={"heartbeat_timout": 5}), "limits.heartbeat_timout", "did you mean 'heartbeat_timeout'"),
        (lambda: Limits(heartbeat_timeout="soon"), "limits.heartbeat_timeout", "not a duration"),
        (lambda: Limits(heartbeat_timeout="5"), "limits.heartbeat_timeout", "has no unit"),
        (lambda: Limits(heartbeat_timeout=[5]), "limits.heartbeat_timeout", "expected seconds"),
        (lambda: Limits(max_in_flight_records=1.5), "limits.max_in_flight_records", "whole number"),
    ],
)
def test_a_wrong_type_is_refused_where_it_is_written(build, field: str, says: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as refused:
        build()
    assert str(refused.value).startswith(f"{field}: ") and says in str(refused.value)


def test_limits_take_a_mapping_and_duration_strings() -> None:
    assert Limits(heartbeat_timeout="5s", queue_timeout="1m30s").heartbeat_timeout == 5.0
    assert Limits(queue_timeout="1m30s").queue_timeout == 90.0
    by_attribute = Config(limits={"heartbeat_timeout": 5, "max_in_flight_records": 10}).resolve().limits
    by_yaml_key = Config(limits={"heartbeatTimeout": "5s", "maxInFlightRecords": 10}).resolve().limits
    assert by_attribute == by_yaml_key and by_attribute.heartbeat_timeout == 5.0
    assert Config(base_kafka_config=None).base_kafka_config == {}


def test_repr_never_raises() -> None:
    config = Config(data_source="postgresql://u:secret@h/db")
    config.base_kafka_config = "set wrong after construction"  # type: ignore[assignment]
    config.limits = None  # type: ignore[assignment]
    assert "secret" not in repr(config) and repr(config).startswith("Config(")
    assert "secret" not in str(Config(data_source="postgresql://u:secret@h/db"))


def test_a_config_is_resolved_once_and_the_engines_take_that_form():
    from pyharvest.core.config.settings import ResolvedConfig
    from pyharvest.core.engine.sharded import ShardedHarvestEngine
    from tests.helpers.fakes import FakeBinding, FakeKafka

    resolved = Config(leader_topic="app.neli", leader_group_id="app", data_source="fake://").resolve()
    assert isinstance(resolved, ResolvedConfig) and resolved.resolve() is resolved
    assert resolved.limits.max_in_flight_records is not None  # the defaults are filled in
    engine = HarvestEngine(resolved, binding=FakeBinding(), kafka=FakeKafka())
    assert engine.config is resolved
    sharded = ShardedHarvestEngine(dataclasses.replace(resolved, shards=2), binding=FakeBinding, kafka=FakeKafka())
    assert isinstance(sharded.config, ResolvedConfig) and sharded.config.shards == 2


def test_a_copy_of_a_resolved_config_is_checked_again():
    resolved = Config(leader_topic="app.neli", leader_group_id="app", data_source="fake://").resolve()
    with pytest.raises(ConfigError, match="shards"):
        dataclasses.replace(resolved, shards=0)
    # A copy built from unresolved parts is filled in, never left half-resolved.
    copy = dataclasses.replace(resolved, limits=Limits())
    assert copy.limits.max_in_flight_records == resolved.limits.max_in_flight_records
