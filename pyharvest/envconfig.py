"""Configuration from the environment: override any ``reaper.yaml`` key with a variable.

A variable names a key by its path, sections separated by a double underscore::

    PYHARVEST_<SECTION>__<KEY>[__<KEY>...]=<value>

    PYHARVEST_HARVEST__LIMITS__MAXINFLIGHTRECORDS=500        harvest.limits.maxInFlightRecords
    PYHARVEST_HARVEST__LIMITS__MAX_IN_FLIGHT_RECORDS=500     the same key
    PYHARVEST_HARVEST__DATASOURCE=postgresql+psycopg://...   harvest.dataSource
    PYHARVEST_HARVEST__BASEKAFKACONFIG__BOOTSTRAP_SERVERS=kafka:9092
                                                             harvest.baseKafkaConfig["bootstrap.servers"]
    PYHARVEST_HARVEST__BASEKAFKACONFIG__SASL_PASSWORD=...    harvest.baseKafkaConfig["sasl.password"]
    PYHARVEST_LOGGING__LEVEL=Debug                           logging.level
    PYHARVEST_METRICS__PORT=9433                             metrics.port (creates the section)

Rules, chosen so that every name means exactly one key:

* ``__`` separates path segments; ``SECTION`` is ``HARVEST``, ``LOGGING``, ``METRICS`` or
  ``INBOX``. Variables with the prefix but without ``__`` (``PYHARVEST_TEST_KAFKA``...) are
  not configuration and are left alone.
* A segment naming one of pyharvest's own keys is matched case-insensitively, single
  underscores ignored: ``MAXINFLIGHTRECORDS`` and ``MAX_IN_FLIGHT_RECORDS`` both name
  ``maxInFlightRecords``. An unknown key is an error (as it is in the file).
* Below ``baseKafkaConfig`` or ``producerKafkaConfig``, the rest of the name is one librdkafka
  property: lower-cased, ``_`` read as ``.`` and ``__`` as a literal ``_``
  (``SSL_CA_LOCATION`` → ``ssl.ca.location``). A property already in the file is matched
  whatever its spelling.
* Values are read as YAML scalars, losslessly: ``500`` is a number, ``true``/``false`` are
  booleans, an empty value or ``null`` means "unset" (the default; for a Kafka property,
  remove it). Anything else — ``0123``, ``on``, ``1_000``, ``a: b``, ``x # y`` — stays the
  string exactly as given, so passwords are never mangled; quote a value (``'500'``) to
  force a string.
* Two variables naming the same key are an error.

Apply :func:`apply_env_overrides` to the raw YAML mapping before
:meth:`ReaperConfig.from_mapping`, or let :func:`load_reaper_config` do both. A file's
``harvest:`` section is a :class:`~pyharvest.Config`, its ``logging:`` section a
:class:`LoggingConfig`, and the whole a :class:`ReaperConfig`.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, fields
from typing import Any

from pyharvest._public import publish
from pyharvest.core.config.settings import (
    Config,
    Limits,
    LoggingConfig,
    ReaperConfig,
    mask_kafka_config,
)
from pyharvest.core.config.yaml_files import read_yaml_file
from pyharvest.core.errors import ConfigError

__all__ = [
    "PREFIX",
    "LoggingConfig",
    "Override",
    "ReaperConfig",
    "apply_env_overrides",
    "env_overrides",
    "load_reaper_config",
    "parse_value",
]

PREFIX = "PYHARVEST_"

# A schema node: a dict of known keys (value: the child node), or a marker.
_KAFKA = "kafka-properties"  # free-form librdkafka properties, named by the rest of the variable
_FREE = "free-form"  # a mapping whose keys pyharvest does not know (another feature's section)
_LEAF = "leaf"


def _schema() -> dict[str, Any]:
    harvest: dict[str, Any] = {}
    for key in Config().to_mapping(mask_secrets=False):
        harvest[key] = _LEAF
    harvest["baseKafkaConfig"] = _KAFKA
    harvest["producerKafkaConfig"] = _KAFKA
    harvest["limits"] = dict.fromkeys(Limits().resolve().to_mapping(), _LEAF)
    from pyharvest.bindings.ops.config import METRICS_KEYS

    return {
        "harvest": harvest,
        "logging": {f.name: _LEAF for f in fields(LoggingConfig)},
        "metrics": dict.fromkeys(METRICS_KEYS, _LEAF),
        "inbox": _FREE,
    }


def _norm(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


@dataclass(frozen=True, slots=True)
class Override:
    """One variable and the key it sets."""

    variable: str
    path: tuple[str, ...]
    value: Any

    @property
    def key(self) -> str:
        """The dotted path, Kafka properties in brackets: ``harvest.baseKafkaConfig[sasl.password]``."""
        out = self.path[0]
        for parent, part in zip(self.path, self.path[1:], strict=False):
            out += f"[{part}]" if parent.endswith("KafkaConfig") else f".{part}"
        return out

    def masked_value(self) -> Any:
        """The value with secrets hidden, for logs."""
        if len(self.path) >= 2 and self.path[-2] in ("baseKafkaConfig", "producerKafkaConfig"):
            return mask_kafka_config({self.path[-1]: self.value})[self.path[-1]]
        if self.path[-1] == "dataSource" and isinstance(self.value, str):
            from pyharvest.core.config.settings import mask_data_source

            return mask_data_source(self.value)
        if re.search(r"password|secret|token", self.path[-1], re.IGNORECASE):
            return "***"
        return self.value


_PLAIN_FLOAT = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_PLAIN_INT = re.compile(r"[-+]?(?:0|[1-9]\d*)")
_NULLS = ("", "~", "null", "Null", "NULL")


def parse_value(text: str) -> Any:
    """Read an environment value as a YAML scalar, losslessly (see the module's rules)."""
    stripped = text.strip()
    if stripped in _NULLS:
        return None
    if stripped in ("true", "True", "TRUE"):
        return True
    if stripped in ("false", "False", "FALSE"):
        return False
    if _PLAIN_INT.fullmatch(stripped):
        return int(stripped)
    if _PLAIN_FLOAT.fullmatch(stripped) and "." in stripped:
        return float(stripped)
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
        import yaml

        try:
            quoted = yaml.safe_load(stripped)
        except yaml.YAMLError:
            return text
        if isinstance(quoted, str):
            return quoted
    return text


def env_overrides(environ: Mapping[str, str] | None = None) -> list[Override]:
    """The configuration variables in ``environ`` (``os.environ`` by default), sorted by name,
    with the key path each one names. Raises :class:`ConfigError` for a variable that names
    no key, or for two naming the same key."""
    env = os.environ if environ is None else environ
    schema = _schema()
    out: list[Override] = []
    seen: dict[tuple[str, ...], str] = {}
    for variable in sorted(env):
        if not variable.startswith(PREFIX) or "__" not in variable:
            continue
        path = _resolve(variable, variable[len(PREFIX):], schema)
        lowered = tuple(p.lower() for p in path)
        if lowered in seen:
            raise ConfigError(
                ".".join(path), f"set by both {seen[lowered]} and {variable}; keep one of them"
            )
        seen[lowered] = variable
        out.append(Override(variable, path, parse_value(env[variable])))
    return out


def _resolve(variable: str, rest: str, schema: dict[str, Any]) -> tuple[str, ...]:
    def fail(where: str, problem: str) -> ConfigError:
        return ConfigError(where, f"environment variable {variable}: {problem}")

    section_name, _, rest = rest.partition("__")
    section = next((s for s in schema if _norm(s) == _norm(section_name)), None)
    if section is None:
        raise fail(section_name.lower(), f"unknown section {section_name!r}; expected one of "
                                          f"{', '.join(s.upper() for s in schema)}")
    path = [section]
    node: Any = schema[section]
    while True:
        if not rest:
            raise fail(".".join(path), "names a section, not a key; set its keys one by one")
        if node == _KAFKA:
            path.append(_kafka_property(rest))
            return tuple(path)
        segment, _, rest = rest.partition("__")
        if not segment:
            raise fail(".".join(path), "has an empty segment (three or more underscores in a row?)")
        if node == _FREE:
            path.append(_camel_segment(segment))
            if rest:
                continue
            return tuple(path)
        assert isinstance(node, dict)
        key = next((k for k in node if _norm(k) == _norm(segment)), None)
        if key is None:
            raise fail(
                ".".join([*path, segment.lower()]),
                f"unknown key {segment!r}; expected one of: {', '.join(sorted(node))}",
            )
        path.append(key)
        node = node[key]
        if node == _LEAF:
            if rest:
                raise fail(".".join(path), f"{key} is a single value; nothing is below it")
            return tuple(path)


def _kafka_property(rest: str) -> str:
    # '__' is a literal underscore, '_' a dot: SSL_CA_LOCATION -> ssl.ca.location, STATS__CB -> stats_cb.
    return ".".join(part.replace("\0", "_") for part in rest.replace("__", "\0").lower().split("_"))


def _camel_segment(segment: str) -> str:
    head, *tail = segment.lower().split("_")
    return head + "".join(p.capitalize() for p in tail)


def apply_env_overrides(mapping: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A copy of the raw ``reaper.yaml`` mapping with the environment's overrides applied.

    ``mapping`` is what ``yaml.safe_load`` returned (``None`` for an empty file); ``environ``
    defaults to ``os.environ``. Keys already in the mapping are matched whatever their case,
    so an override replaces the file's value rather than adding a near-duplicate key.
    """
    if mapping is not None and not isinstance(mapping, Mapping):
        raise ConfigError("", "the configuration file must hold a mapping with a 'harvest:' section")
    out: dict[str, Any] = copy.deepcopy(dict(mapping or {}))
    for override in env_overrides(environ):
        _set(out, override)
    return out


def _set(root: dict[str, Any], override: Override) -> None:
    node: MutableMapping[str, Any] = root
    path = override.path
    for depth, part in enumerate(path):
        key = _existing_key(node, part, kafka=depth >= 2 and path[depth - 1].endswith("KafkaConfig"))
        if depth == len(path) - 1:
            if override.value is None and path[depth - 1].endswith("KafkaConfig"):
                node.pop(key, None)  # an empty value removes a Kafka property
            else:
                node[key] = override.value
            return
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, MutableMapping):
            raise ConfigError(
                ".".join(path[: depth + 1]),
                f"environment variable {override.variable} needs a mapping here, but the file has {child!r}",
            )
        node = child


def _existing_key(node: Mapping[Any, Any], wanted: str, kafka: bool) -> Any:
    if wanted in node:
        return wanted
    if kafka:
        # librdkafka property names are lower-case; compare the env spelling (dots for _)
        norm = wanted.lower()
        for k in node:
            if isinstance(k, str) and k.lower().replace("_", ".") == norm.replace("_", "."):
                return k
        return wanted
    for k in node:
        if isinstance(k, str) and _norm(k) == _norm(wanted):
            return k
    return wanted


def load_reaper_config(path: str, environ: Mapping[str, str] | None = None) -> ReaperConfig:
    """:meth:`ReaperConfig.load` with the environment's overrides applied; same errors, and
    the ``metrics:`` section's among them, in the file's order."""
    from pyharvest.bindings.ops.config import OpsConfig

    data = read_yaml_file(path)
    return ReaperConfig.from_mapping(apply_env_overrides(data, environ), {"metrics": OpsConfig.from_mapping})


publish(__name__, globals(), __all__)
