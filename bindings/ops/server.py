"""The operations HTTP server: the status page, ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

* ``/`` — the status page (:mod:`.status_page`): the process, its role for each shard, the keys
  held back by delivery errors, quarantined keys with the commands that release them, backlog
  and lag, publish rate and latency over the last minutes. ``Accept: application/json`` gets the
  same as JSON, as does ``/status``.

* ``/healthz`` — liveness: 200 while the harvester is starting, running or stopping; 503 once
  it has stopped (crashed or stopped), so an orchestrator restarts the process.
* ``/readyz`` — readiness: 200 while :meth:`HarvestEngine.health` says ready (running, and neither
  the broker nor the database known to be unreachable), leader or standby alike; 503
  otherwise. Both answer a JSON body saying what is up and what is down; ``/readyz``'s
  includes whether the change feed (PostgreSQL's ``LISTEN`` connection) is connected, and
  ``"degraded": true`` with ``blocked_keys`` while a record Kafka refuses for good holds keys
  back (still 200: every other key is served, and a restart would not help).
* ``/metrics`` — the Prometheus exposition (OpenMetrics when the scraper asks for it).

None of them waits on the database or the broker: they read the harvester's last known state
(the database is pinged in the background, :class:`~pyharvest.core.telemetry.health.DatabaseProbe`, on
this server's own timer every :data:`~pyharvest.core.telemetry.health.PING_INTERVAL` while it runs), so
they answer at once during an outage too, ``/readyz`` with 503 and what is down and why. A
client that hangs up before its answer is sent is logged in one line.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from pyharvest.bindings.ops.probes import health_report, liveness_report
from pyharvest.core.errors import HarvestError
from pyharvest.core.telemetry.health import PING_INTERVAL

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from pyharvest.bindings.ops.collector import BacklogCounter
    from pyharvest.bindings.ops.shard_collector import ShardBacklog
    from pyharvest.bindings.ops.watch import OutboxWatch
    from pyharvest.core.engine.harvest import HarvestEngine
    from pyharvest.core.engine.sharded import ShardedHarvestEngine

__all__ = ["OpsServer", "health_report", "liveness_report"]  # the reports re-exported from .probes

log = logging.getLogger("pyharvest.ops")


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
            elif path in ("/", "/status"):
                self._status(ops, path, send_body)
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

    def _status(self, ops: OpsServer, path: str, send_body: bool) -> None:
        from pyharvest.bindings.ops.status import status_report

        report = status_report(ops)
        if path == "/status" or _prefers_json(self.headers.get("Accept", "")):
            self._json(HTTPStatus.OK, report, send_body)
            return
        from pyharvest.bindings.ops.status_page import render_status_page

        self._send(HTTPStatus.OK, "text/html; charset=utf-8", render_status_page(report).encode(), send_body)

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


def _prefers_json(accept: str) -> bool:
    """Whether an ``Accept`` header asks for JSON rather than HTML (a browser's lists both,
    HTML first; ``curl -H 'Accept: application/json'`` lists only JSON)."""
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    if "application/json" not in kinds:
        return False
    return "text/html" not in kinds or kinds.index("application/json") < kinds.index("text/html")


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
        watch: OutboxWatch | None = None,
        command_target: str | None = None,
    ) -> None:
        self.harvest = harvest
        self.registry = registry
        self.backlog = backlog
        self.watch = watch
        #: How the status page's ``reaper quarantine`` commands name the outbox (``-f reaper.yaml``).
        self.command_target = command_target
        self.started_at = time.time()
        self._pinging = threading.Event()  # set: stop the ping timer
        self._pinger = threading.Thread(target=self._ping_loop, name="pyharvest-ops-ping", daemon=True)
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
        if self.watch is not None:
            self.watch.start()
        self._pinger.start()
        self._thread.start()
        # Where it really listens: 0.0.0.0 is every interface, not only the loopback one.
        bound = str(self._server.server_address[0])
        everywhere = " (all interfaces)" if bound in ("0.0.0.0", "::") else ""  # noqa: S104
        log.info(
            "metrics and health listening on %s:%d%s: / (status page), /metrics, /healthz, /readyz",
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
        self._pinging.set()
        if self._pinger.is_alive():
            self._pinger.join(5.0)
        if self.backlog is not None:
            self.backlog.stop()
        if self.watch is not None:
            self.watch.stop()

    def _ping_loop(self) -> None:
        # A probe reads the last answer: pinging on this timer keeps it at most an interval old.
        while not self._pinging.is_set():
            refresh = getattr(self.harvest, "refresh_health", None)
            if refresh is not None:
                try:
                    refresh()
                except Exception as e:  # noqa: BLE001 - the next tick tries again
                    log.debug("refreshing health failed: %s", e)
            self._pinging.wait(PING_INTERVAL)

    def __enter__(self) -> OpsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _host(address: str) -> str:
    if address in ("0.0.0.0", "", "::"):  # noqa: S104
        return "127.0.0.1" if address != "::" else "[::1]"
    return f"[{address}]" if ":" in address else address
