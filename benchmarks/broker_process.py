"""Which local process is the broker: the one listening on the bootstrap address's port.

The benchmarks report the broker's CPU per record. Matching processes by name worked while the
only broker was the embedded one (``tansu``); Apache Kafka is a ``java`` process like any other
JVM on the machine (another developer's broker among them), so the broker is found by its
listening socket instead (Linux ``/proc``; an empty set elsewhere or for a remote broker).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["broker_pids", "cpu_seconds"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_LISTEN = "0A"


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def broker_pids(bootstrap: str) -> set[int]:
    """The pids of the local processes listening on the port of ``bootstrap``'s first address."""
    port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
    sockets = {f"socket:[{i}]" for i in _listening_inodes(port)}
    pids: set[int] = set()
    if not sockets:
        return pids
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in sockets for fd in (proc / "fd").iterdir()):
                pids.add(int(proc.name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return pids


def cpu_seconds(pids: set[int]) -> float:
    """User plus system CPU seconds used so far by ``pids`` (those still running)."""
    total = 0.0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total
