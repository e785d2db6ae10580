"""``python manage.py reaper``: the harvester on the project's own database.

    python manage.py reaper                     settings.PYHARVEST, the database from DATABASES
    python manage.py reaper -f reaper.yaml      the file instead of settings.PYHARVEST
    python manage.py reaper --database other    another alias of DATABASES
    python manage.py reaper --print-config      the effective configuration, secrets masked

The configuration is reaper.yaml's (``harvest:``, ``logging:``, ``metrics:`` sections, goharvest's
camelCase keys), from the ``-f`` file or the ``PYHARVEST`` setting, then the
``PYHARVEST_<SECTION>__<KEY>`` environment overrides. Unless it sets them, ``harvest.dataSource``
comes from ``DATABASES`` and ``harvest.outboxTable`` from ``PYHARVEST_OUTBOX_TABLE``. Stops
gracefully on SIGINT/SIGTERM, exactly as ``reaper`` does (the same code runs).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS

from pyharvest.core.config.settings import ReaperConfig
from pyharvest.core.config.yaml_files import read_yaml_file
from pyharvest.core.errors import ConfigError, HarvestError
from pyharvest.core.ports.kafka import TopicError


def reaper_config(file: str | None = None, using: str = DEFAULT_DB_ALIAS) -> ReaperConfig:
    """The harvester's configuration for ``manage.py reaper`` (see the module's docstring)."""
    from pyharvest.django.databases import data_source, outbox_table_name
    from pyharvest.envconfig import apply_env_overrides

    if file is not None:
        raw: Any = read_yaml_file(file)
    else:
        raw = copy.deepcopy(getattr(settings, "PYHARVEST", None) or {})
        if not isinstance(raw, Mapping):
            raise ConfigError(
                "PYHARVEST", f"the setting must be a mapping like reaper.yaml's, got {type(raw).__name__}"
            )
    data = apply_env_overrides(raw)
    if data.get("harvest") is None:
        data["harvest"] = {}
    from pyharvest.bindings.ops.config import OpsConfig

    config = ReaperConfig.from_mapping(data, {"metrics": OpsConfig.from_mapping})  # every section's errors, in order
    if not config.harvest.data_source:
        config.harvest.data_source = data_source(using)
    if "outboxTable" not in data["harvest"]:
        config.harvest.outbox_table = str(outbox_table_name())
    return config


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no type information
    help = (
        "Run the pyharvest harvester (as `reaper -f reaper.yaml`) on a database of DATABASES, "
        "configured by settings.PYHARVEST or a reaper.yaml file."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-f", "--file", help="reaper.yaml to use instead of settings.PYHARVEST")
        parser.add_argument(
            "--database", default=DEFAULT_DB_ALIAS, help="the DATABASES alias holding the outbox (default: default)"
        )
        parser.add_argument(
            "--print-config", action="store_true", help="print the effective config (secrets masked) and exit"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from pyharvest._cli import run_harvest
        from pyharvest._commands.exits import EXIT_OK

        try:
            config = reaper_config(options["file"], options["database"])
            code = run_harvest(config, print_config=options["print_config"])
        except ConfigError as e:
            raise CommandError(f"invalid configuration: {e}", returncode=2) from e
        except (HarvestError, TopicError) as e:
            raise CommandError(str(e)) from e
        if code != EXIT_OK:
            raise CommandError(f"the harvester stopped with exit status {code}", returncode=code)
