"""The operations HTTP server: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

* ``/healthz`` — liveness: 200 while the harvester is starting, running or stopping; 503 once
  it has stopped (crashed or stopped), so an orchestrator restarts the process.
* ``/readyz`` — readiness: 200 while :meth:`HarvestEngine.health` says ready (running, and neither
  the broker nor the database known to be unreachable), leader or standby alike; 503
  otherwise. Both answer a JSON body saying what is up and what is down; ``/readyz``'s
  includes whether the change feed (PostgreSQL's ``LISTEN`` connection) is connected.
* ``/metrics`` — the Prometheus exposition (OpenMetrics when the scraper asks for it).

None of them waits on the database or the broker: they read the harvester's last known state
(the database is pinged in the background, :class:`~pyharvest.core.telemetry.health.DatabaseProbe`), so
they answer at once during an outage too, ``/readyz`` with 503 and what is down and why. A
client that hangs up before its answer is sent is logged in one line.
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from pyharvest.core.engine.lifecycle import State
from pyharvest.core.errors import HarvestError

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from pyharvest.bindings.ops.collector import BacklogCounter
    from pyharvest.bindings.ops.shard_collector import ShardBacklog
    from pyharvest.core.engine.harvest import HarvestEngine
    from pyharvest.core.engine.sharded import ShardedHarvestEngine

__all__ = ["OpsServer", "health_report", "liveness_report"]

log = logging.getLogger("pyharvest.ops")


def liveness_report(harvest: HarvestEngine | ShardedHarvestEngine) -> tuple[bool, dict[str, Any]]:
    """``(alive, body)`` for ``/healthz``: alive until the harvester has stopped."""
    state = harvest.state
    alive = state is not State.STOPPED
    return alive, {"status": "alive" if alive else "stopped", "state": state.value}


def health_report(harvest: HarvestEngine | ShardedHarvestEngine) -> tuple[bool, dict[str, Any]]:
    """``(ready, body)`` for ``/readyz``; ``body["down"]`` lists what is not up."""
    health = harvest.health()
    down = []
    if not health.running:
        down.append("harvester")
    if health.broker_connected is False:
        down.append("broker")
    if health.database_connected is False:
        down.append("database")
    body: dict[str, Any] = {
        "status": "ready" if health.ready else "not ready",
        "state": harvest.state.value,
        "role": "leader" if health.leader else "standby",
        "running": health.running,
        "broker_connected": health.broker_connected,
        "database_connected": health.database_connected,
        # PostgreSQL's LISTEN connection; None where the binding polls only. While it is down
        # the harvester polls, so it does not make the process unready.
        "change_feed_connected": health.change_feed_connected,
    }
    if down:
        body["down"] = down
    if health.database_connected is False and health.database_error:
        body["errors"] = {"database": health.database_error}
    return health.ready, body


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "pyharvest"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._serve(send_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        ops = self.server.ops
        try:
            if path == "/metrics":
                self._metrics(ops, send_body)
            elif path in ("/healthz", "/livez"):
                ok, body = liveness_report(ops.harvest)
                self._json(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, body, send_body)
            elif path == "/readyz":
                ok, body = health_report(ops.harvest)
                self._json(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, body, send_body)
            elif path == "/":
                self._json(HTTPStatus.OK, {"endpoints": ["/metrics", "/healthz", "/readyz"]}, send_body)
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path}"}, send_body)
        except _HUNG_UP as e:
            _client_gone(self.address_string(), path, e)
        except Exception as e:  # noqa: BLE001 - a probe must get an answer, not a reset connection
            log.warning("error serving %s: %s", path, e, exc_info=log.isEnabledFor(logging.DEBUG))
            try:
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(e).__name__}: {e}"}, send_body)
            except _HUNG_UP as gone:
                _client_gone(self.address_string(), path, gone)

    def _metrics(self, ops: OpsServer, send_body: bool) -> None:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        self._send(HTTPStatus.OK, content_type, encoder(ops.registry), send_body)

    def _json(self, status: HTTPStatus, body: dict[str, Any], send_body: bool) -> None:
        self._send(status, "application/json", (json.dumps(body) + "\n").encode(), send_body)

    def _send(self, status: HTTPStatus, content_type: str, payload: bytes, send_body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if send_body:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("%s - %s", self.address_string(), format % args)


# A client that closed its connection before (or while) its answer was written.
_HUNG_UP = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def _client_gone(client: str, path: str, error: BaseException) -> None:
    log.info("client %s hung up before the answer to %s was sent (%s)", client, path, type(error).__name__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    ops: OpsServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver's default prints a traceback to stderr; one line in the log instead.
        import sys

        error = sys.exc_info()[1]
        client = client_address[0] if isinstance(client_address, tuple) else str(client_address)
        if isinstance(error, _HUNG_UP):
            _client_gone(client, "its request", error)
        else:
            log.warning("error serving %s: %s", client, error, exc_info=log.isEnabledFor(logging.DEBUG))


class OpsServer:
    """A running operations server; :meth:`stop` frees its port and threads.

    Built by :func:`pyharvest.bindings.ops.start_ops_server`.
    """

    def __init__(
        self,
        harvest: HarvestEngine | ShardedHarvestEngine,
        registry: CollectorRegistry,
        address: str,
        port: int,
        backlog: BacklogCounter | ShardBacklog | None = None,
    ) -> None:
        self.harvest = harvest
        self.registry = registry
        self.backlog = backlog
        try:
            server_cls: type[_Server] = _Server
            if ":" in address:  # an IPv6 literal
                import socket

                server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
            self._server = server_cls((address, port), _Handler)
        except OSError as e:
            raise HarvestError(
                f"metrics server: cannot listen on {address}:{port} (metrics.address, metrics.port): "
                f"{e.strerror or e}"
            ) from None
        self._server.ops = self
        self.address = address
        self.port: int = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="pyharvest-ops", daemon=True
        )
        self._stopped = False

    def start(self) -> OpsServer:
        if self.backlog is not None:
            self.backlog.start()
        self._thread.start()
        # Where it really listens: 0.0.0.0 is every interface, not only the loopback one.
        bound = str(self._server.server_address[0])
        everywhere = " (all interfaces)" if bound in ("0.0.0.0", "::") else ""  # noqa: S104
        log.info(
            "metrics and health listening on %s:%d%s: /metrics, /healthz, /readyz",
            f"[{bound}]" if ":" in bound else bound, self.port, everywhere,
        )
        return self

    @property
    def url(self) -> str:
        """Base URL of the server, e.g. ``http://127.0.0.1:9433``."""
        return f"http://{_host(self.address)}:{self.port}"

    def stop(self) -> None:
        """Stop serving and close the socket; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5.0)
        self._server.server_close()
        if self.backlog is not None:
            self.backlog.stop()

    def __enter__(self) -> OpsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _host(address: str) -> str:
    if address in ("0.0.0.0", "", "::"):  # noqa: S104
        return "127.0.0.1" if address != "::" else "[::1]"
    return f"[{address}]" if ":" in address else address
