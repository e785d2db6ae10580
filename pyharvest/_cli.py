"""The ``reaper`` command: run the harvester beside a service, and manage its outbox.

    reaper -f reaper.yaml                    run the harvester (goharvest's reaper, unchanged config)
    reaper init-db -f reaper.yaml            create the outbox table if missing (or --data-source URL)
    reaper schema --binding postgresql       print the outbox DDL
    reaper broker [--port 9092]              the embedded broker, in the foreground (development)
    reaper acls -f reaper.yaml --topic T     print the kafka-acls.sh commands of the Kafka ACLs it needs
    reaper monitoring export DIR             write out the Grafana dashboard and Prometheus alerting rules
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pyharvest._commands.exits import EXIT_OK, EXIT_USAGE, error_exit
from pyharvest._commands.files import add_file_argument
from pyharvest._commands.process import run_command, setup_logging
from pyharvest._commands.schema import GRANT_COMPONENTS
from pyharvest._version import __version__
from pyharvest.core.config.choices import PoisonPolicy
from pyharvest.core.config.settings import mask_data_source, resolve_section
from pyharvest.core.config.yaml_files import section_errors

if TYPE_CHECKING:
    from pyharvest.core.config.settings import Config as HarvestConfig
    from pyharvest.core.config.settings import ReaperConfig

log = logging.getLogger("pyharvest.reaper")


# ---------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace) -> int:
    from pyharvest.envconfig import load_reaper_config

    if not args.file:
        # Checked here, not by argparse: an unknown flag ('reaper --frobnicate') is named first.
        return error_exit("the following arguments are required: -f/--file (e.g. reaper -f reaper.yaml)", EXIT_USAGE)
    # reaper.yaml, then PYHARVEST_<SECTION>__<KEY> overrides, then the flags
    cfg = load_reaper_config(args.file)
    if args.shards is not None:
        cfg.harvest.shards = args.shards
    return run_harvest(cfg, print_config=args.print_config, config_file=args.file)


def run_harvest(cfg: ReaperConfig, *, print_config: bool = False, config_file: str | None = None) -> int:
    """Run the harvester of ``cfg`` until SIGINT or SIGTERM, as ``reaper -f`` does: logging
    set up from its ``logging:`` section, the status page, ``/metrics`` and probes from
    ``metrics:``, a graceful stop on the first signal. ``print_config`` prints the effective
    configuration (secrets masked) instead; ``config_file``, the file it came from, is what the
    status page's ``reaper quarantine`` commands name. Shared by ``reaper`` and Django's
    ``manage.py reaper``."""
    import shlex

    from pyharvest._harvest import Harvest, _sql_binding
    from pyharvest.bindings.ops import start_ops_server
    from pyharvest.bindings.ops.config import OpsConfig
    from pyharvest.envconfig import env_overrides

    harvest_cfg = resolve_section(cfg.harvest)
    # A 'metrics:' section (even empty) turns on /metrics, /healthz and /readyz.
    ops_cfg = OpsConfig.from_mapping(cfg.extra["metrics"]) if "metrics" in cfg.extra else None
    setup_logging(cfg.logging.numeric_level, cfg.logging.json)
    # What reaper refuses without connecting anywhere (the table name, the driver, librdkafka's
    # verdict on the Kafka properties), it refuses before it starts; --print-config too: the
    # migration guide relies on it.
    with section_errors("harvest"):
        check_harvest_config(harvest_cfg)
    if print_config:
        import yaml

        from pyharvest.bindings.sql.connect import resolve

        harvest_printed = harvest_cfg.to_mapping(mask_secrets=True)
        if harvest_printed.get("binding") is None:  # the effective one: the dialect the data source chose
            harvest_printed["binding"] = resolve(harvest_cfg.data_source, None)[1].name
        printed: dict[str, object] = {
            "harvest": harvest_printed,
            "logging": {"level": cfg.logging.level, "json": cfg.logging.json},
        }
        if ops_cfg is not None:
            printed["metrics"] = ops_cfg.to_mapping()
        print(yaml.safe_dump(printed, sort_keys=False), end="")
        return EXIT_OK
    for override in env_overrides():
        log.info("%s set from %s: %r", override.key, override.variable, override.masked_value())
    # A missing or unsharded table's error, at start or mid-run, names the command that creates
    # it from the same file (password and all), as the status page's commands name the file.
    init_db = f"reaper init-db -f {shlex.quote(config_file)}" if config_file else None
    harvest = Harvest(harvest_cfg, binding=_sql_binding(harvest_cfg, init_db))
    # Before start(): probes answer while the harvester connects (not ready until it runs).
    ops = start_ops_server(
        harvest, ops_cfg, command_target=f"-f {shlex.quote(config_file)}" if config_file else None
    )
    try:
        # One short line; the whole configuration (secrets masked) at DEBUG, or --print-config.
        log.info(
            "reaper %s starting: outbox %r, %s, %d shard%s, delivery %s",
            harvest_cfg.name, harvest_cfg.outbox_table, mask_data_source(harvest_cfg.data_source),
            harvest_cfg.shards, "" if harvest_cfg.shards == 1 else "s", harvest_cfg.delivery,
        )
        log.debug("reaper configuration: %s", harvest_cfg)
        harvest.run()  # a graceful stop on the first SIGINT or SIGTERM
    finally:
        if ops is not None:
            ops.stop()
    return EXIT_OK


def check_harvest_config(cfg: HarvestConfig) -> None:
    """Everything ``reaper`` checks of a resolved configuration before it connects anywhere: the
    table name, the data source and its dialect, and the Kafka properties of every client
    (librdkafka's verdict, named by YAML key). Raises :class:`ConfigError` (or another
    :class:`~pyharvest.core.errors.HarvestError`) as ``reaper`` would."""
    from pyharvest.bindings.kafka.preflight import check_properties
    from pyharvest.bindings.sql.connect import load_driver, resolve
    from pyharvest.core.config.kafka_origins import explain_harvest_refusal
    from pyharvest.core.election.group_protocol import leader_client_configs
    from pyharvest.core.errors import KafkaPropertyError
    from pyharvest.core.publishing.sender import producer_config
    from pyharvest.plugins.api import parse_table_name

    parse_table_name(cfg.outbox_table)
    load_driver(*resolve(cfg.data_source, cfg.binding))  # as the run does: a missing driver fails here
    consumer, heartbeats = leader_client_configs(
        cfg.base_kafka_config, cfg.leader_group_id, cfg.limits.heartbeat_timeout,  # type: ignore[arg-type]
        cfg.group_protocol,
    )
    try:
        check_properties("producer", producer_config(cfg))
        check_properties("heartbeat producer", heartbeats)
        check_properties("leader consumer", consumer, consumer=True)
    except KafkaPropertyError as e:
        raise explain_harvest_refusal(e, cfg) from None


# ---------------------------------------------------------------------- schema and init-db


def cmd_schema(args: argparse.Namespace) -> int:
    from pyharvest._commands.schema import grants_of, schema_target
    from pyharvest.bindings.sql import schema_ddl

    if args.grants and not args.role:
        return error_exit("--grants needs --role ROLE: the role (or user) to grant to", EXIT_USAGE)
    target = schema_target(args)
    if args.grants:
        print(grants_of(target, args.grants, args.role), end="")
        return EXIT_OK
    print(schema_ddl(target.binding, target.table), end="")
    if args.statements:
        from pyharvest.bindings.sql.statements import harvester_statements
        from pyharvest.plugins.api import OutboxTable, load_dialect, parse_table_name

        outbox = OutboxTable.build(parse_table_name(target.table))
        for what, sql in harvester_statements(
            load_dialect(target.binding),
            outbox,
            quarantine=target.poison_policy == PoisonPolicy.QUARANTINE,
            shards=target.shards,
        ):
            print(f"\n-- {what}\n{sql};")
    return EXIT_OK


def cmd_init_db(args: argparse.Namespace) -> int:
    from pyharvest._commands.files import outbox_target
    from pyharvest.bindings.sql import create_outbox_table

    target = outbox_target(args)
    # From the file, the table is made ready for how it will be harvested.
    shards = args.shards or (target.config.shards if target.config is not None else 1)
    configured = target.config is not None and target.config.poison_policy == PoisonPolicy.QUARANTINE
    quarantine = args.quarantine or configured
    create_outbox_table(target.data_source, target.table, target.binding, quarantine=quarantine, shards=shards)
    print(f"outbox table {target.table!r} is ready at {mask_data_source(target.data_source)}")
    return EXIT_OK


# ---------------------------------------------------------------------- wiring


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


Command = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reaper",
        description="pyharvest: publish a transactional outbox to Kafka (goharvest-compatible reaper).",
    )
    parser.add_argument("--version", action="version", version=f"reaper (pyharvest) {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run", help="run the harvester (the default: 'reaper -f reaper.yaml')",
        description="Run the harvester of a goharvest-compatible reaper.yaml until SIGINT or SIGTERM: it joins "
        "the leader group and, while it leads, publishes the outbox's records to Kafka in order per key and "
        "deletes them. 'reaper -f reaper.yaml' is the same as 'reaper run -f reaper.yaml'. PYHARVEST_* "
        "environment variables override the file's keys.",
    )
    run.add_argument("-f", "--file", help="configuration file (goharvest's reaper.yaml format); required")
    run.add_argument("--print-config", action="store_true", help="print the effective config (secrets masked) and exit")
    run.add_argument(
        "--shards", type=_positive, default=None,
        help="harvest in this many shards (overrides harvest.shards; the table and the leader topic must be made "
        "for it: reaper init-db --shards N)",
    )
    run.set_defaults(func=cmd_run)

    init = sub.add_parser(
        "init-db", help="create the outbox table (idempotent)",
        description="Create the outbox table if it is missing: 'reaper init-db -f reaper.yaml' (its dataSource, "
        "outboxTable, binding, shards and poisonPolicy) or 'reaper init-db --data-source URL'.",
    )
    add_file_argument(init, "the data source, table, dialect (binding), shards and poison policy")
    init.add_argument("--data-source", help="SQLAlchemy URL (or a libpq key=value string); without -f, required")
    init.add_argument("--table", help="outbox table name, optionally schema-qualified (default: outbox)")
    init.add_argument("--binding", default=None, help="the dialect, by name (default: the one the URL's scheme names)")
    init.add_argument(
        "--shards", type=_positive, default=None,
        help="also make the table ready to be harvested in this many shards: the key hash column and its index",
    )
    init.add_argument(
        "--quarantine", action="store_true", help="also create <table>_quarantine (for poisonPolicy: quarantine)"
    )
    init.set_defaults(func=cmd_init_db)

    schema = sub.add_parser(
        "schema", help="print the outbox table's DDL for a dialect (or the grants a component needs)",
        description="Print the outbox table's DDL for a dialect, the statements the harvester runs (--statements), "
        "or the GRANT statements a component needs (--grants). The dialect, table, poison policy and shards come "
        "from the flags, from -f FILE (as init-db takes them) or from --data-source's scheme; nothing connects.",
    )
    add_file_argument(schema, "the dialect, table, poison policy and shards")
    schema.add_argument("--data-source", help="a data source whose scheme names the dialect (nothing connects)")
    schema.add_argument("--binding", default=None, help="the dialect, by name: postgresql, sqlite, mysql, ...")
    schema.add_argument("--table", default=None, help="outbox table name, optionally schema-qualified (default outbox)")
    schema.add_argument(
        "--statements", action="store_true",
        help="also print every statement the harvester runs (mark, purge, reset, quarantine), compiled for it",
    )
    schema.add_argument(
        "--poison-policy", choices=[p.value for p in PoisonPolicy], default=None,
        help="with --statements or --grants: this policy's (quarantine adds the key filter and its table); "
        "default block",
    )
    schema.add_argument(
        "--shards", type=_positive, default=None,
        help="with --statements or --grants: for this many shards (the shard index, a shard's mark); default 1",
    )
    schema.add_argument(
        "--grants", choices=GRANT_COMPONENTS, metavar="COMPONENT",
        help="print the GRANT statements COMPONENT needs and no more: reaper, stasher, inbox or verify",
    )
    schema.add_argument("--role", help="with --grants: the role (on MySQL/MariaDB also user@host) to grant to")
    schema.set_defaults(func=cmd_schema)

    for extra in _extra_commands:
        extra(sub)
    return parser


def _register_extras(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from pyharvest._commands.acls import register as register_acls
    from pyharvest._commands.broker import register as register_broker
    from pyharvest._commands.inbox import register as register_inbox
    from pyharvest._commands.monitoring import register as register_monitoring
    from pyharvest._commands.quarantine import register as register_quarantine
    from pyharvest._commands.verify import register as register_verify
    from pyharvest._demo import register as register_demo

    register_demo(sub)
    register_verify(sub)
    register_inbox(sub)
    register_quarantine(sub)
    register_broker(sub)
    register_acls(sub)
    register_monitoring(sub)


# Sub-commands that live in their own modules.
_extra_commands: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [_register_extras]


def _unknown_command(word: str, commands: set[str]) -> int:
    import difflib

    close = difflib.get_close_matches(word, sorted(commands), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return error_exit(
        f"unknown command {word!r}; {hint}commands: {', '.join(sorted(commands))} "
        "(or 'reaper -f reaper.yaml' to run the harvester)",
        EXIT_USAGE,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    commands = {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}
    if argv and argv[0] not in commands and argv[0] not in ("-h", "--help", "--version"):
        if not argv[0].startswith("-"):
            return _unknown_command(argv[0], commands)
        argv.insert(0, "run")  # goharvest's form: 'reaper -f reaper.yaml'
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return run_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
