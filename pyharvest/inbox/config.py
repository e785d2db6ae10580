"""Inbox configuration: the ``inbox:`` section of a YAML file, or built in Python.

The conventions are the harvester's (:mod:`pyharvest.core.config.settings`): camelCase YAML keys,
Go durations (``100ms``, ``2s``), snake_case attributes in seconds, and a
:class:`~pyharvest.core.errors.ConfigError` naming the offending field.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pyharvest.core.config.mapping import (
    ValueReader,
    config_to_mapping,
    limits_from_mapping,
    limits_to_mapping,
    masked_repr,
    read_bool,
    read_kafka_properties,
    read_whole_number,
    section_from_mapping,
    yaml_key,
)
from pyharvest.core.config.settings import LoggingConfig
from pyharvest.core.config.yaml_files import check_file_sections, file_sections, read_yaml_file
from pyharvest.core.errors import ConfigError
from pyharvest.plugins.api import parse_table_name

__all__ = ["ERROR_POLICIES", "InboxConfig", "InboxFile", "InboxLimits", "ResolvedInboxConfig"]

#: ``stop``: a failing handler stops the consumer, nothing is skipped.
#: ``dead-letter``: the message is stored with its error, later messages of its key are parked.
ERROR_POLICIES = ("stop", "dead-letter")

_KAFKA_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# Properties the inbox owns: offsets come from the database, so Kafka must not move them.
_OWNED_KAFKA_KEYS = ("group.id", "enable.auto.commit", "enable.auto.offset.store")


@dataclass(slots=True)
class InboxLimits:
    """Sizing and timing. ``None`` means the default (see :meth:`resolve`); durations in seconds."""

    #: Most messages applied in one database transaction.
    max_batch_size: int | None = None
    #: Longest a transaction stays open gathering messages before it commits.
    max_batch_duration: float | None = None
    #: How long an idle consumer waits for messages per poll (also bounds shutdown latency).
    poll_duration: float | None = None
    #: Pause after a database or broker error before resynchronising from the checkpoints.
    io_error_backoff: float | None = None
    #: How often the owner of a partition looks for dead letters an operator asked to replay.
    replay_poll_interval: float | None = None
    #: Prune the dedupe table after this many commits (per consumer).
    prune_every_commits: int | None = None

    _INTS = ("max_batch_size", "prune_every_commits")

    def resolve(self) -> InboxLimits:
        r = dataclasses.replace(self)
        r.max_batch_size = 1000 if r.max_batch_size is None else r.max_batch_size
        r.max_batch_duration = 0.1 if r.max_batch_duration is None else r.max_batch_duration
        r.poll_duration = 0.1 if r.poll_duration is None else r.poll_duration
        r.io_error_backoff = 1.0 if r.io_error_backoff is None else r.io_error_backoff
        r.replay_poll_interval = 1.0 if r.replay_poll_interval is None else r.replay_poll_interval
        r.prune_every_commits = 100 if r.prune_every_commits is None else r.prune_every_commits
        for name in self._INTS:
            v = getattr(r, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"inbox.limits.{yaml_key(name)}", f"expected a whole number of at least 1, got {v!r}")
        for f in fields(r):
            if f.name in self._INTS:
                continue
            v = getattr(r, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise ConfigError(f"inbox.limits.{yaml_key(f.name)}", f"expected a positive duration, got {v!r}")
        return r

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, prefix: str = "inbox.limits") -> InboxLimits:
        return limits_from_mapping(cls, data, prefix, cls._INTS)

    def to_mapping(self) -> dict[str, object]:
        return limits_to_mapping(self, self._INTS)


def _read_topics(value: object, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(where, f"expected a list of topic names, got {value!r}")
    return list(value)


# Every field not named here is read as a string.
_INBOX_READERS: dict[str, ValueReader] = {
    "base_kafka_config": read_kafka_properties,
    "topics": _read_topics,
    "create_tables": read_bool,
    "dedupe_window": read_whole_number,
    "limits": InboxLimits.from_mapping,
}


@dataclass(slots=True)
class InboxConfig:
    """What an inbox consumer needs.

    ``group_id`` names the consumer group and scopes every row the inbox writes (two inboxes
    with different groups apply the same messages independently). ``topics`` are subscribed.
    ``data_source``/``binding`` are as for the harvester. The three tables are created when
    missing unless ``create_tables`` is false.
    """

    base_kafka_config: dict[str, object] = field(default_factory=dict)
    group_id: str = ""
    topics: list[str] = field(default_factory=list)
    data_source: str = ""
    binding: str | None = None
    checkpoint_table: str = "pyharvest_inbox_checkpoint"
    dedupe_table: str = "pyharvest_inbox_dedupe"
    dead_letter_table: str = "pyharvest_inbox_dead_letter"
    create_tables: bool = True
    error_policy: str = "stop"
    #: Remember applied (outbox, record id) identities for this many offsets per partition.
    dedupe_window: int = 100_000
    limits: InboxLimits = field(default_factory=InboxLimits)

    def resolve(self) -> ResolvedInboxConfig:
        """A validated copy with defaults filled in; raises :class:`ConfigError`. One that is
        resolved already is returned as it is (resolved once, where the inbox is configured)."""
        if isinstance(self, ResolvedInboxConfig):
            return self
        return ResolvedInboxConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    def _fill_in(self) -> None:
        """Fill in the defaults and validate, in place (a :class:`ResolvedInboxConfig` being built)."""
        c = self
        c.limits, c.topics = c.limits.resolve(), list(c.topics or [])
        if not isinstance(c.base_kafka_config, Mapping) or not all(isinstance(k, str) for k in c.base_kafka_config):
            raise ConfigError(
                "inbox.baseKafkaConfig", f"expected a mapping of Kafka properties, got {c.base_kafka_config!r}"
            )
        c.base_kafka_config = dict(c.base_kafka_config)
        if "bootstrap.servers" not in c.base_kafka_config:
            raise ConfigError("inbox.baseKafkaConfig", "needs 'bootstrap.servers'")
        owned = [k for k in _OWNED_KAFKA_KEYS if k in c.base_kafka_config]
        if owned:
            raise ConfigError(
                f"inbox.baseKafkaConfig.{owned[0]}",
                "is set by the inbox (offsets live in the database); use groupID for the group",
            )
        if not isinstance(c.group_id, str) or not _KAFKA_NAME.fullmatch(c.group_id):
            raise ConfigError("inbox.groupID", f"expected 1-249 characters from [a-zA-Z0-9._-], got {c.group_id!r}")
        if not c.topics:
            raise ConfigError("inbox.topics", "expected a list of one or more topic names")
        for t in c.topics:
            if not isinstance(t, str) or not _KAFKA_NAME.fullmatch(t):
                raise ConfigError("inbox.topics", f"{t!r} is not a valid Kafka topic name")
        if not isinstance(c.data_source, str) or not c.data_source.strip():
            raise ConfigError("inbox.dataSource", "expected a SQLAlchemy URL (or a libpq key=value string)")
        if c.binding is not None and (not isinstance(c.binding, str) or not c.binding):
            raise ConfigError("inbox.binding", f"expected the name of a dialect, got {c.binding!r}")
        names = {}
        for fname in ("checkpoint_table", "dedupe_table", "dead_letter_table"):
            try:
                names[fname] = parse_table_name(getattr(c, fname))
            except ConfigError as e:
                raise ConfigError(f"inbox.{yaml_key(fname)}", e.problem) from None
        if len(set(names.values())) != len(names):
            raise ConfigError("inbox.deadLetterTable", "checkpoint, dedupe and dead-letter tables must differ")
        if not isinstance(c.create_tables, bool):
            raise ConfigError("inbox.createTables", f"expected true or false, got {c.create_tables!r}")
        if c.error_policy not in ERROR_POLICIES:
            raise ConfigError(
                "inbox.errorPolicy", f"expected one of {', '.join(ERROR_POLICIES)}, got {c.error_policy!r}"
            )
        if isinstance(c.dedupe_window, bool) or not isinstance(c.dedupe_window, int) or c.dedupe_window < 1:
            raise ConfigError(
                "inbox.dedupeWindow", f"expected a whole number of offsets of at least 1, got {c.dedupe_window!r}"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], prefix: str = "inbox") -> InboxConfig:
        """Build from camelCase keys (the ``inbox:`` section)."""
        return section_from_mapping(cls, data, prefix, _INBOX_READERS)

    def to_mapping(self, mask_secrets: bool = True) -> dict[str, object]:
        return config_to_mapping(self, mask_secrets)


# eq=False and repr=False keep InboxConfig's own.
@dataclass(slots=True, repr=False, eq=False)
class ResolvedInboxConfig(InboxConfig):
    """An :class:`InboxConfig` with every default filled in and validated: what the inbox's
    runner takes. ``dataclasses.replace`` of one validates the copy again."""

    def __post_init__(self) -> None:
        self._fill_in()

    # Never let a password reach a log line through repr() or str().
    __repr__ = __str__ = masked_repr


@dataclass(slots=True)
class InboxFile:
    """A YAML file holding an ``inbox:`` section and optionally ``logging:``. A ``harvest:``
    (and ``metrics:``) section may sit beside them, so one file can serve ``reaper -f`` and
    ``reaper inbox -f``; the inbox ignores them."""

    inbox: InboxConfig
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> InboxFile:
        data = file_sections(data, "inbox")
        # Both sections checked, in the file's order, their errors reported together.
        check_file_sections(
            {k: v for k, v in data.items() if k != "inbox" or v}, {"inbox": InboxConfig.from_mapping,
                                                                  "logging": LoggingConfig.from_mapping}, "inbox"
        )
        return cls(InboxConfig.from_mapping(data["inbox"]), LoggingConfig.from_mapping(data.get("logging")))

    @classmethod
    def load(cls, path: str) -> InboxFile:
        return cls.from_mapping(read_yaml_file(path))
