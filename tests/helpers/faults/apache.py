"""A private Apache Kafka for a fault test: its own JVM, port and data directory, started with
the same script as ``make kafka`` (``.ci/kafka/kafka``), so that a test may SIGKILL, SIGSTOP or
restart it without disturbing the session's broker that other tests share.

>>> with ApacheKafka(tmp_path / "kafka") as kafka:
...     kafka.kill()        # SIGKILL the JVM; kafka.start() brings it back on its data
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from types import TracebackType

from pyharvest.bindings.kafka.embedded import free_port
from tests.helpers.fixtures.kafka import KAFKA_SCRIPT

__all__ = ["ApacheKafka"]


class ApacheKafka:
    """One single-node Apache Kafka in ``data_dir``, listening on ``port`` (a free one by
    default) and advertising ``advertised_port`` (``port`` by default: a proxy there sees every
    connection)."""

    def __init__(self, data_dir: Path, port: int | None = None, advertised_port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self._env = {
            **os.environ,
            "KAFKA_PORT": str(self.port),
            "KAFKA_CONTROLLER_PORT": str(free_port()),
            "KAFKA_ADVERTISED_PORT": str(self.advertised_port),
            "KAFKA_DIR": str(self.data_dir),
            "KAFKA_HEAP": "512m",
            "PYTHON": os.environ.get("PYHARVEST_KAFKA_PYTHON", _python()),
        }

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.advertised_port}"

    @property
    def listener(self) -> tuple[str, int]:
        """Where the broker really listens (what a proxy forwards to)."""
        return "127.0.0.1", self.port

    def _run(self, command: str, timeout: float = 300) -> str:
        done = subprocess.run(["bash", str(KAFKA_SCRIPT), command], env=self._env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{KAFKA_SCRIPT} {command} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> ApacheKafka:
        """Start it (on its existing data after a kill) and return once it serves."""
        self._run("start")
        return self

    def stop(self) -> None:
        """SIGTERM and wait; the data stays for :meth:`start`."""
        self._run("stop")

    @property
    def pid(self) -> int:
        return int(self._run("pid").strip())

    def kill(self) -> None:
        """SIGKILL the JVM and wait until it is gone: a crash, with no controlled shutdown."""
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid)

    def pause(self) -> None:
        """SIGSTOP the JVM: connections stay open and nothing answers."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def clean(self) -> None:
        """Stop it and delete its data directory."""
        self._run("clean")

    def log_tail(self, lines: int = 40) -> str:
        """The end of the broker's log, for a failure message."""
        log = self.data_dir / "logs" / "server.log"
        try:
            return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no broker log: {e})"

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.clean()
        else:  # a failed test keeps the broker's data and log (pytest keeps its tmp_path)
            self.stop()


def _python() -> str:
    import sys

    return sys.executable


def _wait_gone(pid: int, timeout: float = 30.0) -> None:
    from tests.helpers.waiting import wait_until

    def gone() -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        return state in ("Z", "X")  # dead, not yet reaped by its parent

    wait_until(gone, timeout, f"pid {pid} to be gone after SIGKILL", interval=0.05)
