"""A loopback TCP proxy that injects network faults between a client and a server.

Tests put it in front of PostgreSQL, MariaDB or a Kafka broker and then, at the moment
they choose, make the network slow (:meth:`FaultProxy.set_latency`), cut it
(:meth:`~FaultProxy.drop_connections`, :meth:`~FaultProxy.reset_connections`), make it
silently swallow traffic (:meth:`~FaultProxy.blackhole`: the nastiest failure, since
nothing errors until a timeout fires), or turn new connections away
(:meth:`~FaultProxy.refuse`); :meth:`~FaultProxy.heal` undoes all of it. Every control
call has taken effect when it returns.

It runs an asyncio loop in one daemon thread; it listens on 127.0.0.1 only; it holds at
most ``max_connections`` connections and reads at most ``chunk_size`` bytes per direction
at a time (asyncio's stream limits bound the rest), so a misbehaving test cannot exhaust
memory. Used as a context manager it starts and stops cleanly: on stop every connection
is reset (so none lingers in TIME_WAIT) and the listening port is closed.

>>> with FaultProxy(upstream=("127.0.0.1", 5432)) as proxy:
...     host, port = proxy.address      # connect the client here
...     proxy.blackhole(); ...; proxy.heal()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

__all__ = ["FaultProxy", "FaultProxyError", "ProxyStats"]

LOOPBACK = "127.0.0.1"
T = TypeVar("T")


class FaultProxyError(RuntimeError):
    """The proxy could not start, or a control call did not complete."""


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Counters since start: bytes forwarded each way and connections seen."""

    bytes_upstream: int  # client -> server
    bytes_downstream: int  # server -> client
    connections_accepted: int
    connections_active: int
    connections_rejected: int  # closed at once: over max_connections


class _Conn:
    """One proxied connection: the client side, the upstream side once connected, and the
    two pump tasks, so that a fault can tear all of it down at once."""

    __slots__ = ("client", "handler", "tasks", "upstream")

    def __init__(self, client: asyncio.StreamWriter, handler: asyncio.Task[Any] | None) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.handler = handler
        self.tasks: list[asyncio.Task[None]] = []

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]

    def kill(self, rst: bool) -> None:
        """Close both sides now: FIN (``rst=False``) or RST (``SO_LINGER`` 0)."""
        for w in self.writers():
            if rst:
                sock = w.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()
        for t in self.tasks:
            t.cancel()
        if self.handler is not None and self.handler is not asyncio.current_task():
            self.handler.cancel()  # it may be waiting out a black hole before connecting

    async def wait_closed(self) -> None:
        for w in self.writers():
            with contextlib.suppress(Exception):
                await w.wait_closed()


class FaultProxy:
    """Forward ``127.0.0.1:<listen_port>`` to ``upstream``, with faults on command.

    ``listen_port=0`` picks a free port (read it from :attr:`address` after :meth:`start`).
    ``connect_timeout`` bounds the proxy's own connection to the upstream; a client whose
    upstream cannot be reached is disconnected.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        listen_port: int = 0,
        *,
        max_connections: int = 64,
        chunk_size: int = 64 * 1024,
        connect_timeout: float = 5.0,
    ) -> None:
        self.upstream = upstream
        self._listen_port = listen_port
        self.max_connections = max_connections
        self.chunk_size = chunk_size
        self.connect_timeout = connect_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._held: socket.socket | None = None  # bound, not listening: refusing, port kept
        self._port = 0
        self._conns: set[_Conn] = set()
        self._flowing: asyncio.Event | None = None  # cleared while black-holed
        self._latency = 0.0
        self._up = self._down = self._accepted = self._rejected = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def address(self) -> tuple[str, int]:
        """Where clients connect: ``(127.0.0.1, port)``."""
        if not self._port:
            raise FaultProxyError("the proxy is not started")
        return LOOPBACK, self._port

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self) -> Self:
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"FaultProxy->{self.upstream[0]}:{self.upstream[1]}", daemon=True)
        self._thread.start()
        ready.wait(5)
        try:
            self._call(self._start())
        except BaseException:
            self.stop()
            raise
        return self

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, self._listen_port))
        except OSError as e:
            sock.close()
            raise FaultProxyError(f"cannot listen on {LOOPBACK}:{self._listen_port}: {e}") from e
        self._port = sock.getsockname()[1]
        await self._listen(sock)

    async def _listen(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._handle, sock=sock, limit=self.chunk_size, backlog=self.max_connections)

    def stop(self) -> None:
        """Reset every connection, close the port, end the thread. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            with contextlib.suppress(Exception):
                self._call(self._stop())
            loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if not loop.is_running():
            loop.close()
        self._loop = self._thread = None
        self._port = 0

    async def _stop(self) -> None:
        await self._close_listener()
        if self._held is not None:
            self._held.close()
            self._held = None
        await self._kill_all(rst=True)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        """Run ``coro`` on the proxy's loop and wait: control calls are synchronous."""
        if self._loop is None or not self._loop.is_running():
            coro.close()
            raise FaultProxyError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # ------------------------------------------------------------------ faults

    def set_latency(self, seconds: float) -> None:
        """Delay every chunk forwarded, either way, by ``seconds`` (0 to stop)."""
        if seconds < 0:
            raise ValueError(f"latency must be >= 0, got {seconds}")

        async def apply() -> None:
            self._latency = seconds

        self._call(apply())

    def blackhole(self) -> None:
        """Forward nothing either way, but keep every connection open, and accept new ones
        without connecting them upstream, until :meth:`heal`. What was held is then delivered."""

        async def apply() -> None:
            assert self._flowing is not None
            self._flowing.clear()

        self._call(apply())

    def drop_connections(self) -> None:
        """Close every current connection, both sides, with a FIN. New ones are still accepted."""
        self._call(self._kill_all(rst=False))

    def reset_connections(self) -> None:
        """Abort every current connection, both sides, with a RST (``SO_LINGER`` 0)."""
        self._call(self._kill_all(rst=True))

    def refuse(self, on: bool = True) -> None:
        """Refuse new connections (``ECONNREFUSED``) while ``on``; current ones carry on.

        The listening socket is closed and its port kept by a bound, non-listening socket,
        so nothing else can take the port meanwhile; ``refuse(False)`` listens again.
        """
        self._call(self._refuse(on))

    async def _refuse(self, on: bool) -> None:
        if on and self._held is None:
            await self._close_listener()
            held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                held.bind((LOOPBACK, self._port))
            except OSError as e:
                held.close()
                raise FaultProxyError(f"lost port {self._port} while refusing: {e}") from e
            self._held = held
        elif not on and self._held is not None:
            held, self._held = self._held, None
            await self._listen(held)

    def heal(self) -> None:
        """End every fault: forward again (releasing what a black hole held), no latency,
        accept new connections. Connections already dropped stay dropped."""

        async def apply() -> None:
            assert self._flowing is not None
            self._latency = 0.0
            self._flowing.set()
            await self._refuse(False)

        self._call(apply())

    async def _kill_all(self, rst: bool) -> None:
        conns = list(self._conns)
        for c in conns:
            c.kill(rst)
        for c in conns:
            await c.wait_closed()

    # ------------------------------------------------------------------ counters

    @property
    def stats(self) -> ProxyStats:
        return ProxyStats(self._up, self._down, self._accepted, len(self._conns), self._rejected)

    @property
    def blackholed(self) -> bool:
        return self._flowing is not None and not self._flowing.is_set()

    # ------------------------------------------------------------------ forwarding

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._conns) >= self.max_connections:
            self._rejected += 1
            writer.transport.abort()
            return
        self._accepted += 1
        conn = _Conn(writer, asyncio.current_task())
        self._conns.add(conn)
        try:
            assert self._flowing is not None
            await self._flowing.wait()  # a black hole holds new connections too
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.upstream, limit=self.chunk_size), self.connect_timeout
                )
            except (OSError, TimeoutError):
                return  # the client sees its connection closed, as with an unreachable server
            conn.upstream = up_writer
            conn.tasks = [
                asyncio.create_task(self._pump(reader, up_writer, self._count_up)),
                asyncio.create_task(self._pump(up_reader, writer, self._count_down)),
            ]
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            pass
        finally:
            self._conns.discard(conn)
            conn.kill(rst=False)
            for t in conn.tasks:  # a peer's reset is routine here: retrieve it, don't log it
                if t.done() and not t.cancelled():
                    t.exception()

    def _count_up(self, n: int) -> None:
        self._up += n

    def _count_down(self, n: int) -> None:
        self._down += n

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: Callable[[int], None]) -> None:
        """Copy one direction chunk by chunk, holding each chunk while black-holed and
        delaying it by the latency; pass an end-of-stream on as a half-close."""
        assert self._flowing is not None
        while True:
            data = await reader.read(self.chunk_size)
            if not data:
                if writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                return
            await self._flowing.wait()
            if self._latency:
                # fixed sleep: the latency is the fault this proxy injects (a slow network); the
                # delay is the point, not a wait for anything.
                await asyncio.sleep(self._latency)
                await self._flowing.wait()  # black-holed during the delay
            writer.write(data)
            count(len(data))  # counted once handed over, so a black hole's counters stand still
            await writer.drain()
