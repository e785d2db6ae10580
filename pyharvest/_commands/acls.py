"""``reaper acls``: print the Kafka ACLs a configuration needs, as ``kafka-acls.sh`` commands.

    reaper acls -f reaper.yaml --topic orders --topic payments      the harvester's ACLs
    reaper acls -f inbox.yaml                                       the inbox's
    reaper acls -f reaper.yaml --principal User:outbox --topic-prefix billing.

The file's ``harvest:`` section gives the harvester's (its leader group and topic, and with
``delivery: exactly-once`` its transactional ids and progress topic; ``groupProtocol:
consumer`` adds altering the group's configuration), its ``inbox:`` section the inbox's (its
group and topics); a file with both gets both. The outbox's topics are named by its records,
not by the file: ``--topic`` (repeated) and ``--topic-prefix`` say which. The principal is
``--principal``, else the SASL user of the file's ``baseKafkaConfig``. Each command is
preceded by a comment saying what the ACL is for; the output runs as a shell script once an
administrator's client settings are in the file ``--command-config`` names.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from pyharvest._commands.exits import EXIT_OK, EXIT_USAGE, error_exit
from pyharvest._commands.files import add_file_argument

__all__ = ["acl_script", "cmd_acls", "register"]


def acl_script(
    sections: Mapping[str, Any],
    *,
    principal: str | None = None,
    topics: list[str] | None = None,
    topic_prefixes: list[str] | None = None,
    create_topics: bool = True,
    command_config: str = "admin.properties",
) -> str:
    """The ``kafka-acls.sh`` commands for a configuration file's sections (environment
    overrides applied), as ``reaper acls`` prints them."""
    from pyharvest.core.config.kafka_acls import Acl, harvest_acls, inbox_acls, principal_of
    from pyharvest.core.config.settings import Config, resolve_section
    from pyharvest.core.errors import ConfigError
    from pyharvest.inbox import InboxConfig

    parts: list[tuple[str, Mapping[str, object], list[Acl], str]] = []
    if isinstance(sections.get("harvest"), Mapping):
        cfg = resolve_section(Config.from_mapping(sections["harvest"]))
        acls = harvest_acls(cfg, topics or (), topic_prefixes or (), create_topics=create_topics)
        what = (
            f"the harvester of leader group {cfg.leader_group_id!r} ({cfg.delivery}, {cfg.shards} shard"
            f"{'s' if cfg.shards > 1 else ''}, groupProtocol {cfg.group_protocol})"
        )
        parts.append(("harvest", cfg.base_kafka_config, acls, what))
    if isinstance(sections.get("inbox"), Mapping):
        inbox = InboxConfig.from_mapping(sections["inbox"]).resolve()
        what = f"the inbox of group {inbox.group_id!r}"
        parts.append(("inbox", inbox.base_kafka_config, inbox_acls(inbox.group_id, inbox.topics), what))
    if not parts:
        raise ConfigError("", "the file has neither a 'harvest:' nor an 'inbox:' section to print the ACLs of")
    lines: list[str] = []
    for section, kafka_config, acls, what in parts:
        who = principal or principal_of(kafka_config)
        if who is None:
            raise ConfigError(
                f"{section}.baseKafkaConfig",
                "names no SASL user (PLAIN or SCRAM) to grant the ACLs to: give "
                "--principal User:NAME (the principal the broker maps this client's credentials to)",
            )
        servers = str(kafka_config.get("bootstrap.servers", "localhost:9092"))
        lines.append(f"# Kafka ACLs of {what}, for {who}")
        for acl in acls:
            lines.append(f"# {acl.describe()}: {acl.why}")
            lines.append(acl.command(who, servers, command_config))
        if section == "harvest" and not (topics or topic_prefixes):
            sample = Acl("topic", "TOPIC", ("Write",), "")
            lines.append("# Write on each topic the outbox's records name (give --topic NAME or --topic-prefix P):")
            lines.append("# " + sample.command(who, servers, command_config))
    return "\n".join(lines) + "\n"


def cmd_acls(args: argparse.Namespace) -> int:
    from pyharvest._commands.files import read_file_sections

    if not args.file:
        return error_exit(
            "give -f FILE: the reaper.yaml (or inbox.yaml) to print the ACLs of", EXIT_USAGE, "reaper acls"
        )
    print(
        acl_script(
            read_file_sections(args.file),
            principal=args.principal,
            topics=args.topic,
            topic_prefixes=args.topic_prefix,
            create_topics=not args.no_create,
            command_config=args.command_config,
        ),
        end="",
    )
    return EXIT_OK


def _principal(text: str) -> str:
    if ":" not in text or not text.split(":", 1)[1]:
        raise argparse.ArgumentTypeError(f"expected a principal like User:NAME, got {text!r}")
    return text


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``acls`` to ``reaper``'s sub-commands."""
    p = subparsers.add_parser(
        "acls",
        help="print the kafka-acls.sh commands that grant a configuration's Kafka ACLs",
        description="Print the kafka-acls.sh commands that grant the Kafka ACLs a configuration file needs, and no "
        "more: the harvester's (harvest: section) and the inbox's (inbox: section). The outbox's topics are named "
        "by its records: give them with --topic or --topic-prefix.",
    )
    add_file_argument(p, "the harvest: and inbox: sections", "reaper.yaml or inbox.yaml")
    p.add_argument(
        "--principal",
        type=_principal,
        metavar="User:NAME",
        help="the principal to grant (default: User:<sasl.username> of baseKafkaConfig)",
    )
    p.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME",
        help="a topic the outbox's records name (repeat for each)",
    )
    p.add_argument(
        "--topic-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="every topic starting with PREFIX (a prefixed ACL; repeat for each)",
    )
    p.add_argument(
        "--no-create",
        action="store_true",
        help="the leader topic (and progress topic) are created beforehand: leave out Create",
    )
    p.add_argument(
        "--command-config",
        default="admin.properties",
        metavar="FILE",
        help="kafka-acls.sh's --command-config: an administrator's client settings (default admin.properties)",
    )
    p.set_defaults(func=cmd_acls)
