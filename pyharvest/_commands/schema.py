"""What ``reaper schema`` prints for: the dialect, the table and how it is harvested, from
``--binding`` and ``--table``, a configuration file (``-f``) or a data source
(``--data-source``), as ``reaper init-db`` takes them; and its ``--grants``.

    reaper schema --binding postgresql --grants reaper --role outbox_reaper
    reaper schema -f reaper.yaml --grants stasher --role app          (dialect, table, policy, shards from the file)
    reaper schema -f inbox.yaml --grants inbox --role billing_inbox   (the inbox's tables)

Nothing connects: the dialect comes from the data source's scheme. A flag beside ``-f``
overrides the file's value.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyharvest.core.config.choices import PoisonPolicy
from pyharvest.core.errors import ConfigError

__all__ = ["GRANT_COMPONENTS", "SchemaTarget", "grants_of", "schema_target"]

#: ``--grants``'s choices.
GRANT_COMPONENTS = ("reaper", "stasher", "inbox", "verify")


@dataclass(frozen=True, slots=True)
class SchemaTarget:
    binding: str
    table: str
    poison_policy: PoisonPolicy | str
    shards: int
    inbox: Mapping[str, Any] | None  # the file's inbox: section, for the inbox's tables


def schema_target(args: argparse.Namespace) -> SchemaTarget:
    """The dialect, table, poison policy and shards: flags first, then ``-f``'s section
    (``harvest:``, or ``inbox:`` for the inbox's grants), then ``--data-source``'s scheme."""
    from pyharvest.bindings.sql.connect import resolve
    from pyharvest.core.config.settings import Config, resolve_section

    harvest: Config | None = None
    inbox: Mapping[str, Any] | None = None
    data_source = args.data_source
    binding = args.binding
    if args.file:
        from pyharvest._commands.files import read_file_sections

        sections = read_file_sections(args.file)
        if isinstance(sections.get("harvest"), Mapping):
            harvest = resolve_section(Config.from_mapping(sections["harvest"]))
        if isinstance(sections.get("inbox"), Mapping):
            inbox = sections["inbox"]
        if harvest is None and inbox is None:
            raise ConfigError("", f"{args.file} has neither a 'harvest:' nor an 'inbox:' section")
        if inbox is not None and (harvest is None or getattr(args, "grants", None) == "inbox"):
            data_source = data_source or inbox.get("dataSource")
            binding = binding or inbox.get("binding")
        elif harvest is not None:
            data_source = data_source or harvest.data_source
            binding = binding or harvest.binding
    if binding is None:
        if not data_source:
            raise ConfigError("--binding", "give --binding NAME, -f FILE or --data-source URL to choose the dialect")
        binding = resolve(str(data_source))[1].name
    table = args.table or (harvest.outbox_table if harvest is not None else "outbox")
    policy = args.poison_policy or (harvest.poison_policy if harvest is not None else PoisonPolicy.BLOCK)
    shards = args.shards or (harvest.shards if harvest is not None else 1)
    return SchemaTarget(str(binding), table, policy, shards, inbox)


def grants_of(target: SchemaTarget, component: str, role: str) -> str:
    """The ``GRANT`` statements ``component`` needs, for ``role``, as ``--grants`` prints them."""
    from pyharvest.bindings.sql.component_grants import component_grants, grants_script
    from pyharvest.plugins.api import OutboxTable, load_dialect, parse_table_name

    dialect = load_dialect(target.binding)
    if component == "inbox":
        from pyharvest.inbox import InboxConfig, InboxTables

        names = InboxConfig()
        if target.inbox is not None:
            names = InboxConfig.from_mapping({k: v for k, v in target.inbox.items()
                                              if k in ("checkpointTable", "dedupeTable", "deadLetterTable")})
        tables = InboxTables.build(names.checkpoint_table, names.dedupe_table, names.dead_letter_table)
        return grants_script(dialect, tables.grants(), role, component)
    outbox = OutboxTable.build(parse_table_name(target.table), key_hash=target.shards > 1)
    quarantine = target.poison_policy == PoisonPolicy.QUARANTINE
    grants = component_grants(component, outbox, quarantine=quarantine, shards=target.shards)
    return grants_script(dialect, grants, role, component)
