"""``reaper quarantine``: inspect and release keys parked behind a poison record.

    reaper quarantine list    -f reaper.yaml [--key K] [--json]
    reaper quarantine replay  -f reaper.yaml --key K
    reaper quarantine discard -f reaper.yaml --key K

``-f`` takes the data source, table and dialect (``binding``) from the harvester's file (environment
overrides applied), so that no password is on the command line; ``--data-source URL
[--table T] [--binding B]`` give them instead, or override the file's.

``list`` shows each parked key, the outbox record Kafka refused, the error and the number of
attempts. ``replay`` lifts the quarantine once the cause is fixed (topic created, size limit
raised): the key's records, the poison record first, flow again in order. ``discard``
deletes the poison record and lifts the quarantine: the key resumes with the record after it.
Both work while a harvester runs; it picks the key up at its next mark.

Exit status: 0 done, 1 the key is not quarantined (or a database error), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from pyharvest._commands.exits import EXIT_OK, EXIT_USAGE, error_exit, exception_exit
from pyharvest._commands.files import OutboxTarget, add_file_argument, outbox_target
from pyharvest._commands.helptext import plain
from pyharvest.core.config.settings import mask_data_source
from pyharvest.core.errors import HarvestError

if TYPE_CHECKING:
    from pyharvest.bindings.sql import SqlBinding

__all__ = ["cmd_quarantine", "register"]


def _binding(target: OutboxTarget) -> SqlBinding:
    from pyharvest.bindings.sql import create_binding

    return create_binding(target.data_source, target.table, target.binding)


def cmd_quarantine(args: argparse.Namespace) -> int:
    action = args.action
    if action in ("replay", "discard") and not args.key:
        return error_exit("--key is required", EXIT_USAGE, f"reaper quarantine {action}")
    try:
        target = outbox_target(args)
        binding = _binding(target)
    except HarvestError as e:
        return exception_exit(e, "reaper quarantine")
    where = f"outbox {target.table!r} at {mask_data_source(target.data_source)}"
    try:
        if action == "list":
            entries = binding.quarantined(args.key)
            if args.json:
                for entry in entries:
                    print(json.dumps({
                        "key": entry.key,
                        "record_id": entry.record_id,
                        "topic": entry.topic,
                        "attempts": entry.attempts,
                        "quarantine_time": entry.quarantine_time.isoformat() if entry.quarantine_time else None,
                        "error": entry.error,
                    }))
            elif not entries:
                print(f"no quarantined keys in {where}")
            else:
                print(f"{len(entries)} quarantined key(s) in {where}:")
                for entry in entries:
                    when = entry.quarantine_time.isoformat(timespec="seconds") if entry.quarantine_time else "?"
                    print(
                        f"  key {entry.key!r}: record {entry.record_id} (topic {entry.topic!r}) "
                        f"after {entry.attempts} attempts at {when}: {entry.error}"
                    )
            return EXIT_OK
        if action == "replay":
            if not binding.replay(args.key):
                return error_exit(f"key {args.key!r} is not quarantined in {where}", prog="reaper quarantine replay")
            print(f"replayed key {args.key!r}: its records will be published again, in order")
            return EXIT_OK
        discarded = binding.discard(args.key)
        if discarded is None:
            return error_exit(f"key {args.key!r} is not quarantined in {where}", prog="reaper quarantine discard")
        print(
            f"discarded record {discarded.record_id} of key {args.key!r} (topic {discarded.topic!r}); "
            "the key's later records will be published"
        )
        return EXIT_OK
    finally:
        binding.dispose()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``quarantine`` to ``reaper``'s sub-commands."""
    p = subparsers.add_parser(
        "quarantine",
        help="list, replay or discard keys parked behind a poison record (poisonPolicy: quarantine)",
        description=plain("\n\n".join(__doc__.split("\n\n")[2:4])) if __doc__ else None,
    )
    p.add_argument("action", choices=("list", "replay", "discard"), help="what to do")
    add_file_argument(p, "the data source, table and dialect (binding)")
    p.add_argument("--data-source", help="SQLAlchemy URL (or a libpq key=value string); without -f, required")
    p.add_argument("--table", help="outbox table name, optionally schema-qualified (default: outbox)")
    p.add_argument("--binding", default=None, help="the dialect, by name (default: the one the URL's scheme names)")
    p.add_argument("--key", default=None, help="the key (required for replay and discard)")
    p.add_argument("--json", action="store_true", help="list: one JSON object per line")
    p.set_defaults(func=cmd_quarantine)
