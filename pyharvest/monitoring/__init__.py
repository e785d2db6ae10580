"""The Grafana dashboard and the Prometheus alerting rules for pyharvest's metrics, shipped in
the package (the one copy: the documentation's site publishes these files, and CI checks them).

    reaper monitoring export DIR             write both files into DIR

or, from Python, :func:`export`; :func:`path` gives a file where it is installed.

* ``pyharvest-alerts.yml``: alerting rules for Prometheus' ``rule_files``;
* ``pyharvest-dashboard.json``: a Grafana dashboard to import (pick the Prometheus data source
  and the jobs).

Both use only the metrics a harvester serves at ``/metrics`` (docs/operations.md).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["ALERTS", "DASHBOARD", "FILES", "export", "path"]

ALERTS = "pyharvest-alerts.yml"
DASHBOARD = "pyharvest-dashboard.json"
#: The files this package holds, by name.
FILES = (ALERTS, DASHBOARD)


def path(name: str) -> Path:
    """The installed file ``name`` (one of :data:`FILES`)."""
    if name not in FILES:
        raise ValueError(f"no monitoring file {name!r}; the files are {', '.join(FILES)}")
    return Path(str(resources.files(__name__).joinpath(name)))


def export(directory: str | Path, *, overwrite: bool = False) -> list[Path]:
    """Write :data:`FILES` into ``directory`` (created if missing); return the paths written.
    A file already there is refused (:class:`FileExistsError`, naming it) unless ``overwrite``,
    so that a dashboard edited in place is not lost; nothing is written then."""
    target = Path(directory)
    written = [target / name for name in FILES]
    if not overwrite:
        present = [str(p) for p in written if p.exists()]
        if present:
            raise FileExistsError(f"already there: {', '.join(present)}; pass --overwrite to replace them")
    target.mkdir(parents=True, exist_ok=True)
    for name, out in zip(FILES, written, strict=True):
        out.write_bytes(resources.files(__name__).joinpath(name).read_bytes())
    return written
