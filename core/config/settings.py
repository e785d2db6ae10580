"""Harvester configuration: goharvest's fields and defaults, loaded from Python or YAML.

A goharvest ``reaper.yaml`` loads unchanged: camelCase keys, Go-style durations. Python code
uses snake_case attributes and seconds as floats. :meth:`Config.resolve` fills the defaults
and validates, naming the offending field and the expected form.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from pyharvest.core.config.checks import check_config_types, check_limits_types, limits_keywords
from pyharvest.core.config.choices import Delivery, GroupProtocol, PoisonPolicy
from pyharvest.core.config.durations import format_duration
from pyharvest.core.config.mapping import (
    ValueReader,
    config_to_mapping,
    did_you_mean,
    limits_from_mapping,
    limits_to_mapping,
    masked_repr,
    read_bool,
    read_kafka_properties,
    read_whole_number,
    section_from_mapping,
    yaml_key,
)
from pyharvest.core.config.masking import mask_data_source, mask_kafka_config
from pyharvest.core.config.yaml_files import (
    SectionCheck,
    check_file_sections,
    file_sections,
    read_yaml_file,
    section_errors,
)
from pyharvest.core.errors import ConfigError

__all__ = [
    "Config",
    "Limits",
    "LoggingConfig",
    "ReaperConfig",
    "ResolvedConfig",
    "mask_data_source",
    "mask_kafka_config",
    "resolve_section",
    "sanitise",
]

DEFAULT_DATA_SOURCE = "host=localhost port=5432 user=postgres password= dbname=postgres sslmode=disable"
DEFAULT_BOOTSTRAP_SERVERS = "localhost:9092"
DEFAULT_MAX_IN_FLIGHT_RECORDS = 4000
DEFAULT_MARK_QUERY_RECORDS = 1000
DEFAULT_MAX_MARK_BACKOFF = 1.0

_VALID_KAFKA_NAME = re.compile(r"[^a-zA-Z0-9._-]")


def sanitise(name: str) -> str:
    """Replace characters Kafka does not allow in topic and group names, as goNELI does."""
    return _VALID_KAFKA_NAME.sub("_", name)


@dataclass(slots=True)
class Limits:
    """Timing and sizing limits. ``None`` means "use the default" (see :meth:`resolve`).

    Durations are seconds. Defaults follow goharvest's, except where noted in the docs.
    """

    io_error_backoff: float | None = None
    poll_duration: float | None = None
    min_poll_interval: float | None = None
    max_poll_interval: float | None = None
    heartbeat_timeout: float | None = None
    drain_interval: float | None = None
    queue_timeout: float | None = None
    mark_backoff: float | None = None
    max_mark_backoff: float | None = None
    max_in_flight_records: int | None = None
    send_concurrency: int | None = None
    send_buffer: int | None = None
    mark_query_records: int | None = None
    min_metrics_interval: float | None = None
    shutdown_timeout: float | None = None
    max_delivery_attempts: int | None = None
    lock_timeout: float | None = None
    mark_lookback: float | None = None
    late_row_scan_interval: float | None = None

    def __post_init__(self) -> None:
        # A wrong type fails here, naming the field; a duration string ('5s') becomes seconds.
        check_limits_types(self, _INT_LIMITS)

    def resolve(self) -> Limits:
        """A copy with every default filled in and every value validated."""
        r = dataclasses.replace(self)
        r.io_error_backoff = _dflt(r.io_error_backoff, 0.5)
        r.poll_duration = _dflt(r.poll_duration, 0.001)
        r.min_poll_interval = _dflt(r.min_poll_interval, 0.1)
        r.heartbeat_timeout = _dflt(r.heartbeat_timeout, 5.0)
        r.max_poll_interval = _dflt(r.max_poll_interval, r.heartbeat_timeout / 2)
        r.queue_timeout = _dflt(r.queue_timeout, 30.0)
        r.drain_interval = _dflt(r.drain_interval, min(r.max_poll_interval, r.queue_timeout))
        r.mark_backoff = _dflt(r.mark_backoff, 0.01)
        # An idle leader backs off to this: one mark (one transaction) a second instead of a
        # hundred, at the price of a lone record's latency where nothing wakes it sooner.
        r.max_mark_backoff = _dflt(r.max_mark_backoff, max(DEFAULT_MAX_MARK_BACKOFF, _number_or_zero(r.mark_backoff)))
        # Larger than goharvest's 1000 and 100: each mark and purge statement costs a few
        # milliseconds whatever its size, so bigger marks over a wider window drain about twice
        # as fast (docs/performance.md). Memory stays bounded by the window.
        r.max_in_flight_records = _dflt(r.max_in_flight_records, DEFAULT_MAX_IN_FLIGHT_RECORDS)
        r.send_concurrency = _dflt(r.send_concurrency, 8)
        r.send_buffer = _dflt(r.send_buffer, 10)
        r.mark_query_records = _dflt(r.mark_query_records, DEFAULT_MARK_QUERY_RECORDS)
        r.min_metrics_interval = _dflt(r.min_metrics_interval, 5.0)
        r.shutdown_timeout = _dflt(r.shutdown_timeout, 10.0)
        r.max_delivery_attempts = _dflt(r.max_delivery_attempts, 5)
        # How long the harvester's own statements wait for a lock another session holds (a
        # LOCK TABLE, a console's SELECT ... FOR UPDATE) before they fail, are logged with the
        # holder, and are retried: a mark that waits past maxPollInterval is thrown away anyway.
        # 0: no bound (the database's own).
        r.lock_timeout = _dflt(r.lock_timeout, r.max_poll_interval)
        # A mark starts past the rows its leader id marked this long ago, so that what it walks
        # over stays bounded while another session holds the database's clean-up back; a row
        # that commits later than this after its id was passed waits for the late-row scan.
        # 0: every mark from the lowest id.
        # Off by default: a key-set cursor may publish a late-committed record after later ones of
        # its key (docs/operations.md, "A shared database: the clean-up horizon").
        r.mark_lookback = _dflt(r.mark_lookback, 0.0)
        r.late_row_scan_interval = _dflt(r.late_row_scan_interval, 5.0)
        r._validate()
        return r

    def _validate(self) -> None:
        def at_least(name: str, minimum: float, unit: str = "") -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"limits.{yaml_key(name)}", f"expected a number, got {value!r}")
            if value < minimum:
                shown = format_duration(minimum) if unit == "s" else str(minimum)
                raise ConfigError(f"limits.{yaml_key(name)}", f"must be at least {shown}, got {value!r}")

        for name in ("io_error_backoff", "mark_backoff", "min_metrics_interval", "poll_duration", "min_poll_interval"):
            at_least(name, 0, "s")
        at_least("heartbeat_timeout", 0.001, "s")
        at_least("drain_interval", 0.001, "s")
        at_least("queue_timeout", 0.001, "s")
        at_least("max_poll_interval", self.min_poll_interval or 0.001, "s")
        at_least("shutdown_timeout", 0, "s")
        at_least("lock_timeout", 0, "s")
        at_least("mark_lookback", 0, "s")
        at_least("late_row_scan_interval", 0.01, "s")
        at_least("max_mark_backoff", self.mark_backoff or 0, "s")
        for name in ("max_in_flight_records", "send_concurrency", "mark_query_records", "max_delivery_attempts"):
            at_least(name, 1)
            if not isinstance(getattr(self, name), int):
                raise ConfigError(f"limits.{yaml_key(name)}", f"expected a whole number, got {getattr(self, name)!r}")
        at_least("send_buffer", 0)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, prefix: str = "limits") -> Limits:
        return limits_from_mapping(cls, data, prefix, _INT_LIMITS)

    def to_mapping(self) -> dict[str, object]:
        return limits_to_mapping(self, _INT_LIMITS)


_INT_LIMITS = frozenset(
    {"max_in_flight_records", "send_concurrency", "send_buffer", "mark_query_records", "max_delivery_attempts"}
)


def resolve_section(config: Config, prefix: str = "harvest") -> Config:
    """``config.resolve()`` for the ``prefix:`` section of a file, errors named by full path."""
    with section_errors(prefix):
        return config.resolve()


# Every field not named here is read as a string.
_CONFIG_READERS: dict[str, ValueReader] = {
    "base_kafka_config": read_kafka_properties,
    "producer_kafka_config": read_kafka_properties,
    "identity_headers": read_bool,
    "shards": read_whole_number,
    "limits": Limits.from_mapping,
}

# Each shard is a leader-topic partition, a producer and two threads in the process that owns it.
MAX_SHARDS = 256


_E = TypeVar("_E", bound=StrEnum)


def _choice(kind: type[_E], value: object, key: str) -> _E:
    """``value`` (a member, or the string a YAML file writes) as a member of ``kind``."""
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    raise ConfigError(key, f"expected one of {', '.join(kind)}, got {value!r}")


def _dflt(value: Any, default: Any) -> Any:
    return default if value is None else value


def _number_or_zero(value: object) -> float:
    """``value`` if it is a number (validation reports it otherwise), else 0."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _default_name() -> str:
    return f"{sanitise(socket.gethostname() or 'localhost')}_{os.getpid()}_{int(time.time())}"


def _program_name() -> str:
    return sanitise(os.path.basename(sys.argv[0] or "python")) or "pyharvest"


@dataclass(slots=True)
class Config:
    """What a harvester needs: where the outbox is, where Kafka is, and how to behave.

    ``data_source`` is a SQLAlchemy URL (``postgresql+psycopg://user@host/db``,
    ``sqlite:///outbox.db``, ...); for PostgreSQL a libpq ``key=value`` string is accepted
    too. ``binding`` names the dialect (an entry point of ``pyharvest.dialects``); by default the one
    serving the URL's scheme.
    ``leader_group_id`` defaults to the program's name and ``leader_topic`` to
    ``<group>.neli``: give both a name that identifies the service.
    """

    base_kafka_config: dict[str, object] = field(default_factory=dict)
    producer_kafka_config: dict[str, object] = field(default_factory=dict)
    leader_topic: str = ""
    leader_group_id: str = ""
    data_source: str = ""
    outbox_table: str = "outbox"
    binding: str | None = None
    name: str = ""
    #: What becomes of a record Kafka refuses for good: :class:`PoisonPolicy` (or its YAML string).
    poison_policy: PoisonPolicy | str = PoisonPolicy.BLOCK
    identity_headers: bool = True
    #: How many shards the outbox is harvested in: each is led by one process of the group at
    #: a time, so up to this many processes publish at once. 1 is goharvest's single leader.
    shards: int = 1
    #: The leader group's Kafka group protocol: :class:`GroupProtocol` ``classic``, or ``consumer``
    #: (KIP-848; Apache Kafka 4.0+).
    group_protocol: GroupProtocol | str = GroupProtocol.CLASSIC
    #: ``at-least-once`` (goharvest's; a leader that dies between Kafka's ack and the purge
    #: leaves its records to be published again) or ``exactly-once``: each batch is published
    #: in a Kafka transaction with a progress record (see docs/algorithm.md), so that
    #: ``read_committed`` consumers see every record once.
    delivery: Delivery | str = Delivery.AT_LEAST_ONCE
    #: ``delivery: exactly-once``: the compacted topic of progress records, one partition per
    #: shard. Defaults to ``<leaderGroupID>.progress``.
    progress_topic: str = ""
    limits: Limits = field(default_factory=Limits)
    #: This process's static member id in the leader group (Kafka's ``group.instance.id``, classic
    #: group protocol): a reaper restarted with the same one (a Kubernetes StatefulSet's pod name)
    #: takes its shards straight back, without waiting for the group to expire the old process.
    #: Each live process needs its own; empty (the default): a dynamic member.
    instance_id: str = ""

    def __post_init__(self) -> None:
        # Wrong types fail here, naming the field, not later in repr() or in the harvester.
        if isinstance(self.limits, Mapping):
            self.limits = Limits(**limits_keywords(self.limits, [f.name for f in dataclasses.fields(Limits)]))
        elif not isinstance(self.limits, Limits):
            raise ConfigError(
                "limits",
                f"expected a Limits (or a mapping of limits), got {type(self.limits).__name__}: {self.limits!r}",
            )
        check_config_types(self)

    def resolve(self) -> ResolvedConfig:
        """A copy with defaults filled in, validated; raises :class:`ConfigError`. A config that
        is resolved already is returned as it is: the boundary (the CLI, :class:`pyharvest.Harvest`)
        resolves once, and the engines it builds take that form unchanged."""
        if isinstance(self, ResolvedConfig):
            return self
        return ResolvedConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    def _fill_in(self) -> None:
        """Fill in the defaults and validate, in place (a :class:`ResolvedConfig` being built)."""
        c = self
        c.limits = c.limits.resolve()
        for fname in ("base_kafka_config", "producer_kafka_config"):
            value = getattr(c, fname)
            if value is None:
                value = {}
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                raise ConfigError(yaml_key(fname), f"expected a mapping of Kafka properties, got {value!r}")
            setattr(c, fname, dict(value))
        c.base_kafka_config.setdefault("bootstrap.servers", DEFAULT_BOOTSTRAP_SERVERS)
        for fname in (
            "leader_topic", "leader_group_id", "data_source", "outbox_table", "name", "progress_topic", "instance_id",
        ):
            v = getattr(c, fname)
            if not isinstance(v, str):
                raise ConfigError(yaml_key(fname), f"expected a string, got {v!r}")
        c.leader_group_id = c.leader_group_id or _program_name()
        c.leader_topic = c.leader_topic or f"{c.leader_group_id}.neli"
        c.progress_topic = c.progress_topic or f"{c.leader_group_id}.progress"
        c.data_source = c.data_source or DEFAULT_DATA_SOURCE
        c.name = c.name or _default_name()
        if not c.outbox_table:
            raise ConfigError("outboxTable", "must name the outbox table, e.g. 'outbox' or 'myschema.outbox'")
        for fname, label in (("leader_topic", "topic"), ("leader_group_id", "group id"), ("progress_topic", "topic")):
            v = getattr(c, fname)
            if _VALID_KAFKA_NAME.search(v) or len(v) > 249:
                raise ConfigError(
                    yaml_key(fname), f"{v!r} is not a valid Kafka {label}: use 1-249 characters from [a-zA-Z0-9._-]"
                )
        c.poison_policy = _choice(PoisonPolicy, c.poison_policy, "poisonPolicy")
        c.delivery = _choice(Delivery, c.delivery, "delivery")
        if c.progress_topic == c.leader_topic:
            raise ConfigError("progressTopic", f"must differ from leaderTopic ({c.leader_topic!r})")
        if c.binding is not None and (not isinstance(c.binding, str) or not c.binding):
            raise ConfigError("binding", f"expected the name of a dialect, got {c.binding!r}")
        if isinstance(c.shards, bool) or not isinstance(c.shards, int) or not 1 <= c.shards <= MAX_SHARDS:
            raise ConfigError("shards", f"expected a whole number from 1 to {MAX_SHARDS}, got {c.shards!r}")
        c.group_protocol = _choice(GroupProtocol, c.group_protocol, "groupProtocol")
        c.instance_id = c.instance_id.strip()
        if c.instance_id:
            if _VALID_KAFKA_NAME.search(c.instance_id) or len(c.instance_id) > 249:
                raise ConfigError("instanceID", f"{c.instance_id!r} is not a valid Kafka group.instance.id: use 1-249 "
                                  "characters from [a-zA-Z0-9._-] (a pod name fits)")
            if c.group_protocol == GroupProtocol.CONSUMER:
                # librdkafka's static member leaves a consumer-protocol group only "temporarily"
                # (member epoch -2) on close: the broker keeps its shards for the group's whole
                # session (45 s by default), so a graceful stop would no longer hand over at once.
                raise ConfigError("instanceID", "static membership needs groupProtocol: classic. Under the "
                                  "consumer protocol a static member that stops keeps its shards until the group's "
                                  "session expires (45 s by default), so a graceful stop would not hand over at "
                                  "once; remove instanceID or use groupProtocol: classic")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], prefix: str = "harvest") -> Config:
        """Build from goharvest's camelCase keys (the ``harvest:`` section of ``reaper.yaml``)."""
        return section_from_mapping(cls, data, prefix, _CONFIG_READERS)

    def to_mapping(self, mask_secrets: bool = True) -> dict[str, object]:
        return config_to_mapping(self, mask_secrets)

    # Never let a password reach a log line through repr() or str(), and never raise there:
    # a repr is what an error report is made of.
    def __repr__(self) -> str:
        try:
            return masked_repr(self)
        except Exception as e:  # noqa: BLE001 - an attribute set to a wrong type after construction
            return f"Config(<not printable: {type(e).__name__}: {e}>)"

    __str__ = __repr__


# repr=False and eq=False keep Config's own: a generated repr would print secrets.
@dataclass(slots=True, repr=False, eq=False)
class ResolvedConfig(Config):
    """A :class:`Config` with every default filled in and validated: the form the engines take.
    Made by :meth:`Config.resolve`; ``dataclasses.replace`` of one fills in and validates the
    copy again, so a resolved config never holds an unchecked value it was built with."""

    def __post_init__(self) -> None:
        # Not super(): a slotted dataclass is rebuilt, which zero-argument super() cannot follow.
        Config.__post_init__(self)
        self._fill_in()


_LOG_LEVELS = {
    "trace": 5,
    "debug": 10,
    "info": 20,
    "warn": 30,
    "warning": 30,
    "error": 40,
    "off": 100,
}


@dataclass(slots=True)
class LoggingConfig:
    level: str = "info"
    json: bool = False

    @property
    def numeric_level(self) -> int:
        return _LOG_LEVELS[self.level.lower()]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> LoggingConfig:
        data = dict(data or {})
        out = cls()
        for key, value in data.items():
            if key == "level":
                if not isinstance(value, str) or value.lower() not in _LOG_LEVELS:
                    levels = ", ".join(k.capitalize() for k in _LOG_LEVELS)
                    raise ConfigError("logging.level", f"expected one of {levels}, got {value!r}")
                out.level = value
            elif key == "json":
                if not isinstance(value, bool):
                    raise ConfigError("logging.json", f"expected true or false, got {value!r}")
                out.json = value
            else:
                raise ConfigError(
                    f"logging.{key}", f"unknown key; {did_you_mean(key, ('json', 'level'))}expected one of: json, level"
                )
        return out


@dataclass(slots=True)
class ReaperConfig:
    """The whole of ``reaper.yaml``: a ``harvest:`` section and a ``logging:`` section."""

    harvest: Config
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], section_checks: Mapping[str, SectionCheck] | None = None
    ) -> ReaperConfig:
        """Read the file's mapping. Every section is checked first, in the file's order, and
        all their errors reported together (:func:`check_file_sections`): ``harvest:`` as the
        harvester resolves it, ``logging:``, and those of ``section_checks`` (``reaper`` passes
        the ``metrics:`` section's reader, which lives in the bindings)."""
        data = file_sections(data, "harvest")
        checks: dict[str, SectionCheck] = {"harvest": _check_harvest, "logging": LoggingConfig.from_mapping}
        check_file_sections(data, {**checks, **(section_checks or {})}, "harvest")
        extra = {k: v for k, v in data.items() if k not in ("harvest", "logging")}
        return cls(Config.from_mapping(data["harvest"] or {}), LoggingConfig.from_mapping(data.get("logging")), extra)

    @classmethod
    def load(cls, path: str) -> ReaperConfig:
        return cls.from_mapping(read_yaml_file(path))


def _check_harvest(body: Any) -> None:
    Config.from_mapping(body or {}).resolve()
