"""``affinity serve``: an asyncio HTTP router in front of a vLLM fleet.

Theory of operation
-------------------
One process, one event loop (uvloop when installed), one thread. The pieces:

* :class:`~affinity_vllm.http_server.HttpServer` -- the client side (asyncio protocols and
  httptools; limits, read timeouts, client abandonment);
* :class:`~affinity_vllm.routing.RoutingTable` -- the only routing state; every decision
  and pool change is an ``affinity_engine`` event, optionally written to a decision log;
* :class:`~affinity_vllm.proxy.Proxy` -- acquire, relay, release, retry once;
* :class:`~affinity_vllm.upstream.UpstreamPool` -- pooled keep-alive connections to the
  backends;
* :mod:`~affinity_vllm.health` -- per-backend health states (passive outlier detection,
  active checks) whose pool changes become ``RemoveServers`` / ``AddServers``;
* :class:`~affinity_vllm.monitor.Monitor` -- the active health checks and the optional
  /metrics scrape that feeds ``ObserveLoads``;
* :class:`~affinity_vllm.observability.RouterMetrics` -- /metrics and /status.

**Why the decision stays single-writer and exact.** Every core event is applied by
``RoutingTable.apply`` on the event loop thread, and ``step`` never awaits, so events
are totally ordered without locks, in the order the decision log records them. Worker
processes would each need the shared state for every decision (a round trip to one
owner per acquire and per release), which on a 2-core machine costs more than the whole
HTTP path they would parallelise; the router is fast enough single-threaded instead
(``benchmarks/README.md``).

Request handling, in order: the HTTP layer refuses oversized or malformed requests
(400/413/408); the handler refuses a body that is not a JSON object (400) and a bad
session key or group id (400); with the context band, a keyed request's prompt length is counted
(:mod:`~affinity_vllm.context`, never an error); only then does it acquire. Unknown
paths get 404 and wrong methods 405, all as JSON errors. An unexpected exception
becomes a 500 for that request (and one log line with its traceback); the server keeps
running, and because release is in a ``finally`` no count leaks. A client that leaves
is a 499 in ``requests_total``, never a 500.
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

from affinity_runtime.decision_log import DecisionLogWriter

from .access_log import AccessLog
from .admin import AdminApi
from .context import ContextCounter
from .health import BackendHealth, Health, HealthPolicy, PoolChange
from .http1 import IncomingRequest, ServerLimits, error_body
from .http_server import HttpServer
from .limits import RouterErrors, fit_fd_limit
from .monitor import Monitor
from .observability import RouterMetrics
from .options import RouterOptions
from .proxy import Proxy
from .routing import RoutingTable
from .upstream import UpstreamPool

__all__ = ["MAX_HEADERS", "MAX_SESSION_KEY_CHARS", "MODELS_KEY", "Router", "serve_forever"]

log = logging.getLogger("affinity_vllm.router")

MAX_HEADERS = 128
MAX_SESSION_KEY_CHARS = 1024
MODELS_KEY = "GET /v1/models"
ROUTES = ("POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models",
          "GET /metrics", "GET /status", "GET /health", "HEAD /metrics", "HEAD /status",
          "HEAD /health")
_JSON = [(b"content-type", b"application/json")]
_TEXT = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
         (b"x-content-type-options", b"nosniff")]


class BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: tuple[tuple[bytes, bytes], ...] = ()):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers


Handler = Callable[[IncomingRequest], Awaitable[int]]


class Router:
    def __init__(self, options: RouterOptions) -> None:
        self.options = options
        self._groups = options.group_stickiness != "off"  # requests carry a group id
        self.table = RoutingTable(options.core_config(), options.backends, seed=options.seed)
        self.metrics = RouterMetrics(self.table)
        policy = HealthPolicy(eject_5xx=options.eject_5xx,
                              eject_connect_errors=options.eject_connect_errors,
                              ejection_base=options.ejection_base,
                              ejection_max=options.ejection_max,
                              failure_threshold=options.health_failure_threshold,
                              success_threshold=options.health_success_threshold)
        self._policy = policy
        self.health = {sid: BackendHealth(policy) for sid in options.backends}
        # Backends the admin API took out ("remove" or "drain"): health never re-adds them.
        self.admin_out: dict[str, str] = {}
        self.admin: AdminApi | None = None
        self.access_log: AccessLog | None = None
        if options.access_log is not None:
            self.access_log = AccessLog(options.access_log)
        self.metrics.health = self.health
        self.router_errors = RouterErrors(self.metrics.registry)
        # Every client connection may hold an upstream one: fit both in the fd limit.
        max_connections, fd_note = fit_fd_limit(
            options.max_connections, options.max_concurrency, len(options.backends))
        if fd_note is not None:
            (log.warning if max_connections < options.max_connections else log.info)(
                "%s", fd_note)
        self.pool = UpstreamPool(options.connect_timeout, options.upstream_timeout)
        self.proxy = Proxy(options, self.table, self.metrics, self.pool, self.report,
                           self.router_errors.error)
        self._session: aiohttp.ClientSession | None = None
        # The context band's c, only where it can matter: keyed requests, band configured.
        self.context: ContextCounter | None = None
        if self.table.config.context_band:
            self.context = ContextCounter(options.context_tokens, options.health_timeout,
                                          lambda: self.table.active, self.session)
        self.metrics.context = self.context
        self.monitor = Monitor(options, self.table, self.metrics, self.session, self.probed)
        self.server = HttpServer(self.handle, ServerLimits(
            max_header_bytes=options.max_header_bytes, max_headers=MAX_HEADERS,
            max_body_bytes=options.max_body_bytes, header_timeout=options.header_timeout,
            body_timeout=options.body_timeout, idle_timeout=options.idle_timeout,
            max_connections=max_connections, body_memory_budget=options.body_memory_budget),
            on_refused=self._refused, client_gone=self._client_gone,
            unhandled=self._unhandled, router_error=self.router_errors.error)
        self.port: int | None = None
        self.active_requests = 0
        self._routes: dict[tuple[str, str], tuple[str, Handler]] = {
            ("POST", "/v1/completions"): ("/v1/completions", self._generate),
            ("POST", "/v1/chat/completions"): ("/v1/chat/completions", self._generate),
            ("GET", "/v1/models"): ("/v1/models", self._models),
            ("GET", "/metrics"): ("/metrics", self._metrics),
            ("GET", "/status"): ("/status", self._status),
            ("GET", "/health"): ("/health", self._health),
        }
        for path in ("/metrics", "/status", "/health"):  # HEAD: the GET head, no body (http1)
            self._routes["HEAD", path] = self._routes["GET", path]
        self._paths = {path: sorted(m for m, p in self._routes if p == path)
                       for _, path in self._routes}

    # -------------------------------------------------------------- lifecycle
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("router not started")
        return self._session

    async def start(self) -> int:
        """Bind and start serving; returns the bound port (useful with port 0)."""
        self.pool.loop = asyncio.get_running_loop()
        self.port = await self.server.start(self.options.host, self.options.port)
        try:
            self._open_decision_log()  # only once the port is ours
        except OSError:  # DecisionLogLocked: another writer has the path; nothing changed
            self.server.stop_listening()
            self.server.abort_all()
            raise
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        # Ready only after one health round (within --health-timeout): until then
        # /health says "starting", never ok.
        await self.monitor.check_health()
        self.monitor.start()
        options = self.options
        if options.admin_port is not None or options.admin_socket is not None:
            self.admin = AdminApi(self, options.admin_token)
            try:
                if options.admin_port is not None:
                    port = await self.admin.start(options.admin_host, options.admin_port)
                    log.info("admin API on %s:%d (%s)", options.admin_host, port,
                             "bearer token required" if options.admin_token
                             else "no token: loopback only")
                if options.admin_socket is not None:
                    await self.admin.start_unix(options.admin_socket)
                    log.info("admin API on unix socket %s (mode 0600%s)",
                             options.admin_socket,
                             "; bearer token required" if options.admin_token else "")
            except OSError:
                await self.stop()
                raise
        return self.port

    def register_backend(self, url: str) -> None:
        """A backend the admin API adds at run time: known from now on, not yet active."""
        self.table.register(url)
        self.health[url] = BackendHealth(self._policy)
        self.metrics.register(url)

    def left_pool(self, sid: str) -> None:
        """``sid`` left the pool: drop its idle connections and its reuse evidence."""
        self.pool.drop(sid)
        self.proxy.left_pool(sid)

    def _open_decision_log(self) -> None:
        """The one place that opens the decision log (after the port is bound)."""
        options = self.options
        if options.decision_log:
            started = self.table.attach_log(DecisionLogWriter(
                options.decision_log, max_bytes=options.decision_log_max_bytes,
                backups=options.decision_log_keep,
                keep_bytes=options.decision_log_keep_bytes),
                required=options.require_decision_log, warm=options.warm_start)
            if started:
                log.info("%s", started)
            log.info("decision log %s (locked by this router; write failures %s)",
                     self.options.decision_log, "refuse routing"
                     if self.options.require_decision_log else "are reported, routing goes on")

    async def stop(self, grace: float = 0.0) -> None:
        """Drain: stop accepting, close idle connections, answer every open request
        with ``Connection: close`` and let them finish for ``grace`` seconds; then
        cancel the rest (each releases its lease as it unwinds) and close everything.
        A keep-alive client is told to go before its connection closes, so none of
        them sends a request into a reset."""
        self.server.drain()
        if self.admin is not None:
            self.admin.stop()
        deadline = time.monotonic() + grace
        next_note = time.monotonic()
        while (self.active_requests or self.server.connections) and (
                time.monotonic() < deadline):
            if time.monotonic() >= next_note:
                log.info("shutdown: %d requests still open (%d connections), %.1f s of "
                         "grace left", self.active_requests, len(self.server.connections),
                         deadline - time.monotonic())
                next_note += 1.0
            await asyncio.sleep(0.02)
        if self.active_requests:
            log.warning("shutdown: grace of %g s over; cancelling %d open requests",
                        grace, self.active_requests)
        tasks = [c.task for c in list(self.server.connections) if c.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        self.server.abort_all()
        await self.monitor.stop()
        self.pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.table.close()
        if self.access_log is not None:
            self.access_log.close()
        log.info("shutdown: done; %d requests open", self.active_requests)

    # ----------------------------------------------------------------- health
    def report(self, sid: str, kind: str, status: int | None) -> None:
        """An outcome of a proxied request on ``sid`` (from the proxy)."""
        health = self.health[sid]
        if status is not None and status < 500 and health.state is Health.UP and not (
                health.failures_5xx or health.failures_connect):
            return  # the common case: a success on a healthy backend changes nothing
        now = time.monotonic()
        if status is not None:  # a response: 2xx-4xx succeed, 5xx count toward ejection
            if status >= 500:
                self.metrics.backend_error(sid, "5xx")
            others = any(s != sid for s in self.table.active)
            self._pool_change(sid, health.response(status, now, others), f"{status} answers")
            return
        self.metrics.backend_error(sid, kind)
        if kind in ("refused", "connect_timeout"):
            self._pool_change(sid, health.connect_error(now), kind)
        # timeouts, disconnects, mid-stream failures: counted, never ejected (the active
        # check decides whether the backend is dead)

    def probed(self, sid: str, passed: bool) -> None:
        """The result of an active health check (from the monitor)."""
        if not passed:
            self.metrics.backend_error(sid, "health")
        others = any(s != sid for s in self.table.active)
        self._pool_change(sid, self.health[sid].probe(passed, time.monotonic(), others),
                          "failed health checks")

    def _pool_change(self, sid: str, change: PoolChange, why: str) -> None:
        if change is PoolChange.ADD and sid in self.admin_out:
            return  # taken out by the admin API: only an admin add brings it back
        if change is PoolChange.REMOVE and self.table.remove(sid, f"health: {why}"):
            self.left_pool(sid)
            state = self.health[sid]
            log.warning("backend %s out of the pool (%s; %s, back-off %.1f s)", sid, why,
                        state.state.value, state.backoff())
        elif change is PoolChange.ADD and self.table.add(sid, "health: checks passed"):
            log.info("backend %s back in the pool (health checks passed)", sid)

    def _refused(self, status: int) -> None:
        self.metrics.requests.inc("unmatched", str(status))

    def _client_gone(self, request: IncomingRequest | None) -> None:
        self.metrics.client_disconnects.inc()

    def _unhandled(self, request: IncomingRequest) -> None:
        route = self._routes.get((request.method, request.path))
        self.metrics.requests.inc(route[0] if route is not None else "unmatched", "499")

    # --------------------------------------------------------------- requests
    async def handle(self, request: IncomingRequest) -> None:
        route = self._routes.get((request.method, request.path))
        label = route[0] if route is not None else "unmatched"
        client = request.connection
        try:
            if route is None:
                status = self._no_route(request)
            else:
                status = await route[1](request)
        except BadRequest as exc:
            client.respond(exc.status, error_body(exc.status, exc.message, exc.kind),
                           [*_JSON, *exc.headers])
            status = exc.status
        except (asyncio.CancelledError, ConnectionResetError):
            status = 499  # the client left; its lease was released on the way out
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            if not client.head_sent:
                client.respond(500, error_body(500, "internal router error; see the router "
                                               "log", "internal_error"), _JSON)
            else:
                client.abort()
            status = 500
        if request.abandoned:
            status = 499  # the client left, whatever the relay managed to finish
        self.metrics.requests.inc(label, str(status))
        self._observe(request, status)

    def _observe(self, request: IncomingRequest, status: int) -> None:
        """Per-backend histograms and the access log line of a finished request."""
        ended = time.perf_counter()
        backend = request.backend
        if backend is not None:
            self.metrics.duration.observe(backend, ended - request.received_at)
            if request.first_byte_at is not None:
                self.metrics.first_byte.observe(backend,
                                                request.first_byte_at - request.received_at)
        if self.access_log is not None:
            self.access_log.write(request, status, request.session, ended)

    def _no_route(self, request: IncomingRequest) -> int:
        allowed = self._paths.get(request.path)
        if allowed is None:
            raise BadRequest(404, f"no route for {request.method} {request.path}; routes: "
                             + ", ".join(ROUTES), "not_found")
        raise BadRequest(405, f"{request.method} is not allowed on {request.path}; allowed: "
                         + ", ".join(allowed), "method_not_allowed",
                         ((b"allow", ", ".join(allowed).encode()),))  # RFC 9110 15.5.6

    def _payload(self, request: IncomingRequest) -> dict[str, Any]:
        if not request.body.strip():
            raise BadRequest(400, "request body is not valid JSON: it is empty (expected "
                             "an object)")
        try:
            payload = json.loads(request.body.decode("utf-8"))  # RFC 8259: UTF-8 on the wire
        except UnicodeDecodeError:
            raise BadRequest(400, "request body is not valid UTF-8 JSON") from None
        except json.JSONDecodeError as exc:
            raise BadRequest(400, f"request body is not valid JSON: {exc.msg} (line "
                             f"{exc.lineno} column {exc.colno})") from None
        except RecursionError:
            raise BadRequest(400, "request body is not valid JSON: nested too deeply") from None
        except ValueError as exc:  # e.g. an integer over sys.get_int_max_str_digits()
            raise BadRequest(400, f"request body is not acceptable JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise BadRequest(400, "request body must be a JSON object, got "
                             f"{type(payload).__name__}")
        return payload

    def _session_key(self, request: IncomingRequest, payload: dict[str, Any]) -> str | None:
        header = self.options.session_header
        key = _request_key("session key", request, payload, header,
                           self.options.session_body_field)
        if key is None and self.options.full_determinism:
            field = self.options.session_body_field
            raise BadRequest(400, "full determinism routes by session key: send the "
                             f"{header} header" + (f" or body field {field!r}" if field else ""))
        return key

    def _group_id(self, request: IncomingRequest, payload: dict[str, Any]) -> str | None:
        """The request's group (SPEC §7.6), read only with group stickiness on; the same
        sources and refusals as the session key."""
        if not self._groups:
            return None
        return _request_key("group id", request, payload, self.options.group_header,
                            self.options.group_body_field)

    async def _generate(self, request: IncomingRequest) -> int:
        payload = self._payload(request)
        key = self._session_key(request, payload)
        group = self._group_id(request, payload)
        chat = request.path == "/v1/chat/completions"
        context = None
        if key is not None and self.context is not None:
            context = await self.context.context_tokens(payload, chat)
        prompt = None
        placement = self.proxy.placement
        if placement is not None:
            prompt = placement.estimate(payload, chat, self.table.active)
        return await self._forward(request, key, context, group, prompt)

    async def _models(self, request: IncomingRequest) -> int:
        # A listing is routed like an unkeyed request; full determinism refuses unkeyed
        # acquires, so there it takes one fixed key (one sticky entry, a stable backend).
        request.body = b""
        return await self._forward(request, MODELS_KEY if self.options.full_determinism
                                   else None)

    async def _forward(self, request: IncomingRequest, key: str | None,
                       context_tokens: int | None = None, group_id: str | None = None,
                       prompt: tuple[list[bytes], tuple[tuple[str, int], ...]] | None = None
                       ) -> int:
        if self.active_requests >= self.options.max_concurrency:
            raise BadRequest(503, f"router at its concurrency limit of "
                             f"{self.options.max_concurrency} requests (--max-concurrency)",
                             "overloaded")
        self.active_requests += 1
        request.session = key
        try:
            return await self.proxy.forward(request, key, context_tokens, group_id, prompt)
        finally:
            self.active_requests -= 1

    async def _metrics(self, request: IncomingRequest) -> int:
        self.metrics.connections = len(self.server.connections)
        request.connection.respond(200, self.metrics.render().encode(), _TEXT)
        return 200

    async def _status(self, request: IncomingRequest) -> int:
        request.connection.respond(200, json.dumps(self.metrics.status()).encode(), _JSON)
        return 200

    async def _health(self, request: IncomingRequest) -> int:
        # ok only once a health round has completed, and only while an active backend
        # has passed its checks and not failed them since (the last one stays routable
        # even when it fails them).
        active = self.table.active
        healthy = sum(1 for sid in active if self.health[sid].healthy())
        state = ("starting" if not self.monitor.health_rounds
                 else "ok" if healthy else "no_backends")
        body = {"status": state, "active_backends": len(active), "healthy_backends": healthy}
        status = 200 if state == "ok" else 503
        request.connection.respond(status, json.dumps(body).encode(), _JSON)
        return status


def _request_key(what: str, request: IncomingRequest, payload: dict[str, Any],
                 header: str, body_field: str | None) -> str | None:
    """A routing key (``what``: "session key" or "group id") from ``header``, else from
    the JSON body's ``body_field``; None when neither carries one. Refuses (400) what
    the core or the decision log could not take: bytes that are not UTF-8, a value that
    is not a string or an integer, a lone surrogate, more than
    :data:`MAX_SESSION_KEY_CHARS` characters."""
    key: str | None = None
    raw = request.header(header.lower().encode("ascii"))
    where = f"header {header}"
    if raw is not None and raw.strip():
        try:
            key = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise BadRequest(400, f"{what} in {where} is not valid UTF-8") from None
    elif body_field is not None:
        where = f"body field {body_field!r}"
        value = payload.get(body_field)
        if isinstance(value, str):
            key = value.strip() or None
        elif isinstance(value, int) and not isinstance(value, bool):
            key = str(value)
        elif value is not None:
            raise BadRequest(400, f"{what} in {where} must be a string or an "
                             f"integer, got {type(value).__name__}")
    if key is not None and not _encodable(key):
        raise BadRequest(400, f"{what} in {where} is not valid Unicode (a lone "
                         "surrogate escape such as \\ud800)")
    if key is not None and len(key) > MAX_SESSION_KEY_CHARS:
        raise BadRequest(400, f"{what} in {where} is {len(key)} characters; the "
                         f"limit is {MAX_SESSION_KEY_CHARS}")
    return key


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def install_uvloop() -> bool:
    """Use uvloop's event loop when it is installed (the ``vllm`` extra installs it)."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


async def serve_forever(options: RouterOptions, ready: Callable[[int], None] | None = None
                        ) -> None:
    """Run until SIGINT or SIGTERM, then shut down within ``options.shutdown_grace``."""
    router = Router(options)
    # The handlers come first: a supervisor may signal as soon as it reads the ready
    # line, and a signal during the start is a stop once the start is done.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    port = await router.start()
    if ready is not None:
        ready(port)
    try:
        await stop.wait()
        log.info("shutdown: signal received; %d requests open, grace %g s",
                 router.active_requests, options.shutdown_grace)
    finally:
        await router.stop(options.shutdown_grace)
