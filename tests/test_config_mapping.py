"""The YAML conventions the harvester's and the inbox's configurations share (pyharvest.core.config_mapping)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pytest

from pyharvest.core.config import Config, Limits
from pyharvest.core.config_mapping import (
    config_to_mapping,
    limits_from_mapping,
    limits_to_mapping,
    masked_repr,
    yaml_items,
    yaml_key,
)
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


def test_every_field_has_the_key_the_documentation_gives():
    keys = {yaml_key(f.name) for cls in (Config, Limits, InboxConfig, InboxLimits) for f in fields(cls)}
    assert {"leaderGroupID", "groupID", "baseKafkaConfig", "producerKafkaConfig", "deadLetterTable"} <= keys
    assert not any("Id" in k or "_" in k for k in keys)


@dataclass(slots=True)
class _Section:
    wait: float | None = None
    count: int | None = None

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


def test_yaml_items_names_each_key_and_skips_nulls():
    items = list(yaml_items({"groupID": "g", "dataSource": None, "topics": ["t"]}, _Settings, "inbox"))
    assert items == [("group_id", "inbox.groupID", "g"), ("topics", "inbox.topics", ["t"])]


def test_yaml_items_refuses_an_unknown_key_listing_the_known_ones():
    expected = r"^x\.groupId: unknown key; expected one of: baseKafkaConfig, dataSource, groupID, limits, topics$"
    with pytest.raises(ConfigError, match=expected):
        list(yaml_items({"groupId": "g"}, _Settings, "x"))


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
