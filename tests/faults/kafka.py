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
from collections.abc import Iterator

from pyharvest.bindings.kafka.embedded import EmbeddedBroker, free_port
from tests.faults.proxy import FaultProxy

__all__ = ["AdvertisingBroker", "proxied_broker"]


class AdvertisingBroker(EmbeddedBroker):
    """An :class:`EmbeddedBroker` that listens on ``port`` but advertises ``advertised_port``;
    :attr:`bootstrap_servers` is the advertised address, where clients should go."""

    def __init__(self, advertised_port: int, host: str = "127.0.0.1", port: int | None = None, start_timeout: float = 20.0) -> None:
        super().__init__(host=host, port=port, start_timeout=start_timeout, advertised_port=advertised_port)

    @property
    def listener(self) -> tuple[str, int]:
        """Where the broker really listens (what the proxy forwards to)."""
        return self.host, self.port


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
