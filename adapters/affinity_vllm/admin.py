"""``affinity serve``'s run-time pool API: list, add, remove and drain backends.

Theory of operation
-------------------
The API listens on its own port (``--admin-port``), on a unix socket
(``--admin-socket``), or both; it is off by default, and never on the client-facing port,
so exposing the router does not expose its pool. Bound to a loopback address it may run
without a token; bound anywhere else it needs ``--admin-token-file`` (the options refuse
to start otherwise), and every request must then carry ``Authorization: Bearer <token>``
(compared in constant time) or get 401. The socket is created with mode 0600, so the
file system says who may use it: only the router's own user (the token, when given, is
checked there too). A stale socket left by a killed router is replaced; any other file at
the path, or a socket another process still answers on, is refused at start
(:func:`socket_path_problem`), so the router never deletes what is not its own.

Every change is a core event through :class:`~affinity_vllm.routing.RoutingTable` --
``AddServers`` or ``RemoveServers`` -- written to the decision log with the operator's
``reason`` (prefixed ``admin add:`` / ``admin remove:`` / ``admin drain:``), so
``affinity replay`` checks it like any other event and the log says who moved the pool
and why. The core has no notion of draining: a drained backend leaves the pool at once
(``RemoveServers``: no request is routed to it any more, and sessions pinned to it move
on their next turn), while requests already running on it finish normally. What drain
adds over remove is the wait: its answer can block (``"wait"`` seconds) until the
backend has no request left, so an operator knows when it is safe to stop it. Remove
never cuts a running request either.

A backend the admin took out is not re-added by health checks; only an admin ``add``
brings it back. ``add`` of a URL the router does not know registers a new backend (its
URL validated like ``--backend``) and puts it in the pool.

Routes (JSON in, JSON out; errors are JSON with a 4xx status, never a traceback):

* ``GET /backends`` -- every known backend with its state (``active``, ``ejected``,
  ``removed``, ``draining``, ``drained``), requests open on it and health; ``urls`` lists
  the routable ones;
* ``POST /backends/add``, ``/backends/remove``, ``/backends/drain`` -- body
  ``{"url": ..., "reason": ...}`` (``reason`` optional, at most 200 characters), drain
  also ``"wait"`` (seconds, default 0, at most 3600).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import socket
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .http1 import IncomingRequest, ServerLimits, error_body
from .http_server import HttpServer
from .options import OptionsError, normalise_backend_url

if TYPE_CHECKING:
    from .router import Router

__all__ = ["ADMIN_ROUTES", "MAX_REASON_CHARS", "MAX_SOCKET_PATH_BYTES", "MAX_WAIT_SECONDS",
           "AdminApi", "AdminError", "socket_path_problem"]

log = logging.getLogger("affinity_vllm.admin")

MAX_REASON_CHARS = 200
MAX_WAIT_SECONDS = 3600.0
MAX_SOCKET_PATH_BYTES = 107  # Linux's sun_path holds 108 bytes with the terminating NUL
ADMIN_ROUTES = ("GET /backends", "POST /backends/add", "POST /backends/remove",
                "POST /backends/drain")
_JSON = [(b"content-type", b"application/json")]


def socket_path_problem(path: str) -> str | None:
    """Why ``--admin-socket PATH`` cannot be used, or None (then PATH is free, or holds a
    stale socket that nobody answers on, which the start replaces)."""
    size = len(os.fsencode(path))
    if not 1 <= size <= MAX_SOCKET_PATH_BYTES:
        return (f"--admin-socket {path!r}: a unix socket path takes 1 to "
                f"{MAX_SOCKET_PATH_BYTES} bytes, got {size}")
    parent = Path(path).absolute().parent
    if not parent.is_dir():
        return (f"--admin-socket {path}: directory {parent} does not exist (create it "
                "first; the router does not create directories)")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(mode):
        return (f"--admin-socket {path}: a file that is not a socket is there; the router "
                "does not delete it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError:
        return None  # stale: its router is gone
    finally:
        probe.close()
    return (f"--admin-socket {path}: another process answers on this socket (a second "
            "router?); stop it or choose another path")


class AdminError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers


class AdminApi:
    """The pool API of one :class:`~affinity_vllm.router.Router` (see the module doc)."""

    def __init__(self, router: Router, token: str | None) -> None:
        self.router = router
        self._token = None if token is None else token.encode("utf-8")
        options = router.options
        self.server = HttpServer(self.handle, ServerLimits(
            max_header_bytes=options.max_header_bytes, max_headers=64,
            max_body_bytes=64 << 10, header_timeout=options.header_timeout,
            body_timeout=options.body_timeout, idle_timeout=options.idle_timeout,
            max_connections=64))
        self.port: int | None = None
        self.socket_path: str | None = None
        self._socket_identity: tuple[int, int] | None = None  # (device, inode) we bound
        self._unix_server: HttpServer | None = None

    async def start(self, host: str, port: int) -> int:
        self.port = await self.server.start(host, port)
        return self.port

    async def start_unix(self, path: str) -> None:
        """Listen on the unix socket ``path`` too (checked again here: the check at
        configuration time may be old)."""
        problem = socket_path_problem(path)
        if problem is not None:
            raise OSError(problem)
        if os.path.lexists(path):
            os.unlink(path)  # a stale socket (socket_path_problem said so)
        limits = self.server.limits
        self._unix_server = HttpServer(self.handle, limits)
        await self._unix_server.start_unix(path)
        self.socket_path = path
        bound = os.lstat(path)
        self._socket_identity = (bound.st_dev, bound.st_ino)

    def stop(self) -> None:
        for server in (self.server, self._unix_server):
            if server is not None:
                server.stop_listening()
                server.abort_all()
        path, self.socket_path = self.socket_path, None
        if path is not None:
            try:
                now = os.lstat(path)
                if (now.st_dev, now.st_ino) == self._socket_identity:
                    os.unlink(path)  # ours; a file put there since is not
            except OSError:
                pass  # already gone

    # ------------------------------------------------------------------ requests
    async def handle(self, request: IncomingRequest) -> None:
        client = request.connection
        try:
            self._authorize(request)
            status, body = await self._route(request)
        except AdminError as exc:
            client.respond(exc.status, error_body(exc.status, exc.message, exc.kind),
                           [*_JSON, *exc.headers])
            return
        except Exception:
            log.exception("unhandled error on admin %s %s", request.method, request.path)
            client.respond(500, error_body(500, "internal router error; see the router log",
                                           "internal_error"), _JSON)
            return
        client.respond(status, json.dumps(body).encode(), _JSON)

    def _authorize(self, request: IncomingRequest) -> None:
        if self._token is None:
            return
        given = request.header(b"authorization") or b""
        scheme, _, credentials = given.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(),
                                                                  self._token):
            raise AdminError(401, "the admin API needs Authorization: Bearer <token> (the "
                             "token of --admin-token-file)", "unauthorized",
                             ((b"www-authenticate", b'Bearer realm="affinity-admin"'),))

    async def _route(self, request: IncomingRequest) -> tuple[int, dict[str, Any]]:
        key = f"{request.method} {request.path}"
        if key == "GET /backends":
            return 200, self.listing()
        if key in ("POST /backends/add", "POST /backends/remove", "POST /backends/drain"):
            action = request.path.rsplit("/", 1)[1]
            payload = _payload(request.body)
            url = _url(payload.get("url"))
            reason = _reason(payload.get("reason"))
            if action == "add":
                return 200, self.add(url, reason)
            if action == "remove":
                return 200, self.remove(url, reason, drain=False)
            wait = _wait(payload.get("wait", 0))
            return 200, await self.drain(url, reason, wait)
        known = {r.split(" ", 1)[1] for r in ADMIN_ROUTES}
        if request.path in known:
            allowed = sorted(r.split(" ", 1)[0] for r in ADMIN_ROUTES
                             if r.split(" ", 1)[1] == request.path)
            raise AdminError(405, f"{request.method} is not allowed on {request.path}; "
                             f"allowed: {', '.join(allowed)}", "method_not_allowed",
                             ((b"allow", ", ".join(allowed).encode()),))
        raise AdminError(404, f"no admin route for {key}; routes: " + ", ".join(ADMIN_ROUTES),
                         "not_found")

    # ------------------------------------------------------------------- actions
    def listing(self) -> dict[str, Any]:
        router = self.router
        table = router.table
        backends = []
        for sid in table.servers:
            backends.append({"url": sid, "state": self.state_of(sid),
                             "open_requests": table.open_requests.get(sid, 0),
                             "health": router.health[sid].state.value})
        return {"backends": backends, "urls": list(table.active)}

    def state_of(self, sid: str) -> str:
        router = self.router
        if router.table.is_active(sid):
            return "active"
        taken = router.admin_out.get(sid)
        if taken is None:
            return "ejected"  # out by health, back when its check passes
        if taken == "drain":
            return "draining" if router.table.open_requests.get(sid, 0) else "drained"
        return "removed"

    def add(self, url: str, reason: str) -> dict[str, Any]:
        router = self.router
        new = url not in router.table.servers
        if new:
            router.register_backend(url)
        router.admin_out.pop(url, None)
        changed = router.table.add(url, f"admin add: {reason}")
        log.info("admin: backend %s %s (%s)", url, "added" if changed else "already active",
                 reason)
        return {"url": url, "changed": changed, "new": new, "state": self.state_of(url)}

    def remove(self, url: str, reason: str, *, drain: bool) -> dict[str, Any]:
        router = self.router
        if url not in router.table.servers:
            raise AdminError(404, f"unknown backend {url}; known: "
                             + ", ".join(router.table.servers), "not_found")
        verb = "drain" if drain else "remove"
        if router.table.is_active(url) and len(router.table.active) == 1:
            raise AdminError(409, f"cannot {verb} {url}: it is the last backend in the pool "
                             "(add another first)", "conflict")
        changed = router.table.remove(url, f"admin {verb}: {reason}")
        router.admin_out[url] = verb
        if changed:
            router.left_pool(url)
        log.info("admin: backend %s %s (%s; %d requests still open on it)", url,
                 verb + ("ed" if verb == "drain" else "d") if changed else "already out",
                 reason, router.table.open_requests.get(url, 0))
        return {"url": url, "changed": changed, "state": self.state_of(url),
                "open_requests": router.table.open_requests.get(url, 0)}

    async def drain(self, url: str, reason: str, wait: float) -> dict[str, Any]:
        answer = self.remove(url, reason, drain=True)
        deadline = time.monotonic() + wait
        open_requests = self.router.table.open_requests
        while open_requests.get(url, 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        answer["state"] = self.state_of(url)
        answer["open_requests"] = open_requests.get(url, 0)
        return answer


def _payload(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body.decode("utf-8")) if body.strip() else None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError):
        raise AdminError(400, "request body is not valid UTF-8 JSON") from None
    if not isinstance(payload, dict):
        raise AdminError(400, 'request body must be a JSON object like {"url": '
                         '"http://host:port", "reason": "..."}')
    unknown = sorted(set(payload) - {"url", "reason", "wait"})
    if unknown:
        raise AdminError(400, f"unknown fields {unknown}; accepted: url, reason, wait")
    return payload


def _url(value: Any) -> str:
    if not isinstance(value, str):
        raise AdminError(400, f"url must be a backend URL string, got {value!r}")
    try:
        return normalise_backend_url(value)
    except OptionsError as exc:
        raise AdminError(400, str(exc)) from None


def _reason(value: Any) -> str:
    if value is None:
        return "no reason given"
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_REASON_CHARS:
        raise AdminError(400, f"reason must be a non-empty string of at most "
                         f"{MAX_REASON_CHARS} characters, got {str(value)[:60]!r}")
    return value.strip()


def _wait(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 <= value <= MAX_WAIT_SECONDS):
        raise AdminError(400, f"wait must be a number of seconds in [0, "
                         f"{MAX_WAIT_SECONDS:g}], got {value!r}")
    return float(value)
