"""A Kafka broker behind a :class:`~tests.helpers.faults.proxy.FaultProxy`.

Kafka clients only use ``bootstrap.servers`` for their first connection: after that they
connect wherever the cluster metadata says the brokers are. A proxy in front of a broker
therefore only sees all traffic if the broker *advertises the proxy's address*. So the
broker listens on port X, advertises port Y, and the proxy forwards Y -> X:

    client --(Y)--> FaultProxy --(X)--> broker (advertises 127.0.0.1:Y)

The broker is a private Apache Kafka (:class:`~tests.helpers.faults.apache.ApacheKafka`), or the
embedded one when the suite runs on it (``PYHARVEST_TEST_KAFKA=embedded``).

>>> with proxied_broker() as (broker, proxy):
...     producer = Producer({"bootstrap.servers": broker.bootstrap_servers})  # the proxy
...     proxy.blackhole()
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from pyharvest.bindings.kafka.embedded import EmbeddedBroker, free_port
from tests.helpers.faults.apache import ApacheKafka
from tests.helpers.faults.proxy import FaultProxy
from tests.helpers.fixtures.kafka import on_embedded_broker

__all__ = ["AdvertisingBroker", "Broker", "broker_advertising", "proxied_broker"]


class Broker(Protocol):
    @property
    def bootstrap_servers(self) -> str: ...


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
def broker_advertising(advertised_port: int, listen_port: int) -> Iterator[Broker]:
    """A broker of the suite's kind listening on ``listen_port`` and advertising
    ``advertised_port`` (start the proxy there first: the broker's readiness check goes
    through it); stopped and its data deleted after."""
    if on_embedded_broker():
        with AdvertisingBroker(advertised_port=advertised_port, port=listen_port) as embedded:
            yield embedded
        return
    with tempfile.TemporaryDirectory(prefix="pyharvest-kafka-") as data, \
            ApacheKafka(Path(data), port=listen_port, advertised_port=advertised_port) as apache:
        yield apache


@contextlib.contextmanager
def proxied_broker(**proxy_options: object) -> Iterator[tuple[Broker, FaultProxy]]:
    """Start a proxy on a free port Y and a broker on X advertising Y; stop both after.

    Clients use ``broker.bootstrap_servers`` (the proxy); every byte, including the
    connections opened after the metadata exchange, passes through ``proxy``.
    """
    listen_port = free_port()
    with contextlib.ExitStack() as stack:
        proxy = stack.enter_context(FaultProxy(upstream=("127.0.0.1", listen_port), **proxy_options))  # type: ignore[arg-type]
        broker = stack.enter_context(broker_advertising(proxy.port, listen_port))
        yield broker, proxy
