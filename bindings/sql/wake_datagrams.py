"""Wake-up datagrams: how a writer's commit wakes an idle harvester where the database has no
``NOTIFY`` (MariaDB, MySQL, and every dialect without ``pyharvest_listener``).

Opt in by giving the reapers and the writers the same ``PYHARVEST_WAKE_ADDRESS``: one or more
``host:port`` (comma-separated). A reaper binds the first of them it can (one on its own host
that no other process holds) and its change feed (:mod:`pyharvest.bindings.sql.change_feed`)
wakes the harvester on each datagram naming its outbox; the stasher sends one datagram to
every address when a transaction that stashed into a quiet outbox commits
(:func:`pyharvest.stasher.notify.wake_on_commit`). UDP: the writer never waits for an answer,
and a datagram nobody receives is dropped. A lost wake-up costs its record the idle pause, at
most ``maxMarkBackoff``: polling still finds every row, so a writer that knows nothing of this
(a plain ``INSERT``) is harvested as before.

The datagram holds only the outbox's name: anyone who can reach the port can make the
harvester mark early, nothing more (a mark that finds nothing costs one query).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading

from pyharvest.core.errors import ConfigError
from pyharvest.core.telemetry.logs import one_line
from pyharvest.plugins.api import ListenerFactory, TableName

__all__ = ["WAKE_ADDRESS_ENV", "DatagramListener", "datagram_listener", "send_wake", "sender_counts", "wake_addresses"]

log = logging.getLogger("pyharvest.bindings.sql")

#: The environment variable both sides read: ``host:port[,host:port...]``; unset or empty: off.
WAKE_ADDRESS_ENV = "PYHARVEST_WAKE_ADDRESS"
#: Larger than any outbox name: a longer datagram is not ours.
_MAX_DATAGRAM = 1024

Address = tuple[str, int]


def wake_addresses(text: str | None = None) -> tuple[Address, ...]:
    """The addresses ``text`` (default: ``$PYHARVEST_WAKE_ADDRESS``) names, in order; empty when
    unset. ``host:port`` each, ``[v6]:port`` for an IPv6 literal; raises :class:`ConfigError`."""
    if text is None:
        text = os.environ.get(WAKE_ADDRESS_ENV, "")
    found: list[Address] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(WAKE_ADDRESS_ENV, f"expected host:port[,host:port...], got {item!r}")
        found.append((host, int(port)))
    return tuple(found)


def _resolve(address: Address) -> list[tuple[int, tuple[str, int]]]:
    """(family, socket address) for each of ``address``'s IPv4/IPv6 forms."""
    infos = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_DGRAM)
    families = (socket.AF_INET, socket.AF_INET6)
    return [(int(family), (str(sockaddr[0]), int(sockaddr[1]))) for family, _, _, _, sockaddr in infos
            if family in families]


class DatagramListener:
    """A bound UDP socket receiving one outbox's wake-ups; a
    :class:`~pyharvest.plugins.api.Listener`, used by the change feed's thread."""

    def __init__(self, addresses: tuple[Address, ...], table: TableName) -> None:
        self._name = str(table).encode()
        failures = []
        for address in addresses:
            for family, sockaddr in _resolve_or_none(address):
                sock = socket.socket(family, socket.SOCK_DGRAM)
                try:
                    sock.bind(sockaddr)
                except OSError as e:
                    sock.close()
                    failures.append(f"{address[0]}:{address[1]}: {e.strerror or e}")
                    continue
                sock.setblocking(False)
                self._sock = sock
                self.address = address
                log.info("listening for %s's wake-up datagrams on %s:%d", table, *address)
                return
        raise OSError(f"cannot bind any of {WAKE_ADDRESS_ENV}'s addresses ({'; '.join(failures) or 'none resolved'})")

    def wait(self, timeout: float) -> bool:
        readable, _, _ = select.select([self._sock], [], [], timeout)
        woken = False
        while readable:  # drain: wake-ups that came together count once
            try:
                data = self._sock.recv(_MAX_DATAGRAM)
            except BlockingIOError:
                break
            woken = woken or data == self._name
        return woken

    def close(self) -> None:
        self._sock.close()


def _resolve_or_none(address: Address) -> list[tuple[int, tuple[str, int]]]:
    try:
        return _resolve(address)
    except OSError:
        return []


def datagram_listener(table: TableName, addresses: tuple[Address, ...] | None = None) -> ListenerFactory | None:
    """What opens ``table``'s datagram listener; None when no wake address is configured."""
    chosen = wake_addresses() if addresses is None else addresses
    if not chosen:
        return None
    return lambda: DatagramListener(chosen, table)


class _Sender:
    """One process's sockets for sending wake-ups (one per address family), and the addresses
    resolved once per configuration: a commit never waits on a name look-up twice."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: dict[int, socket.socket] = {}
        self._resolved: dict[str, list[tuple[int, tuple[str, int]]]] = {}
        self._warned = False
        #: Datagrams sent, and sends that failed (counted for tests and benchmarks).
        self.sent = 0
        self.failed = 0

    def _targets(self, text: str) -> list[tuple[int, tuple[str, int]]]:
        targets = self._resolved.get(text)
        if targets is None:
            targets = []
            for address in wake_addresses(text):
                try:
                    targets.extend(_resolve(address)[:1])
                except OSError as e:
                    log.warning("%s: cannot resolve %s, no wake-ups sent there: %s", WAKE_ADDRESS_ENV, address[0], e)
            with self._lock:
                self._resolved[text] = targets
        return targets

    def _socket(self, family: int) -> socket.socket:
        sock = self._sockets.get(family)
        if sock is None:
            with self._lock:
                sock = self._sockets.get(family)
                if sock is None:
                    sock = socket.socket(family, socket.SOCK_DGRAM)
                    sock.setblocking(False)  # a full buffer drops the wake-up, never waits
                    self._sockets[family] = sock
        return sock

    def send(self, table: TableName, text: str) -> None:
        payload = str(table).encode()
        for family, sockaddr in self._targets(text):
            try:
                self._socket(family).sendto(payload, sockaddr)
                self.sent += 1
            except OSError as e:  # unreachable, buffer full: the harvester polls
                self.failed += 1
                level = logging.DEBUG if self._warned else logging.WARNING
                self._warned = True
                log.log(level, "could not send a wake-up for %s to %s:%d (the reaper will poll): %s",
                        table, sockaddr[0], sockaddr[1], one_line(e))


_sender = _Sender()


def send_wake(table: TableName, text: str | None = None) -> None:
    """Send ``table``'s wake-up to each address of ``text`` (default ``$PYHARVEST_WAKE_ADDRESS``);
    never raises for a network error, never blocks on one."""
    if text is None:
        text = os.environ.get(WAKE_ADDRESS_ENV, "")
    if text:
        _sender.send(table, text)


def sender_counts() -> tuple[int, int]:
    """(sent, failed) datagrams of this process so far."""
    return _sender.sent, _sender.failed
