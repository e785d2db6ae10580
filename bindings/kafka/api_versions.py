"""Which Kafka APIs a broker serves, asked directly (ApiVersions, version 0).

librdkafka does not say: with ``group.protocol=consumer`` on a broker without KIP-848's
ConsumerGroupHeartbeat (the embedded broker, Tansu; Apache Kafka before 3.7), it only logs at
debug level and retries forever, so a leader group would wait without a word. Only plaintext
connections are asked; over TLS or SASL the answer is "cannot tell" (``None``).
"""

from __future__ import annotations

import socket
import struct

__all__ = ["CONSUMER_GROUP_HEARTBEAT", "broker_api_keys"]

#: KIP-848's heartbeat: a broker that lists it speaks the consumer group protocol.
CONSUMER_GROUP_HEARTBEAT = 68
_API_VERSIONS = 18


def broker_api_keys(
    bootstrap_servers: str, security_protocol: str = "plaintext", timeout: float = 5.0
) -> frozenset[int] | None:
    """The API keys the first reachable bootstrap server lists, or ``None`` when it cannot be
    asked (not plaintext, or none answered)."""
    if security_protocol.lower() != "plaintext":
        return None
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        host = host.strip("[]") or "localhost"
        try:
            with socket.create_connection((host, int(port)), timeout=timeout) as sock:
                sock.settimeout(timeout)
                return _ask(sock)
        except (OSError, ValueError, struct.error):
            continue
    return None


def _ask(sock: socket.socket) -> frozenset[int]:
    client = b"pyharvest"
    # Request header v1: api key, api version, correlation id, client id; an empty v0 body.
    body = struct.pack(">hhih", _API_VERSIONS, 0, 1, len(client)) + client
    sock.sendall(struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", _read(sock, 4))[0]
    reply = _read(sock, size)
    # Response v0: correlation id, error code, then [api key, min version, max version].
    _correlation, _error, count = struct.unpack_from(">ihi", reply)
    return frozenset(struct.unpack_from(">h", reply, 10 + 6 * i)[0] for i in range(max(0, count)))


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data
