"""A ``reaper`` process for tests that watch it from outside (a browser, Prometheus): started
from a configuration mapping, its operations server found from its log, stopped by signal.

Started as ``benchmarks.children`` starts children: the installed package is imported, not
the checkout's sources.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.children import python_module

__all__ = ["ReaperProcess"]

_LISTENING = re.compile(r"metrics and health listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)")


class ReaperProcess:
    def __init__(self, config: dict[str, Any], folder: Path, name: str = "reaper") -> None:
        self.folder = folder
        self.config_path = folder / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = folder / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            python_module("pyharvest", "-f", self.config_path.name),  # as an operator types it, in its folder
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=folder,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ops_url(self, timeout: float = 60.0) -> str:
        """The operations server's base URL, once its start-up line is logged."""
        deadline = time.monotonic() + timeout
        while True:
            found = _LISTENING.search(self.log())
            if found:
                return f"http://127.0.0.1:{found.group(2)}"
            assert self.proc.poll() is None, f"reaper exited ({self.proc.returncode}):\n{self.log()}"
            assert time.monotonic() < deadline, f"reaper logged no metrics address within {timeout}s:\n{self.log()}"
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal it and wait for it to exit (killed after ``timeout``); its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> ReaperProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
