"""The YAML conventions the harvester's and the inbox's configurations share (pyharvest.core.config.mapping)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

import pytest

from pyharvest.core.config.mapping import (
    config_to_mapping,
    limits_from_mapping,
    limits_to_mapping,
    masked_repr,
    read_bool,
    read_duration,
    read_kafka_properties,
    read_str,
    read_whole_number,
    section_from_mapping,
    yaml_key,
)
from pyharvest.core.config.settings import Config, Limits
from pyharvest.core.errors import ConfigError
from pyharvest.inbox.config import InboxConfig, InboxLimits


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("limits", "limits"),
        ("data_source", "dataSource"),
        ("io_error_backoff", "ioErrorBackoff"),
        ("leader_group_id", "leaderGroupID"),
        ("group_id", "groupID"),
        ("identity_headers", "identityHeaders"),  # 'id' only as a whole word
        ("max_in_flight_records", "maxInFlightRecords"),
    ],
)
def test_yaml_key_is_camel_case_with_gos_id(name, key):
    assert yaml_key(name) == key


def test_the_configurations_keys_spell_id_as_go_does():
    keys = {yaml_key(f.name) for cls in (Config, Limits, InboxConfig, InboxLimits) for f in fields(cls)}
    assert {"leaderGroupID", "groupID", "baseKafkaConfig", "producerKafkaConfig", "deadLetterTable"} <= keys
    assert not any("Id" in k or "_" in k for k in keys)


@dataclass(slots=True)
class _Section:
    wait: float | None = None
    count: int | None = None

    @classmethod
    def from_mapping(cls, data: object, prefix: str) -> _Section:
        return limits_from_mapping(cls, data, prefix, ("count",))

    def to_mapping(self) -> dict[str, object]:
        return limits_to_mapping(self, ("count",))


@dataclass(slots=True)
class _Settings:
    base_kafka_config: dict[str, object] = field(default_factory=dict)
    data_source: str = ""
    topics: list[str] = field(default_factory=list)
    group_id: str = ""
    limits: _Section = field(default_factory=_Section)

    def to_mapping(self, mask_secrets: bool = True) -> dict[str, object]:
        return config_to_mapping(self, mask_secrets)

    __repr__ = __str__ = masked_repr


_READERS = {"base_kafka_config": read_kafka_properties, "limits": _Section.from_mapping}


def test_a_section_is_read_through_each_fields_reader_strings_by_default():
    settings = section_from_mapping(
        _Settings,
        {"groupID": "g", "dataSource": None, "baseKafkaConfig": {"acks": 1}, "limits": {"wait": "2s"}},
        "inbox",
        _READERS,
    )
    assert settings == _Settings(base_kafka_config={"acks": 1}, group_id="g", limits=_Section(wait=2.0))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1], r"^x: expected a mapping, got list$"),
        (
            {"groupId": "g"},
            r"^x\.groupId: unknown key; did you mean 'groupID'\? expected one of: baseKafkaConfig, dataSource, groupID, "
            r"limits, topics$",
        ),
        ({"groupID": 7}, r"^x\.groupID: expected a string, got 7$"),
        ({"baseKafkaConfig": "acks=1"}, r"^x\.baseKafkaConfig: expected a mapping of Kafka properties, got 'acks=1'$"),
        ({"limits": {"count": "many"}}, r"^x\.limits\.count: expected a whole number, got 'many'$"),
    ],
)
def test_a_section_error_names_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        section_from_mapping(_Settings, data, "x", _READERS)


@pytest.mark.parametrize(
    ("reader", "good", "bad", "message"),
    [
        (read_str, "a", 1, "expected a string, got 1"),
        (read_bool, False, "no", "expected true or false, got 'no'"),
        (read_whole_number, 3, True, "expected a whole number, got True"),
        (read_whole_number, 3, 3.0, "expected a whole number, got 3.0"),
        (read_duration, 0, "1 s", "'1 s' is not a duration"),
        (read_duration, 0, 1.5, "1.5 has no unit"),
        (read_kafka_properties, {"a": 1}, ["a"], "expected a mapping of Kafka properties, got ['a']"),
    ],
)
def test_readers_accept_their_kind_and_name_the_key_otherwise(reader, good, bad, message):
    assert reader(good, "s.k") == good
    with pytest.raises(ConfigError, match=f"^s\\.k: {re.escape(message)}"):
        reader(bad, "s.k")


def test_readers_convert_where_yaml_has_another_form():
    assert read_duration("1m30s", "s.k") == 90.0
    properties = {"acks": "all"}
    assert read_kafka_properties(properties, "s.k") is not properties


def test_limits_read_whole_numbers_and_durations_and_write_them_back():
    section = limits_from_mapping(_Section, {"wait": "1m30s", "count": 3}, "s", ("count",))
    assert (section.wait, section.count) == (90.0, 3)
    assert limits_to_mapping(section, ("count",)) == {"wait": "90s", "count": 3}
    assert limits_to_mapping(_Section(), ("count",)) == {}
    assert limits_from_mapping(_Section, None, "s", ("count",)) == _Section()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (3, r"^s: expected a mapping, got 3$"),
        ({"count": 1.5}, r"^s\.count: expected a whole number, got 1\.5$"),
        ({"count": True}, r"^s\.count: expected a whole number, got True$"),
        ({"wait": "soon"}, r"^s\.wait: 'soon' is not a duration"),
        ({"other": 1}, r"^s\.other: unknown key; expected one of: count, wait$"),
    ],
)
def test_limits_errors_name_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        limits_from_mapping(_Section, data, "s", ("count",))


def test_to_mapping_masks_secrets_and_copies_containers():
    settings = _Settings(
        base_kafka_config={"bootstrap.servers": "k:9092", "sasl.password": "pw"},
        data_source="postgresql://app:s3cret@db/app",
        topics=["a"],
        group_id="g",
        limits=_Section(wait=0.5),
    )
    masked = settings.to_mapping()
    assert masked == {
        "baseKafkaConfig": {"bootstrap.servers": "k:9092", "sasl.password": "***"},
        "dataSource": "postgresql://app:***@db/app",
        "topics": ["a"],
        "groupID": "g",
        "limits": {"wait": "500ms"},
    }
    plain = settings.to_mapping(mask_secrets=False)
    assert plain["dataSource"] == "postgresql://app:s3cret@db/app"
    assert plain["baseKafkaConfig"] == settings.base_kafka_config
    assert plain["baseKafkaConfig"] is not settings.base_kafka_config
    assert plain["topics"] is not settings.topics


def test_repr_and_str_show_the_class_and_no_secret():
    settings = _Settings(base_kafka_config={"sasl.password": "pw"}, data_source="postgresql://app:s3cret@db/app")
    for shown in (repr(settings), str(settings), f"{settings}"):
        assert shown.startswith("_Settings({'baseKafkaConfig'")
        assert "s3cret" not in shown and "pw" not in shown


def test_one_file_may_hold_every_commands_section():
    from pyharvest.core.config.yaml_files import file_sections

    data = {"harvest": {}, "inbox": {}, "logging": {}, "metrics": {}}
    assert file_sections(data, "inbox") is data
    with pytest.raises(ConfigError, match=r"^spark: unknown top-level section; expected 'harvest' and optionally"):
        file_sections({"spark": {}}, "harvest")
    with pytest.raises(ConfigError, match=r"^the configuration file must hold a mapping with an 'inbox:' section$"):
        file_sections("inbox", "inbox")
