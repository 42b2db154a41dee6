"""Forwarding one OpenAI-style request to the backend the core chose.

Theory of operation
-------------------
:meth:`Proxy.forward` handles ``/v1/completions``, ``/v1/chat/completions`` and
``/v1/models`` after the HTTP layer has read and validated the body:

1. ``acquire`` on the routing table (the core decides; the lease names the backend);
2. send the request upstream and relay the answer:

   * ``text/event-stream`` responses are relayed chunk by chunk as they arrive;
   * anything else is read whole and answered with the backend's status code;

3. ``release`` the lease in a ``finally`` -- exactly once, whatever happened.

Faults, by when they happen:

* **before any byte was sent** (connection refused, connect timeout): the backend is
  removed from the pool (a ``RemoveServers`` event, after the lease is released) and the
  request is retried once; the retry re-acquires with the same session key, so a pinned
  session finds its pin on a removed server and is re-placed (path ``reselected``);
* **after the request was sent, before the response started** (read timeout, backend
  closed the connection): no retry, since the backend may have acted on it. A timeout
  removes the backend; the client gets 504 (timeout) or 502;
* **mid-stream**: the client's event stream ends with an SSE event ``data:
  {"error": {...}}`` naming the backend and the cause, and no ``[DONE]``; a read timeout
  also removes the backend;
* **client went away**: the relay stops and the lease is released.

Removed backends come back only through the health check (:mod:`affinity_vllm.monitor`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from .observability import RouterMetrics
from .options import RouterOptions
from .routing import Lease, RoutingTable

__all__ = ["Proxy", "error_response"]

# Request headers passed to the backend besides x-*: the rest are hop-by-hop or the
# client's business with the router (Host, Content-Length are recomputed).
_FORWARD_HEADERS = frozenset({"content-type", "authorization", "accept", "accept-encoding",
                              "user-agent"})
# Response headers relayed to the client besides the router's own x-affinity-* tags.
_RELAY_HEADERS = ("Content-Type", "Content-Encoding")
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def error_response(status: int, message: str, kind: str,
                   headers: dict[str, str] | None = None) -> web.Response:
    """An OpenAI-style JSON error body."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status, headers=headers)


class _NotSent(Exception):
    """The connection to the backend failed before any byte of the request was sent."""

    def __init__(self, kind: str, cause: BaseException) -> None:
        super().__init__(f"{kind}: {cause}")
        self.kind = kind


class Proxy:
    def __init__(
        self,
        options: RouterOptions,
        table: RoutingTable,
        metrics: RouterMetrics,
        session: Callable[[], aiohttp.ClientSession],
        backend_failed: Callable[[str, str, bool], None],
    ) -> None:
        self.options = options
        self.table = table
        self.metrics = metrics
        self._session = session
        self._backend_failed = backend_failed
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=options.connect_timeout, sock_read=options.upstream_timeout
        )

    def _headers(self, request: web.Request) -> dict[str, str]:
        return {
            name: value for name, value in request.headers.items()
            if name.lower() in _FORWARD_HEADERS or name.lower().startswith("x-")
        }

    async def forward(
        self, request: web.Request, body: bytes | None, key: str | None, started: float
    ) -> web.StreamResponse:
        """Route, relay and release; ``started`` is ``perf_counter()`` at arrival."""
        last_failure = ""
        for attempt in (0, 1):
            lease = self.table.acquire(key)
            if not isinstance(lease, Lease):
                message = lease.message
                if last_failure:
                    message += f" (after {last_failure})"
                return error_response(503, message, "no_backend_available")
            overhead = time.perf_counter() - started
            failed_kind = ""
            try:
                return await self._relay(request, body, lease, attempt)
            except _NotSent as failure:
                failed_kind = failure.kind
                last_failure = f"{failure.kind} on {lease.server_id}"
            finally:
                release_start = time.perf_counter()
                self.table.release(lease)
                overhead += time.perf_counter() - release_start
                self.metrics.overhead.observe(overhead)
            # Not sent: release happened above, now take the backend out of the pool.
            self._backend_failed(lease.server_id, failed_kind, True)
            if attempt == 0:
                self.metrics.retries.inc()
                started = time.perf_counter()
        return error_response(
            502, f"no backend accepted the request: {last_failure}; retried once",
            "upstream_unavailable",
        )

    async def _relay(
        self, request: web.Request, body: bytes | None, lease: Lease, attempt: int
    ) -> web.StreamResponse:
        sid = lease.server_id
        url = sid + request.rel_url.path
        tags = {"x-affinity-backend": sid, "x-affinity-path": lease.path}
        if attempt:
            tags["x-affinity-retried"] = "1"
        try:
            upstream = await self._session().request(
                request.method, url, data=body, headers=self._headers(request),
                timeout=self._timeout, allow_redirects=False,
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            kind = "connect_timeout" if isinstance(exc, asyncio.TimeoutError) else "refused"
            raise _NotSent(kind, exc) from exc
        except asyncio.TimeoutError:
            self._backend_failed(sid, "timeout", True)
            return error_response(504, f"backend {sid} did not answer within "
                                  f"{self.options.upstream_timeout:g} s", "upstream_timeout",
                                  tags)
        except aiohttp.ClientError as exc:
            self._backend_failed(sid, "disconnected", False)
            return error_response(502, f"backend {sid} failed before responding: {exc!r}",
                                  "upstream_error", tags)
        try:
            content_type = upstream.headers.get("Content-Type", "")
            if content_type.startswith("text/event-stream"):
                return await self._relay_stream(request, upstream, sid, tags)
            return await self._relay_whole(upstream, sid, tags)
        finally:
            upstream.release()

    async def _relay_whole(
        self, upstream: aiohttp.ClientResponse, sid: str, tags: dict[str, str]
    ) -> web.StreamResponse:
        try:
            data = await upstream.read()
        except _UPSTREAM_ERRORS as exc:
            timed_out = isinstance(exc, asyncio.TimeoutError)
            self._backend_failed(sid, "timeout" if timed_out else "mid_stream", timed_out)
            return error_response(
                504 if timed_out else 502,
                f"backend {sid} failed while sending its response: {exc!r}", "upstream_error",
                tags)
        headers = dict(tags)
        for name in _RELAY_HEADERS:
            if name in upstream.headers:
                headers[name] = upstream.headers[name]
        return web.Response(status=upstream.status, body=data, headers=headers)

    async def _relay_stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, sid: str,
        tags: dict[str, str],
    ) -> web.StreamResponse:
        headers = {**tags, "Cache-Control": "no-cache"}
        for name in _RELAY_HEADERS:
            if name in upstream.headers:
                headers[name] = upstream.headers[name]
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        chunks = upstream.content.iter_any().__aiter__()
        tail = b"\n\n"
        failure: BaseException | None = None
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except _UPSTREAM_ERRORS as exc:
                failure = exc
                break
            try:
                await response.write(chunk)
            except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                self.metrics.client_disconnects.inc()
                return response
            tail = (tail + chunk)[-2:]
        if failure is not None:
            timed_out = isinstance(failure, asyncio.TimeoutError)
            self._backend_failed(sid, "timeout" if timed_out else "mid_stream", timed_out)
            error: dict[str, Any] = {"error": {
                "message": f"backend {sid} failed mid-stream ({failure!r}); "
                           "the response is incomplete",
                "type": "upstream_error", "code": 502,
            }}
            # Terminate a half-relayed event first so the error is an event of its own.
            prefix = b"" if tail == b"\n\n" else b"\n\n"
            try:
                await response.write(prefix + b"data: " + json.dumps(error).encode() + b"\n\n")
            except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                self.metrics.client_disconnects.inc()
                return response
        await response.write_eof()
        return response
