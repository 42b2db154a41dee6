"""The listening side of the router's HTTP/1.1 layer: :class:`HttpServer`.

Theory of operation
-------------------
:class:`HttpServer` binds the socket, creates one
:class:`~affinity_vllm.http1.ClientConnection` per accepted connection and keeps the set
of open ones, so it can enforce ``max_connections``, close idle connections at shutdown,
abort the rest at the deadline, and fire the connections' deadlines: one sweep every
quarter of the shortest timeout (at most 1 s) instead of a timer armed and cancelled per
request phase. It reports what it refuses and which clients left through callbacks, so
the router's metrics stay in one place.

It also owns the request-body memory budget shared by all connections
(:class:`~affinity_vllm.limits.BodyBudget`), the drain at shutdown (:meth:`drain`: stop
accepting, close idle connections, answer the rest with ``Connection: close``), and
reports an accept the loop dropped for want of file descriptors as a router error
(:meth:`_loop_exception`): asyncio otherwise logs it on every retry and counts nothing.
uvloop drops such an accept without any report, so the deadline sweep also looks at
the descriptors in use once a second (:func:`~affinity_vllm.limits.descriptor_use`) and
reports each second spent at the limit the same way.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from .http1 import ClientConnection, Handler
from .http_messages import IncomingRequest, ServerLimits
from .limits import FD_HEADROOM, BodyBudget, descriptor_use

__all__ = ["HttpServer"]


# At a drain, a connection idle since before it is closed only after this many seconds:
# a keep-alive client between two requests sends its next one within that time, gets it
# answered with ``Connection: close``, and never writes into a connection being closed.
IDLE_CLOSE_AFTER_DRAIN = 0.25
# How often the sweep looks at the descriptors in use (a listing of /proc/self/fd).
FD_CHECK_EVERY = 1.0


class HttpServer:
    """Listens and dispatches requests to ``handler``; counts what it refuses."""

    def __init__(self, handler: Handler, limits: ServerLimits,
                 on_refused: Callable[[int], None] | None = None,
                 client_gone: Callable[[IncomingRequest | None], None] | None = None,
                 unhandled: Callable[[IncomingRequest], None] | None = None,
                 router_error: Callable[[str, str], None] | None = None,
                 fd_probe: Callable[[], tuple[int, int] | None] = descriptor_use) -> None:
        self.handler = handler
        self.limits = limits
        self.body_budget = BodyBudget(limits.body_memory_budget)
        self.draining = False  # shutting down: every response closes its connection
        self._idle_closer: asyncio.TimerHandle | None = None
        self._router_error = router_error
        self.fd_probe = fd_probe  # (in use, limit), or None: unknown
        self._fd_checked_at = 0.0
        self.loop = asyncio.get_event_loop()
        self.connections: set[ClientConnection] = set()
        self.refused_connections = 0
        self.read_timeouts = 0
        self._on_refused = on_refused
        self._client_gone = client_gone
        self._unhandled = unhandled
        self._server: asyncio.base_events.Server | None = None
        self._default_handler: Any = None
        self._sweeper: asyncio.Task[None] | None = None
        # Deadlines are checked this often: a quarter of the shortest timeout, within
        # [10 ms, 1 s], so a timeout fires at most 25% (or 1 s) late.
        self.sweep_interval = min(1.0, max(0.01, min(
            limits.header_timeout, limits.body_timeout, limits.idle_timeout) / 4))

    async def start(self, host: str, port: int) -> int:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: ClientConnection(self), host, port, backlog=1024, reuse_address=True)
        self._serving()
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def start_unix(self, path: str) -> None:
        """Listen on a unix socket at ``path``, readable and writable by this user only
        (created under umask 0o177, so there is no moment when others could connect)."""
        self.loop = asyncio.get_running_loop()
        previous = os.umask(0o177)
        try:
            self._server = await self.loop.create_unix_server(
                lambda: ClientConnection(self), path, backlog=1024)
        finally:
            os.umask(previous)
        self._serving()

    def _serving(self) -> None:
        self._sweeper = self.loop.create_task(self._sweep(), name="http-deadlines")
        self._default_handler = self.loop.get_exception_handler()
        self.loop.set_exception_handler(self._loop_exception)

    def stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()

    def close_idle(self) -> None:
        for connection in list(self.connections):
            if not connection.responding and not connection.queue and (
                    connection.transport is not None):
                connection.transport.close()

    def drain(self) -> None:
        """Stop accepting; from now on every response says ``Connection: close`` and
        closes its connection after it; connections with nothing in progress close after
        :data:`IDLE_CLOSE_AFTER_DRAIN` seconds (closing them at once would reset a client
        whose next request is already on its way)."""
        self.draining = True
        self.stop_listening()
        self._idle_closer = self.loop.call_later(IDLE_CLOSE_AFTER_DRAIN, self.close_idle)

    def abort_all(self) -> None:
        if self._idle_closer is not None:
            self._idle_closer.cancel()
            self._idle_closer = None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            now = self.loop.time()
            for connection in list(self.connections):
                if connection.deadline and connection.deadline <= now:
                    connection.expire(now)
            if now - self._fd_checked_at >= FD_CHECK_EVERY:
                self._fd_checked_at = now
                self._check_descriptors()

    def _check_descriptors(self) -> None:
        use = self.fd_probe()
        if use is not None and use[0] >= use[1] - FD_HEADROOM:
            self.router_error("fd", f"{use[0]} files open of the limit {use[1]} (ulimit -n): "
                              "new client connections may be dropped without a word while "
                              "this lasts; raise the limit or lower --max-connections")

    async def wait_closed(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def router_error(self, kind: str, message: str) -> None:
        if self._router_error is not None:
            self._router_error(kind, message)

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        # The handler is the loop's, not this server's: the one installed last (an admin
        # server's, say) sees every server's accept errors, so one with nobody to count
        # them passes them on to the handler it replaced.
        if (isinstance(exc, OSError) and "accept" in str(context.get("message", ""))
                and self._router_error is not None):
            # The loop drops the pending connection and pauses accepting (asyncio: 1 s).
            self.router_error("fd", f"a client connection could not be accepted: {exc} "
                              "(the router's file-descriptor limit; see ulimit -n and "
                              "--max-connections)")
            return
        if self._default_handler is not None:
            self._default_handler(loop, context)
        else:
            loop.default_exception_handler(context)

    def on_refused(self, status: int) -> None:
        if self._on_refused is not None:
            self._on_refused(status)

    def client_gone(self, request: IncomingRequest | None) -> None:
        if self._client_gone is not None:
            self._client_gone(request)

    def unhandled(self, request: IncomingRequest) -> None:
        """A request whose handler was cancelled before its first step."""
        if self._unhandled is not None:
            self._unhandled(request)
