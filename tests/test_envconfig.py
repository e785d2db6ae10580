"""Configuration from the environment: PYHARVEST_<SECTION>__<KEY>... overrides reaper.yaml."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks.children import python_module
from pyharvest.core.config.settings import ReaperConfig
from pyharvest.core.errors import ConfigError
from pyharvest.envconfig import apply_env_overrides, env_overrides, load_reaper_config, parse_value

FILE = {
    "harvest": {
        "baseKafkaConfig": {"bootstrap.servers": "file:9092", "sasl.password": "from-file"},
        "leaderGroupID": "billing",
        "limits": {"maxInFlightRecords": 10, "heartbeatTimeout": "5s"},
    },
    "logging": {"level": "Info"},
}


def test_overrides_camel_case_keys_either_spelling():
    for name in ("MAXINFLIGHTRECORDS", "MAX_IN_FLIGHT_RECORDS", "maxInFlightRecords"):
        out = apply_env_overrides(FILE, {f"PYHARVEST_HARVEST__LIMITS__{name}": "500"})
        assert out["harvest"]["limits"] == {"maxInFlightRecords": 500, "heartbeatTimeout": "5s"}
    cfg = ReaperConfig.from_mapping(
        apply_env_overrides(FILE, {"PYHARVEST_HARVEST__LIMITS__HEARTBEATTIMEOUT": "2s",
                                   "PYHARVEST_HARVEST__LEADERGROUPID": "billing-eu"})
    )
    assert cfg.harvest.limits.heartbeat_timeout == 2.0
    assert cfg.harvest.leader_group_id == "billing-eu"  # leaderGroupID, matched case-insensitively


def test_the_file_mapping_is_not_modified():
    before = yaml.safe_dump(FILE)
    apply_env_overrides(FILE, {"PYHARVEST_HARVEST__LIMITS__MAXINFLIGHTRECORDS": "1"})
    assert yaml.safe_dump(FILE) == before


def test_kafka_properties_take_dots_for_single_underscores():
    env = {
        "PYHARVEST_HARVEST__BASEKAFKACONFIG__BOOTSTRAP_SERVERS": "kafka-0:9092,kafka-1:9092",
        "PYHARVEST_HARVEST__BASEKAFKACONFIG__SASL_PASSWORD": "0123",
        "PYHARVEST_HARVEST__BASEKAFKACONFIG__SSL_CA_LOCATION": "/etc/ssl/ca.pem",
        "PYHARVEST_HARVEST__PRODUCERKAFKACONFIG__COMPRESSION_TYPE": "lz4",
        "PYHARVEST_HARVEST__PRODUCERKAFKACONFIG__DELIVERY_TIMEOUT_MS": "20000",
        "PYHARVEST_HARVEST__PRODUCERKAFKACONFIG__SOME__UNDERSCORED_NAME": "x",
    }
    out = apply_env_overrides(FILE, env)["harvest"]
    assert out["baseKafkaConfig"] == {
        "bootstrap.servers": "kafka-0:9092,kafka-1:9092",
        "sasl.password": "0123",  # a string, exactly as given: not the octal number 83
        "ssl.ca.location": "/etc/ssl/ca.pem",
    }
    assert out["producerKafkaConfig"] == {
        "compression.type": "lz4",
        "delivery.timeout.ms": 20000,
        "some_underscored.name": "x",
    }


def test_an_empty_value_unsets_a_key():
    env = {
        "PYHARVEST_HARVEST__BASEKAFKACONFIG__SASL_PASSWORD": "",
        "PYHARVEST_HARVEST__LIMITS__MAXINFLIGHTRECORDS": "",
    }
    out = apply_env_overrides(FILE, env)["harvest"]
    assert out["baseKafkaConfig"] == {"bootstrap.servers": "file:9092"}
    cfg = ReaperConfig.from_mapping(apply_env_overrides(FILE, env))
    assert cfg.harvest.resolve().limits.max_in_flight_records == 4000  # back to the default


def test_sections_are_created_when_missing():
    out = apply_env_overrides(None, {"PYHARVEST_HARVEST__DATASOURCE": "sqlite:///x.db",
                                     "PYHARVEST_METRICS__PORT": "9433",
                                     "PYHARVEST_METRICS__BACKLOGINTERVAL": "30s",
                                     "PYHARVEST_LOGGING__JSON": "true"})
    assert out == {
        "harvest": {"dataSource": "sqlite:///x.db"},
        "metrics": {"port": 9433, "backlogInterval": "30s"},
        "logging": {"json": True},
    }
    cfg = ReaperConfig.from_mapping(out)
    assert cfg.extra["metrics"] == {"port": 9433, "backlogInterval": "30s"} and cfg.logging.json is True


def test_free_form_sections_take_camel_case_from_underscores():
    out = apply_env_overrides({"inbox": {"dataSource": "a"}}, {
        "PYHARVEST_INBOX__DATASOURCE": "b",  # matches the existing key
        "PYHARVEST_INBOX__GROUP_ID": "g",  # a new key: camelCase
    })
    assert out["inbox"] == {"dataSource": "b", "groupId": "g"}


def test_other_pyharvest_variables_are_left_alone():
    env = {"PYHARVEST_TEST_KAFKA": "embedded", "PYHARVEST_REQUIRE_DATABASES": "sqlite", "HOME": "/root"}
    assert env_overrides(env) == []
    assert apply_env_overrides(FILE, env) == FILE


@pytest.mark.parametrize(
    ("variable", "field", "fragment"),
    [
        ("PYHARVEST_HARVST__DATASOURCE", "harvst", "unknown section"),
        ("PYHARVEST_HARVEST__LIMITS__MAXINFLIGHT", "harvest.limits.maxinflight", "unknown key"),
        ("PYHARVEST_HARVEST__LIMITS", "harvest.limits", "names a section"),
        ("PYHARVEST_HARVEST__BASEKAFKACONFIG", "harvest.baseKafkaConfig", "names a section"),
        ("PYHARVEST_HARVEST__DATASOURCE__HOST", "harvest.dataSource", "single value"),
        ("PYHARVEST_HARVEST____DATASOURCE", "harvest", "empty segment"),
    ],
)
def test_variables_that_name_no_key_are_errors(variable, field, fragment):
    with pytest.raises(ConfigError) as e:
        apply_env_overrides(FILE, {variable: "x"})
    assert str(e.value).startswith(field + ":"), str(e.value)
    assert fragment in str(e.value) and variable in str(e.value)


def test_two_variables_for_one_key_are_an_error():
    with pytest.raises(ConfigError, match=r"harvest\.limits\.maxInFlightRecords: set by both"):
        apply_env_overrides(FILE, {"PYHARVEST_HARVEST__LIMITS__MAXINFLIGHTRECORDS": "1",
                                   "PYHARVEST_HARVEST__LIMITS__MAX_IN_FLIGHT_RECORDS": "2"})


def test_override_keys_for_logs_mask_secrets():
    env = {"PYHARVEST_HARVEST__BASEKAFKACONFIG__SASL_PASSWORD": "pw",
           "PYHARVEST_HARVEST__DATASOURCE": "postgresql://app:hunter2@db/app"}
    shown = {o.key: o.masked_value() for o in env_overrides(env)}
    assert shown == {"harvest.baseKafkaConfig[sasl.password]": "***",
                     "harvest.dataSource": "postgresql://app:***@db/app"}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500", 500), ("-3", -3), ("0.5", 0.5), ("true", True), ("False", False), ("", None), ("null", None),
        ("~", None), ("0123", "0123"), ("1_000", "1_000"), ("0x10", "0x10"), ("on", "on"), ("yes", "yes"),
        ("a: b", "a: b"), ("pw # not a comment", "pw # not a comment"), ("'500'", "500"), ('"true"', "true"),
        ("1m30s", "1m30s"), ("localhost:9092", "localhost:9092"), ("2024-01-01", "2024-01-01"), ("[a]", "[a]"),
    ],
)
def test_values_are_yaml_scalars_read_losslessly(text, value):
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_invalid_values_are_reported_against_the_key():
    with pytest.raises(ConfigError, match=r"harvest\.limits\.maxInFlightRecords: expected a whole number, got '0500'"):
        ReaperConfig.from_mapping(apply_env_overrides(FILE, {"PYHARVEST_HARVEST__LIMITS__MAXINFLIGHTRECORDS": "0500"}))


def test_load_reaper_config_reads_the_file_and_applies_the_environment(tmp_path):
    path = tmp_path / "reaper.yaml"
    path.write_text(yaml.safe_dump(FILE))
    cfg = load_reaper_config(str(path), {"PYHARVEST_HARVEST__LIMITS__MAXINFLIGHTRECORDS": "7"})
    assert cfg.harvest.limits.max_in_flight_records == 7
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_reaper_config(str(tmp_path / "missing.yaml"), {})
    bad = tmp_path / "bad.yaml"
    bad.write_text("harvest: [\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_reaper_config(str(bad), {})
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_reaper_config(str(empty), {"PYHARVEST_HARVEST__OUTBOXTABLE": "box"}).harvest.outbox_table == "box"


def test_os_environ_is_the_default(monkeypatch):
    monkeypatch.setenv("PYHARVEST_HARVEST__OUTBOXTABLE", "from_env")
    assert apply_env_overrides({"harvest": {}})["harvest"]["outboxTable"] == "from_env"


# ---------------------------------------------------------------------- through the reaper command

_cli_uses_env = "load_reaper_config" in inspect.getsource(importlib.import_module("pyharvest._cli"))


@pytest.mark.skipif(not _cli_uses_env, reason="pyharvest/_cli.py does not apply environment overrides yet")
def test_print_config_reflects_overrides_and_masks_them(tmp_path):
    path = tmp_path / "reaper.yaml"
    path.write_text(yaml.safe_dump(FILE))
    env = {
        "PATH": "/usr/bin:/bin",
        "PYHARVEST_HARVEST__BASEKAFKACONFIG__BOOTSTRAP_SERVERS": "env:9094",
        "PYHARVEST_HARVEST__BASEKAFKACONFIG__SASL_PASSWORD": "env-secret",
        "PYHARVEST_HARVEST__LIMITS__MAXINFLIGHTRECORDS": "500",
        "PYHARVEST_METRICS__PORT": "9999",
    }
    result = subprocess.run([*python_module("pyharvest"), "-f", str(path), "--print-config"],
                            capture_output=True, text=True, timeout=60, env=env, cwd=Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["harvest"]["baseKafkaConfig"] == {"bootstrap.servers": "env:9094", "sasl.password": "***"}
    assert printed["harvest"]["limits"]["maxInFlightRecords"] == 500
    assert printed["metrics"]["port"] == 9999
    assert "env-secret" not in result.stdout and "from-file" not in result.stdout



def test_the_generated_configuration_reference_covers_every_key(monkeypatch):
    import dataclasses

    from pyharvest.bindings.ops.config import METRICS_KEYS
    from pyharvest.core.config.settings import Config, Limits

    path = Path(__file__).parent.parent / "docs" / "gen_config_reference.py"
    spec = importlib.util.spec_from_file_location("gen_config_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    page = module.render()
    keys = [k for k in Config().to_mapping() if k != "limits"] + list(Limits().resolve().to_mapping())
    keys += [f.name for f in dataclasses.fields(ReaperConfig.from_mapping({"harvest": {}}).logging)]
    keys += list(METRICS_KEYS)
    for key in keys:
        assert f"| `{key}` |" in page, key
    assert "*undocumented*" not in page
    assert "PYHARVEST_HARVEST__LIMITS__MAXINFLIGHTRECORDS" in page
    # The page is stored, so that links to it work outside the built site; it must be current.
    assert module.stored_page_problem() is None, "run python docs/gen_config_reference.py --write"
