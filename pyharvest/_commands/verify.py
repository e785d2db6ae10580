"""``reaper verify``: read a topic back and check it against the records that were stashed.

    reaper verify --bootstrap-servers localhost:9092 --topic orders --expected expected.jsonl
                  [--identity value|header:NAME] [--timeout 30]
    reaper verify -f reaper.yaml --topic orders --expected expected.jsonl

``-f`` reads Kafka's properties (``bootstrap.servers``, SASL, TLS) from the ``harvest:`` (or
``inbox:``) section's ``baseKafkaConfig``, environment overrides applied, so that no password
is on the command line; ``--bootstrap-servers`` overrides the file's.

``--expected`` is a JSON-lines file (``-`` for stdin), one object per stashed record, in
the order the records were stashed (per key, the causal order)::

    {"key": "order-17", "id": "created"}
    {"key": "order-17", "id": "paid"}

``key`` is the Kafka key (a string); ``id`` is what identifies the message, compared as
UTF-8 bytes with what ``--identity`` picks from each message read: its value (the default)
or the value of header NAME (``--identity header:NAME``). ``"id": null`` matches a
tombstone or a missing header. Blank lines are ignored.

Prints the report; exits 0 if nothing was lost, reordered or unexpected (duplicates are
allowed), 1 otherwise, 2 on bad usage (unreadable or malformed file, bad identity).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Any

from pyharvest._commands.exits import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, error_exit
from pyharvest._commands.files import add_file_argument
from pyharvest.verify import VerifyError, parse_identity, verify_topic

__all__ = ["cmd_verify", "read_expected", "register"]


class ExpectedFileError(ValueError):
    """The ``--expected`` file is not the JSON lines ``{"key": ..., "id": ...}`` it should be."""


def read_expected(stream: IO[str], name: str = "<expected>") -> list[tuple[str, str | None]]:
    """Parse JSON lines of ``{"key": str, "id": str | null}``; errors name the line."""
    out: list[tuple[str, str | None]] = []
    for n, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            obj: Any = json.loads(line)
        except json.JSONDecodeError as e:
            raise ExpectedFileError(f"{name}:{n}: not JSON: {e.msg}") from None
        if not isinstance(obj, dict) or "key" not in obj or "id" not in obj:
            raise ExpectedFileError(
                f'{name}:{n}: expected an object {{"key": ..., "id": ...}}, got {line.strip()[:80]}'
            )
        key, ident = obj["key"], obj["id"]
        if not isinstance(key, str):
            raise ExpectedFileError(f"{name}:{n}: key must be a string, got {key!r}")
        if ident is not None and not isinstance(ident, str):
            raise ExpectedFileError(f"{name}:{n}: id must be a string or null, got {ident!r}")
        out.append((key, ident))
    return out


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        parse_identity(args.identity)
        if args.expected == "-":
            expected = read_expected(sys.stdin, "<stdin>")
        else:
            with open(args.expected, encoding="utf-8") as f:
                expected = read_expected(f, args.expected)
    except (OSError, ExpectedFileError, VerifyError) as e:
        return error_exit(str(e), EXIT_USAGE, "reaper verify")
    properties: dict[str, object] = {}
    if args.file:
        from pyharvest._commands.files import kafka_properties

        properties = kafka_properties(args.file)
    servers = args.bootstrap_servers or properties.pop("bootstrap.servers", None)
    properties.pop("bootstrap.servers", None)
    if not servers:
        return error_exit("give -f FILE (with bootstrap.servers) or --bootstrap-servers HOST:PORT", EXIT_USAGE,
                          "reaper verify")
    try:
        report = verify_topic(
            str(servers), args.topic, expected, identity=args.identity, timeout=args.timeout,
            consumer_config=properties,
        )
    except VerifyError as e:
        return error_exit(str(e), EXIT_FAILURE, "reaper verify")
    print(report)
    return EXIT_OK if report.ok else EXIT_FAILURE


_EPILOG = """\
FILE is JSON lines, one per stashed record, in stash order (per key, causal order):
  {"key": "order-17", "id": "created"}
  {"key": "order-17", "id": "paid"}
"id" (a string, compared as UTF-8 bytes; null for a tombstone or missing header) is
matched against what --identity picks from each message.

exit status: 0 ok, 1 lost/reordered/unexpected (or unreadable topic), 2 bad usage
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``verify`` to ``reaper``'s sub-commands."""
    p = subparsers.add_parser(
        "verify",
        help="check a topic against the records stashed: nothing lost, reordered or unexpected",
        description="Read a topic from the beginning and check it against the records that were stashed:\n"
        "nothing lost, nothing reordered, nothing unexpected (one-off duplicates are allowed).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_file_argument(p, "Kafka's properties (baseKafkaConfig)", "reaper.yaml or inbox.yaml")
    p.add_argument("--bootstrap-servers", metavar="HOST:PORT", help="Kafka bootstrap servers; without -f, required")
    p.add_argument("--topic", required=True, help="the topic to read, from the beginning of every partition")
    p.add_argument(
        "--expected", required=True, metavar="FILE",
        help='JSON lines {"key": ..., "id": ...} in stash order ("-" for stdin)',
    )
    p.add_argument(
        "--identity", default="value", metavar="value|header:NAME",
        help="what identifies a message: its value (default) or a header's value",
    )
    p.add_argument(
        "--timeout", type=float, default=30.0, metavar="S",
        help="stop reading after this many seconds (default 30); what is missing then is lost",
    )
    p.set_defaults(func=cmd_verify)
