"""``affinity serve``: an asyncio HTTP router in front of a vLLM fleet.

Theory of operation
-------------------
aiohttp serves the client side and one shared aiohttp ``ClientSession`` (keep-alive
connection pool) talks to the backends. The pieces:

* :class:`~affinity_vllm.routing.RoutingTable` -- the only routing state; every decision
  and pool change is an ``affinity_core`` event, optionally written to a decision log;
* :class:`~affinity_vllm.proxy.Proxy` -- acquire, relay (SSE chunk by chunk), release;
* :class:`~affinity_vllm.monitor.Monitor` -- health checks (pool membership) and the
  optional /metrics scrape that feeds ``ObserveLoads``;
* :class:`~affinity_vllm.observability.RouterMetrics` -- /metrics and /status.

Request handling, in order: the HTTP parser refuses oversized header lines and fields
(``max_header_bytes``, at most :data:`MAX_HEADERS` headers) before a handler runs; the
handler refuses a body over ``max_body_bytes`` (413), a body that is not a JSON object
(400) and a bad session key (400); only then does it acquire. Unknown paths get 404 and
wrong methods 405, all as JSON errors. An unexpected exception in a handler becomes a
500 for that request; the server keeps running, and because release is in a
``finally`` no count leaks.

The session key is the ``session_header`` (default ``x-session-id``, as vllm-router) or,
when absent, the JSON body field ``session_body_field``. A request without a key is
routed least-loaded and never pinned.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from affinity_conformance.decision_log import DecisionLogWriter

from .monitor import Monitor
from .observability import RouterMetrics
from .options import RouterOptions
from .proxy import Proxy, error_response
from .routing import RoutingTable

__all__ = ["MAX_HEADERS", "MAX_SESSION_KEY_CHARS", "MODELS_KEY", "Router", "serve_forever"]

log = logging.getLogger("affinity_vllm.router")

MAX_HEADERS = 128
MAX_SESSION_KEY_CHARS = 1024
MODELS_KEY = "GET /v1/models"
ROUTES = ("POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models",
          "GET /metrics", "GET /status", "GET /health")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class Router:
    def __init__(self, options: RouterOptions) -> None:
        self.options = options
        decision_log = None
        if options.decision_log:
            decision_log = DecisionLogWriter(
                options.decision_log, max_bytes=options.decision_log_max_bytes)
        self.table = RoutingTable(options.core_config(), options.backends, seed=options.seed,
                                  decision_log=decision_log)
        self.metrics = RouterMetrics(self.table)
        self._session: aiohttp.ClientSession | None = None
        self.proxy = Proxy(options, self.table, self.metrics, self.session, self.backend_failed)
        self.monitor = Monitor(options, self.table, self.metrics, self.session,
                               self.backend_failed)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.active_requests = 0
        self.app = self._build_app()

    # -------------------------------------------------------------- lifecycle
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("router not started")
        return self._session

    async def start(self) -> int:
        """Bind and start serving; returns the bound port (useful with port 0)."""
        # Bodies pass through as bytes: no decompression (the client's Accept-Encoding is
        # forwarded and the backend's Content-Encoding relayed), no cookies, no env proxies.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300),
            cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False, trust_env=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"))
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.host, self.options.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self.monitor.start()
        return self.port

    async def stop(self) -> None:
        await self.monitor.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.table.close()

    def backend_failed(self, server_id: str, kind: str, remove: bool) -> None:
        self.metrics.backend_error(server_id, kind)
        if remove and self.table.remove(server_id):
            log.warning("backend %s removed from the pool (%s)", server_id, kind)

    # -------------------------------------------------------------------- app
    def _build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.options.max_body_bytes, middlewares=[self._errors],
            handler_args={  # the HTTP parser refuses longer header lines and fields
                "max_line_size": self.options.max_header_bytes,
                "max_field_size": self.options.max_header_bytes,
                "max_headers": MAX_HEADERS,
            })
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/status", self._status)
        app.router.add_get("/health", self._health)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        try:
            response = await handler(request)
        except BadRequest as exc:
            response = error_response(exc.status, exc.message, exc.kind)
        except web.HTTPNotFound:
            response = error_response(
                404, f"no route for {request.method} {request.path}; routes: "
                + ", ".join(ROUTES), "not_found")
        except web.HTTPMethodNotAllowed as exc:
            response = error_response(
                405, f"{request.method} is not allowed on {request.path}; allowed: "
                + ", ".join(sorted(exc.allowed_methods)), "method_not_allowed")
        except web.HTTPException as exc:
            response = error_response(exc.status, exc.text or exc.reason, "http_error")
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            response = error_response(500, "internal router error; see the router log",
                                      "internal_error")
        self.metrics.requests.inc(route, str(response.status))
        return response

    async def _read_json(self, request: web.Request) -> tuple[bytes, dict[str, Any]]:
        limit = self.options.max_body_bytes
        too_large = BadRequest(413, f"request body exceeds the limit of {limit} bytes "
                               "(--max-body-bytes)", "request_too_large")
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_large from None
        try:
            payload = json.loads(body.decode("utf-8"))  # RFC 8259: JSON on the wire is UTF-8
        except UnicodeDecodeError:
            raise BadRequest(400, "request body is not valid UTF-8 JSON") from None
        except json.JSONDecodeError as exc:
            raise BadRequest(400, f"request body is not valid JSON: {exc.msg} at line "
                             f"{exc.lineno} column {exc.colno}") from None
        if not isinstance(payload, dict):
            raise BadRequest(400, "request body must be a JSON object, got "
                             f"{type(payload).__name__}")
        return body, payload

    def _session_key(self, request: web.Request, payload: dict[str, Any]) -> str | None:
        header = self.options.session_header
        key: str | None = None
        raw = request.headers.get(header)
        where = f"header {header}"
        if raw is not None and raw.strip():
            key = raw.strip()
        elif self.options.session_body_field is not None:
            where = f"body field {self.options.session_body_field!r}"
            value = payload.get(self.options.session_body_field)
            if isinstance(value, str):
                key = value.strip() or None
            elif isinstance(value, int) and not isinstance(value, bool):
                key = str(value)
            elif value is not None:
                raise BadRequest(400, f"session key in {where} must be a string or an "
                                 f"integer, got {type(value).__name__}")
        if key is not None and len(key) > MAX_SESSION_KEY_CHARS:
            raise BadRequest(400, f"session key in {where} is {len(key)} characters; the "
                             f"limit is {MAX_SESSION_KEY_CHARS}")
        if key is None and self.options.full_determinism:
            field = self.options.session_body_field
            raise BadRequest(400, "full determinism routes by session key: send the "
                             f"{header} header" + (f" or body field {field!r}" if field else ""))
        return key

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        body, payload = await self._read_json(request)
        key = self._session_key(request, payload)
        return await self._forward(request, body, key, started)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        # A listing is routed like an unkeyed request; full determinism refuses unkeyed
        # acquires, so there it takes one fixed key (one sticky entry, a stable backend).
        key = MODELS_KEY if self.options.full_determinism else None
        return await self._forward(request, None, key, time.perf_counter())

    async def _forward(self, request: web.Request, body: bytes | None, key: str | None,
                       started: float) -> web.StreamResponse:
        if self.active_requests >= self.options.max_concurrency:
            raise BadRequest(503, f"router at its concurrency limit of "
                             f"{self.options.max_concurrency} requests (--max-concurrency)",
                             "overloaded")
        self.active_requests += 1
        try:
            return await self.proxy.forward(request, body, key, started)
        finally:
            self.active_requests -= 1

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=self.metrics.render(),
                            content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def _status(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.metrics.status())

    async def _health(self, request: web.Request) -> web.StreamResponse:
        active = len(self.table.active)
        body = {"status": "ok" if active else "no_backends", "active_backends": active}
        return web.json_response(body, status=200 if active else 503)


async def serve_forever(options: RouterOptions, ready: Callable[[int], None] | None = None
                        ) -> None:
    """Run until SIGINT or SIGTERM, then stop cleanly."""
    router = Router(options)
    port = await router.start()
    if ready is not None:
        ready(port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await router.stop()
