"""A Kafka-aware loopback proxy that can answer Metadata requests itself with a cluster of no
brokers: what a lone Apache Kafka node answers for a moment after its controller fenced it
(say, once it resumes from a freeze longer than ``broker.session.timeout.ms``).

librdkafka then forgets the only broker it knew, and it has already dropped its bootstrap
servers, so it has nothing to connect to until it bootstraps again
(``metadata.recovery.rebootstrap.trigger.ms``, 5 minutes by default): a leader consumer never
rejoins its group, a producer's messages all time out. That is the stuck client the heal
replaces (:mod:`pyharvest.core.healing.stuck_clients`); this proxy makes it happen on cue instead of one run
in five under CPU load (``tests/test_broker_faults.py``).

It frames the Kafka protocol both ways (a 4-byte size, then the message), so that an answer
of its own goes between two of the broker's; everything but a Metadata request (API key 3) of a
flexible version (9 and up, what librdkafka sends to Kafka 4) passes through untouched.

>>> with MetadataProxy(upstream=("127.0.0.1", 9092)) as proxy:   # the broker advertises proxy.port
...     proxy.hide_brokers(); ...; proxy.show_brokers()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from types import TracebackType
from typing import Self

__all__ = ["MetadataProxy"]

METADATA = 3
LEADER_NOT_AVAILABLE = 5


def _uvarint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _requested_topics(request: bytes, version: int) -> list[bytes]:
    """The topic names of a flexible Metadata request (``request`` from its API key on)."""
    at = 8  # api_key, api_version, correlation_id
    (client_id_len,) = struct.unpack(">h", request[at:at + 2])
    at += 2 + max(0, client_id_len)
    tagged, at = _uvarint(request, at)
    for _ in range(tagged):
        _, at = _uvarint(request, at)
        size, at = _uvarint(request, at)
        at += size
    count, at = _uvarint(request, at)
    names = []
    for _ in range(max(0, count - 1)):  # a compact array: 0 is null (every topic), n + 1 is n topics
        if version >= 10:
            at += 16  # topic_id
        size, at = _uvarint(request, at)
        if size:
            names.append(request[at:at + size - 1])
            at += size - 1
        tagged, at = _uvarint(request, at)
        for _ in range(tagged):
            _, at = _uvarint(request, at)
            size, at = _uvarint(request, at)
            at += size
    return names


def _compact(data: bytes) -> bytes:
    assert len(data) < 127
    return bytes([len(data) + 1]) + data


def _brokerless_metadata(version: int, correlation_id: int, topics: list[bytes]) -> bytes:
    """A MetadataResponse (flexible versions 9-13) listing no broker and no controller, and each
    topic asked for as having no leader (a response with neither brokers nor topics is retried,
    not believed)."""
    body = struct.pack(">i", correlation_id) + b"\x00"  # response header v1: no tagged fields
    body += struct.pack(">i", 0)  # throttle_time_ms
    body += b"\x01"  # brokers: an empty compact array
    body += b"\x00"  # cluster_id: null
    body += struct.pack(">i", -1)  # controller_id
    body += bytes([len(topics) + 1])
    for name in topics:
        body += struct.pack(">h", LEADER_NOT_AVAILABLE) + _compact(name)
        if version >= 10:
            body += bytes(16)  # topic_id
        body += b"\x00"  # is_internal
        body += b"\x01"  # partitions: none
        body += struct.pack(">i", -2147483648)  # topic_authorized_operations: not asked
        body += b"\x00"  # no tagged fields
    if version <= 10:
        body += struct.pack(">i", -2147483648)  # cluster_authorized_operations: not asked
    if version >= 13:
        body += struct.pack(">h", 0)  # error_code
    body += b"\x00"  # no tagged fields
    return struct.pack(">i", len(body)) + body


async def _frame(reader: asyncio.StreamReader) -> bytes | None:
    try:
        size = await reader.readexactly(4)
        return size + await reader.readexactly(struct.unpack(">i", size)[0])
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class MetadataProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream`` frame by frame; while :meth:`hide_brokers`
    is in force, answer Metadata requests with no broker instead of forwarding them."""

    def __init__(self, upstream: tuple[str, int], listen_port: int = 0) -> None:
        self.upstream = upstream
        self._listen_port = listen_port
        self.port = 0
        self.hiding = False
        #: Metadata requests answered with no broker so far.
        self.lies = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._clients: set[asyncio.StreamWriter] = set()

    @property
    def connections(self) -> int:
        """The clients' connections open through the proxy now: none once every client has
        forgotten the brokers it knew (librdkafka closes a connection to a broker the metadata
        no longer lists, and has nothing left to connect to)."""
        return len(self._clients)

    def hide_brokers(self) -> None:
        self.hiding = True

    def show_brokers(self) -> None:
        self.hiding = False

    def __enter__(self) -> Self:
        self._loop = asyncio.new_event_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._listen_port))
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._loop.run_forever, name="MetadataProxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(sock), self._loop).result(10)
        return self

    async def _start(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._handle, sock=sock)

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        loop = self._loop
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        loop.close()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for w in list(self._writers):
            w.transport.abort()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, up_writer))
        self._clients.add(client_writer)
        to_client = asyncio.Lock()  # whole frames only, the broker's and ours

        async def upstream() -> None:
            while (frame := await _frame(client_reader)) is not None:
                api_key, version, correlation_id = struct.unpack(">hhi", frame[4:12])
                topics = _requested_topics(frame[4:], version) if api_key == METADATA and 9 <= version <= 13 else []
                if self.hiding and topics:
                    self.lies += 1
                    async with to_client:
                        client_writer.write(_brokerless_metadata(version, correlation_id, topics))
                        await client_writer.drain()
                    continue
                up_writer.write(frame)
                await up_writer.drain()

        async def downstream() -> None:
            while (frame := await _frame(up_reader)) is not None:
                async with to_client:
                    client_writer.write(frame)
                    await client_writer.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            self._clients.discard(client_writer)
            for w in (client_writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()
            with contextlib.suppress(Exception):
                await asyncio.gather(*tasks, return_exceptions=True)
