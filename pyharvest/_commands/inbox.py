"""``reaper inbox``: run the exactly-once consumer beside a service, and look after its dead letters.

    reaper inbox -f inbox.yaml --handler billing.inbox:apply      run until SIGINT/SIGTERM
    reaper inbox -f inbox.yaml --batch-handler billing.inbox:apply_all   the same, a transaction's messages at once
    reaper inbox -f inbox.yaml --print-config                     the effective config, secrets masked
    reaper inbox -f inbox.yaml --init-db                          create the inbox's tables and exit
    reaper inbox -f inbox.yaml --dead-letters [--limit N]         list dead-lettered and parked messages
    reaper inbox -f inbox.yaml --replay [--topic T] [--key K]     ask the owning consumers to replay them

``--handler`` names a callable ``handler(tx, message)`` as ``package.module:attribute``
(the attribute may be dotted), imported from the current directory first, as uvicorn and
celery do; ``--batch-handler`` one called as ``handler(tx, messages)``. The file's ``inbox:``
section is described in ``docs/inbox.md``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from pyharvest._commands.exits import EXIT_FAILURE, EXIT_OK, error_exit
from pyharvest._commands.helptext import plain

__all__ = ["cmd_inbox", "load_handler", "main", "register"]

log = logging.getLogger("pyharvest.reaper")


def load_handler(spec: str, option: str = "--handler") -> Any:
    """Import ``package.module:attribute`` and return the attribute; ConfigError (naming
    ``option``) if it cannot.

    The current directory is searched first, as uvicorn and celery do: a console script's
    ``sys.path`` starts at its own folder, not at the application's."""
    import os

    from pyharvest.core.errors import ConfigError

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(option, f"expected 'package.module:function', got {spec!r}")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(option, f"cannot import {module_name!r}: {e}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(option, f"{module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ConfigError(option, f"{spec!r} is not callable")
    return obj


def cmd_inbox(args: argparse.Namespace) -> int:
    from pyharvest._commands.files import read_file_sections
    from pyharvest._commands.process import setup_logging
    from pyharvest.core.errors import ConfigError
    from pyharvest.inbox import Inbox, InboxFile, InboxTables

    # Environment overrides applied (PYHARVEST_INBOX__DATA_SOURCE=…): no password in the file or on the command line.
    cfg = InboxFile.from_mapping(read_file_sections(args.file))
    inbox_cfg = cfg.inbox.resolve()
    setup_logging(cfg.logging.numeric_level, cfg.logging.json)
    if args.print_config:
        import yaml

        check_inbox_config(inbox_cfg)

        print(yaml.safe_dump({"inbox": inbox_cfg.to_mapping(mask_secrets=True)}, sort_keys=False), end="")
        return EXIT_OK
    if args.init_db or args.dead_letters or args.replay:
        from pyharvest.bindings.sql.connect import create_engine, resolve

        url, dialect = resolve(inbox_cfg.data_source, inbox_cfg.binding)
        engine = create_engine(url, dialect)
        tables = InboxTables.build(inbox_cfg.checkpoint_table, inbox_cfg.dedupe_table, inbox_cfg.dead_letter_table)
        try:
            tables.create(engine)
            if args.dead_letters:
                return _print_dead_letters(engine, tables, inbox_cfg.group_id, args.limit)
            if args.replay:
                from pyharvest.inbox import request_replay

                with engine.begin() as conn:
                    n = request_replay(
                        conn,
                        tables.dead_letter,
                        inbox_cfg.group_id,
                        topic=args.topic,
                        key=None if args.key is None else args.key.encode(),
                    )
                which = " and ".join(
                    f"{what} {value!r}" for what, value in (("topic", args.topic), ("key", args.key)) if value
                )
                if n == 0 and which:
                    # A mistyped key or topic must not read as a replay that happened.
                    return error_exit(
                        f"nothing is stored for {which} in group {inbox_cfg.group_id!r}: no message to replay "
                        f"(`reaper inbox -f {shlex.quote(args.file)} --dead-letters` lists what is stored)",
                        EXIT_FAILURE,
                    )
                if n == 0:
                    print(f"nothing is stored in group {inbox_cfg.group_id!r}: no message to replay")
                    return EXIT_OK
                print(f"replay requested for {n} stored message(s); the consumers owning their partitions replay them")
                return EXIT_OK
            print("inbox tables are ready")
            return EXIT_OK
        finally:
            engine.dispose()
    if bool(args.handler) == bool(args.batch_handler):
        raise ConfigError(
            "--handler",
            "to run the inbox give one of --handler package.module:function (called per message) "
            "and --batch-handler package.module:function (called per transaction)",
        )
    batch_handler = load_handler(args.batch_handler, "--batch-handler") if args.batch_handler else None
    handler = load_handler(args.handler) if args.handler else None
    check_kafka(inbox_cfg)
    inbox = Inbox(inbox_cfg, handler, batch_handler=batch_handler)
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if not stopping.is_set():
            stopping.set()
            log.info("%s received: stopping (the open batch commits)", signal.Signals(signum).name)
        inbox.stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        log.info("inbox starting with %s", inbox_cfg)
        inbox.run()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return EXIT_OK


def check_inbox_config(cfg: Any) -> None:
    """What ``reaper inbox`` checks before it connects: the data source and its dialect, and
    the consumer's Kafka properties (the tables' names ``resolve()`` checked already)."""
    from pyharvest.bindings.kafka.inbox_consumer import inbox_consumer_config
    from pyharvest.bindings.kafka.preflight import check_properties
    from pyharvest.bindings.sql.connect import resolve
    from pyharvest.core.config.kafka_origins import explain_refusal
    from pyharvest.core.errors import KafkaPropertyError

    resolve(cfg.data_source, cfg.binding)
    try:
        check_properties("consumer", inbox_consumer_config(cfg.base_kafka_config, cfg.group_id), consumer=True)
    except KafkaPropertyError as e:
        sections = [("inbox.baseKafkaConfig", cfg.base_kafka_config)]
        raise explain_refusal(e, sections, {"group.id": "inbox.groupID"}) from None


def check_kafka(cfg: Any) -> None:
    """Fail fast, as ``reaper`` does, when librdkafka refuses the consumer's configuration
    (naming the key) or no broker answers within the start-up deadline; warn of a topic that
    does not exist yet (the consumer waits for it)."""
    from pyharvest.bindings.kafka.inbox_consumer import inbox_consumer_config
    from pyharvest.bindings.kafka.preflight import check_consumer
    from pyharvest.core.config.kafka_origins import explain_refusal
    from pyharvest.core.errors import KafkaPropertyError

    try:
        topics = check_consumer(inbox_consumer_config(cfg.base_kafka_config, cfg.group_id))
    except KafkaPropertyError as e:
        sections = [("inbox.baseKafkaConfig", cfg.base_kafka_config)]
        raise explain_refusal(e, sections, {"group.id": "inbox.groupID"}) from None
    missing = [t for t in cfg.topics if t not in topics]
    if missing:
        log.warning("topic(s) %s do not exist yet, or the inbox's principal may not read them (its first poll "
                    "says which); the inbox consumes them once they do", ", ".join(missing))


def _print_dead_letters(engine: Any, tables: Any, group_id: str, limit: int) -> int:
    from pyharvest.inbox import list_dead_letters

    with engine.connect() as conn:
        letters = list_dead_letters(conn, tables.dead_letter, group_id, limit)
    for letter in letters:
        m = letter.message
        flag = " (replay requested)" if letter.replay_requested else ""
        print(
            f"#{letter.id} {letter.status:6} {m.topic}[{m.partition}]@{m.offset} key={m.key_text!r} "
            f"delivery={m.delivery_id}{flag}"
        )
        if letter.error:
            print("    " + letter.error.strip().splitlines()[-1])
    print(f"{len(letters)} stored message(s)" + (" (limit reached)" if len(letters) >= limit else ""))
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "inbox",
        help="run the exactly-once consumer (apply Kafka messages to the database with a handler)",
        description=plain(__doc__) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-f", "--file", required=True, help="configuration file with an 'inbox:' section")
    p.add_argument(
        "--handler", metavar="MODULE:FUNCTION",
        help="the handler, as package.module:function, imported from the current directory first "
        "(then PYTHONPATH and the installed packages)",
    )
    p.add_argument(
        "--batch-handler", metavar="MODULE:FUNCTION",
        help="instead of --handler: one given a transaction's messages, package.module:function "
        "(imported as --handler is)",
    )
    p.add_argument("--print-config", action="store_true", help="print the effective config (secrets masked) and exit")
    p.add_argument("--init-db", action="store_true", help="create the inbox's tables (idempotent) and exit")
    p.add_argument("--dead-letters", action="store_true", help="list dead-lettered and parked messages and exit")
    p.add_argument("--limit", type=int, default=100, help="with --dead-letters: at most this many (default 100)")
    p.add_argument("--replay", action="store_true", help="ask the owning consumers to replay stored messages, and exit")
    p.add_argument("--topic", help="with --replay: only this topic")
    p.add_argument("--key", help="with --replay: only this key (UTF-8)")
    p.set_defaults(func=cmd_inbox)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyharvest._commands.inbox …``: the same as ``reaper inbox …``."""
    from pyharvest._commands.process import run_command

    parser = argparse.ArgumentParser(prog="python -m pyharvest._commands.inbox")
    register(parser.add_subparsers())
    try:
        args = parser.parse_args(["inbox", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as e:
        return int(e.code or 0)
    return run_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
