"""`reaper demo`: the README's first command, end to end on the embedded default."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from benchmarks.children import python_module

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


def orphan_brokers() -> set[str]:
    """Embedded brokers whose parent is gone (reparented to init): what a leak would look like."""
    pids = subprocess.run(["pgrep", "-f", "tansu.*broker"], capture_output=True, text=True).stdout.split()
    orphans = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == "1":
                    orphans.add(pid)
        except OSError:
            pass
    return orphans


def test_demo_runs_on_the_embedded_default_and_leaves_nothing_running():
    topic = f"demo-test-{uuid.uuid4().hex[:6]}"
    before = orphan_brokers()
    proc = subprocess.run(
        [*python_module("pyharvest"), "demo", "--records", "3000", "--keys", "50", "--topic", topic,
         "--group", f"{topic}-group"],
        capture_output=True, text=True, timeout=220,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout
    assert f"topic {topic!r}" in proc.stdout + proc.stderr  # named, so that nothing is left behind unnamed
    for line in ("records stashed   3000", "records received  3000", "lost              0", "order per key     held",
                 "verdict           OK"):
        assert line in out, out
    assert orphan_brokers() <= before, "the demo left its broker running"


def test_demo_says_what_it_does():
    proc = subprocess.run([*python_module("pyharvest"), "demo", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "every record arrived once and in order per key" in " ".join(proc.stdout.split())
    assert "--topic" in proc.stdout and "--group" in proc.stdout
    top = subprocess.run([*python_module("pyharvest"), "--help"], capture_output=True, text=True, timeout=60)
    assert "try the relay end to end" in top.stdout
