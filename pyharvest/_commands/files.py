"""Where a maintenance command finds its database or Kafka: ``-f FILE`` or flags.

``reaper init-db``, ``quarantine`` and ``verify`` take the outbox's connection and table (or
Kafka's properties) from a configuration file, the one ``reaper -f`` or ``reaper inbox -f``
runs with, environment overrides (``PYHARVEST_…``) applied: then no password is written on
the command line, where ``ps`` shows it. A flag given beside ``-f`` overrides the file's value.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyharvest.core.config.settings import Config, resolve_section
from pyharvest.core.config.yaml_files import read_yaml_file
from pyharvest.core.errors import ConfigError

__all__ = ["OutboxTarget", "add_file_argument", "kafka_properties", "outbox_target", "read_file_sections"]

DEFAULT_TABLE = "outbox"

# Properties that belong to the file's consumer group, not to a one-off reader of a topic.
_GROUP_OWNED = ("group.id", "enable.auto.commit", "enable.auto.offset.store", "group.instance.id")


def add_file_argument(parser: argparse.ArgumentParser, what: str, files: str = "reaper.yaml") -> None:
    parser.add_argument(
        "-f", "--file", metavar="FILE",
        help=f"take {what} from this configuration file ({files}; PYHARVEST_* overrides applied), "
        "so that no password is on the command line; flags override it",
    )


def read_file_sections(path: str) -> dict[str, Any]:
    """The configuration file's mapping, the environment's overrides applied."""
    from pyharvest.envconfig import apply_env_overrides

    data = read_yaml_file(path)
    if not isinstance(data, Mapping):
        raise ConfigError("", f"{path} must hold a mapping with a 'harvest:' or an 'inbox:' section")
    return apply_env_overrides(data)


@dataclass(frozen=True, slots=True)
class OutboxTarget:
    """The outbox a maintenance command works on."""

    data_source: str
    table: str
    binding: str | None
    config: Config | None  # the file's harvest section, resolved, when -f gave one


def outbox_target(args: argparse.Namespace) -> OutboxTarget:
    """``args.file``'s ``harvest:`` section (data source, table, binding), with ``--data-source``,
    ``--table`` and ``--binding`` taking precedence; without ``-f``, the flags alone."""
    config: Config | None = None
    if args.file:
        data = read_file_sections(args.file)
        if not isinstance(data.get("harvest"), Mapping):
            raise ConfigError(
                "harvest", f"{args.file} has no 'harvest:' section to take the outbox's data source and table from"
            )
        config = resolve_section(Config.from_mapping(data["harvest"]))
    data_source = args.data_source or (config.data_source if config is not None else None)
    if not data_source:
        raise ConfigError("--data-source", "give -f reaper.yaml (preferred: no password on the command line) "
                                           "or --data-source URL")
    table = args.table or (config.outbox_table if config is not None else DEFAULT_TABLE)
    binding = args.binding or (config.binding if config is not None else None)
    return OutboxTarget(data_source, table, binding, config)


def kafka_properties(path: str) -> dict[str, object]:
    """The Kafka properties of the file's ``harvest:`` section (``baseKafkaConfig``) or, if it
    has none, of its ``inbox:`` section, without those of the file's consumer group."""
    data = read_file_sections(path)
    for section in ("harvest", "inbox"):
        body = data.get(section)
        if isinstance(body, Mapping):
            properties = body.get("baseKafkaConfig") or {}
            if not isinstance(properties, Mapping):
                raise ConfigError(
                    f"{section}.baseKafkaConfig", f"expected a mapping of Kafka properties, got {properties!r}"
                )
            return {str(k): v for k, v in properties.items() if k not in _GROUP_OWNED}
    raise ConfigError(
        "harvest", f"{path} has neither a 'harvest:' nor an 'inbox:' section to take Kafka's properties from"
    )
