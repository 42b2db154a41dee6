"""Request and response values of the router's HTTP/1.1 layer (:mod:`affinity_vllm.http1`).

Theory of operation
-------------------
:class:`IncomingRequest` is what the parser hands to a handler: the method, the raw
request target in origin form (path and query string: an absolute-form target's scheme
and authority and any ``#fragment`` are dropped, so they never reach a backend), the
header pairs as received (trailer fields of a chunked body are dropped, never headers)
(names lower-cased, values as bytes: a header value is not text until someone decodes
it, which is where a non-UTF-8 session key becomes a 400), the body bytes and the moment
of the request's first byte. :class:`ServerLimits` gathers the limits the connection
enforces. :func:`error_body` is the router's one JSON error format, used for every
refusal, from a malformed request line to an exhausted pool.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from .http1 import ClientConnection

__all__ = ["IncomingRequest", "ServerLimits", "error_body", "status_line"]

_REASONS = {200: b"OK", 204: b"No Content", 400: b"Bad Request", 404: b"Not Found",
            405: b"Method Not Allowed", 408: b"Request Timeout", 413: b"Content Too Large",
            499: b"Client Closed Request", 500: b"Internal Server Error",
            502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout"}


def error_body(status: int, message: str, kind: str) -> bytes:
    """The router's OpenAI-style JSON error body."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def status_line(status: int, reason: bytes | None = None) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, reason or _REASONS.get(status, b"Status"))


@attrs.frozen
class ServerLimits:
    """What a client connection may send (``affinity serve``'s limit options)."""

    max_header_bytes: int = 8190
    max_headers: int = 128
    max_body_bytes: int = 8 << 20
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    idle_timeout: float = 75.0
    max_connections: int = 10000
    body_memory_budget: int = 1 << 62  # request bodies of all connections at once


class IncomingRequest:
    """One parsed request: raw header pairs (names lower-case), the body, timing."""

    __slots__ = ("abandoned", "backend", "body", "client", "connection", "decision",
                 "first_byte_at", "headers", "keep_alive", "method", "path", "query",
                 "received_at", "reserved", "session", "target", "version")

    def __init__(self, connection: ClientConnection, received_at: float) -> None:
        self.connection = connection
        self.received_at = received_at  # perf_counter() at the request's first byte
        self.method = ""
        self.target = b""
        self.path = ""
        self.query = b""
        self.version = "1.1"
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.keep_alive = True
        self.abandoned = False  # the client left while this request was handled
        self.reserved = 0  # bytes of the server's body budget this request holds
        self.client = connection.peer
        # Set by the proxy for the access log and the per-backend histograms: the backend
        # of the last attempt, its routing decision, and when its response head arrived.
        self.backend: str | None = None
        self.decision: str | None = None
        self.first_byte_at: float | None = None
        self.session: str | None = None  # the session key it was routed by

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (``name`` lower-case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None
