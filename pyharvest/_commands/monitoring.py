"""``reaper monitoring export``: write out the Grafana dashboard and the Prometheus alerting rules.

    reaper monitoring export DIR [--overwrite]

Both files ship in the package (:mod:`pyharvest.monitoring`): ``pyharvest-alerts.yml`` for
Prometheus' ``rule_files`` and ``pyharvest-dashboard.json`` for Grafana's import. A file already
in DIR is kept, and the command fails naming it, unless ``--overwrite`` is given.
"""

from __future__ import annotations

import argparse

from pyharvest._commands.exits import EXIT_OK, EXIT_USAGE, error_exit
from pyharvest._commands.helptext import plain

__all__ = ["cmd_monitoring_export", "register"]


def cmd_monitoring_export(args: argparse.Namespace) -> int:
    from pyharvest.monitoring import export

    try:
        written = export(args.directory, overwrite=args.overwrite)
    except (FileExistsError, NotADirectoryError) as e:
        return error_exit(str(e), EXIT_USAGE)
    for out in written:
        print(out)
    return EXIT_OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``monitoring`` (and its ``export``) to ``reaper``'s sub-commands."""
    p = subparsers.add_parser(
        "monitoring",
        help="the Grafana dashboard and Prometheus alerting rules that ship with pyharvest",
        description="The Grafana dashboard and the Prometheus alerting rules that ship in the package.",
    )
    sub = p.add_subparsers(dest="monitoring_command", metavar="COMMAND", required=True)
    export = sub.add_parser(
        "export",
        help="write pyharvest-alerts.yml and pyharvest-dashboard.json into a directory",
        description=plain(__doc__.split("\n\n", 2)[2]) if __doc__ else None,
    )
    export.add_argument("directory", metavar="DIR", help="where to write them (created if missing)")
    export.add_argument("--overwrite", action="store_true", help="replace files already there")
    export.set_defaults(func=cmd_monitoring_export)
