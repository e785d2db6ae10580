"""A Kafka broker behind a :class:`~tests.faults.proxy.FaultProxy`.

Kafka clients only use ``bootstrap.servers`` for their first connection: after that they
connect wherever the cluster metadata says the brokers are. A proxy in front of a broker
therefore only sees all traffic if the broker *advertises the proxy's address*. So the
broker listens on port X, advertises port Y, and the proxy forwards Y -> X:

    client --(Y)--> FaultProxy --(X)--> broker (advertises 127.0.0.1:Y)

>>> with proxied_broker() as (broker, proxy):
...     producer = Producer({"bootstrap.servers": broker.bootstrap_servers})  # the proxy
...     proxy.blackhole()
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator

from pyharvest.bindings.kafka.embedded import EmbeddedBroker, EmbeddedBrokerError, broker_binary, free_port

from tests.faults.proxy import FaultProxy

__all__ = ["AdvertisingBroker", "proxied_broker"]


def _port_open(host: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class AdvertisingBroker(EmbeddedBroker):
    """An :class:`EmbeddedBroker` that listens on ``port`` but advertises ``advertised_port``.

    :attr:`bootstrap_servers` is the advertised address, where clients should go. ``start``
    repeats the parent's, with the advertised URL changed: the parent takes no advertised
    port yet (see ``docs/verify.md`` for the one-parameter change that would retire this).
    """

    def __init__(self, advertised_port: int, host: str = "127.0.0.1", port: int | None = None, start_timeout: float = 20.0) -> None:
        super().__init__(host=host, port=port, start_timeout=start_timeout)
        self.advertised_port = advertised_port

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.advertised_port}"

    @property
    def listener(self) -> tuple[str, int]:
        """Where the broker really listens (what the proxy forwards to)."""
        return self.host, self.port

    def start(self) -> AdvertisingBroker:
        if self.running:
            return self
        if _port_open(self.host, self.port):
            raise EmbeddedBrokerError(f"port {self.port} on {self.host} is already in use")
        listen = f"tcp://{self.host}:{self.port}"
        advertise = f"tcp://{self.host}:{self.advertised_port}"
        # Kept open for the broker's lifetime, closed and removed by the parent's stop().
        self._log_file = tempfile.NamedTemporaryFile(prefix="pyharvest-broker-", suffix=".log", delete=False)  # noqa: SIM115
        self._proc = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", listen, "--advertised-listener-url", advertise,
             "--storage-engine", "memory://tansu/"],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": os.environ.get("PYHARVEST_BROKER_LOG", "warn")},
            start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout
        while not _port_open(self.host, self.port):
            if self._proc.poll() is not None:
                output = self._read_log()
                self._proc = None
                raise EmbeddedBrokerError(f"embedded broker exited at start-up: {output[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedBrokerError(f"embedded broker did not listen on {listen} within {self.start_timeout}s")
            time.sleep(0.05)
        return self


@contextlib.contextmanager
def proxied_broker(**proxy_options: object) -> Iterator[tuple[AdvertisingBroker, FaultProxy]]:
    """Start a proxy on a free port Y and a broker on X advertising Y; stop both after.

    Clients use ``broker.bootstrap_servers`` (the proxy); every byte, including the
    connections opened after the metadata exchange, passes through ``proxy``.
    """
    listen_port = free_port()
    with contextlib.ExitStack() as stack:
        proxy = stack.enter_context(FaultProxy(upstream=("127.0.0.1", listen_port), **proxy_options))  # type: ignore[arg-type]
        broker = stack.enter_context(AdvertisingBroker(advertised_port=proxy.port, port=listen_port))
        yield broker, proxy
