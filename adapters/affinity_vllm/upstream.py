"""The router's backend side: pooled HTTP/1.1 connections on asyncio protocols.

Theory of operation
-------------------
:class:`UpstreamPool` keeps idle keep-alive connections per backend. One request
borrows a connection (or opens one within ``connect_timeout``), writes the request
head and body in one write, and reads the answer through an ``httptools`` response
parser:

* :meth:`UpstreamConnection.head` waits for the status line and headers;
* :meth:`UpstreamConnection.read` returns the next body bytes, ``b""`` at the end;
* the connection goes back to the pool only after a complete response that allows
  keep-alive; anything else (an error, a cancelled relay, a response cut short) closes
  it, which is how a cancelled client request reaches vLLM (it aborts the generation
  when its connection closes).

**Errors** say what was known when they happened, because that decides retry and
health: :class:`ConnectFailed` (nothing was sent: refused or connect timeout),
:class:`UpstreamTimeout` (``read_timeout`` seconds without a byte from the backend,
checked by one periodic sweep over the requests in flight rather than a timer per
request or per read) and
:class:`UpstreamClosed` (the backend closed or reset the connection; ``received``
tells whether any response byte had arrived).

**Flow control.** Body bytes are buffered per connection up to :data:`HIGH_WATER`;
above it the socket stops being read until the relay catches up, so a huge response
through a slow client holds at most that much memory in the router. While reading is
paused the backend's silence is not timed: a slow *client* is not a silent backend.

**No response reaches the wrong request.** A keep-alive connection carries one request
at a time, and its bytes are trusted only while that request is open:

* interim responses (1xx, RFC 9110 section 15.2) are never taken as the final one:
  ``100 Continue`` is consumed (the router answered the client's ``Expect`` itself and
  never forwards it), other 1xx (``103 Early Hints``) go to ``on_interim`` for the
  proxy to relay, and ``101`` (a protocol switch nobody asked for) is a malformed
  response;
* a byte that arrives while no request is open -- on an idle pooled connection, or
  behind a complete response -- marks the connection dirty: it is closed, never
  pooled, and the bytes are never parsed into the response being relayed;
* response headers above ``max_header_bytes`` (status line + fields) fail the request
  as a malformed response, so a backend cannot grow the router's memory with them.

**Router-side failures.** A connect that fails because the *router* is out of file
descriptors or memory (``EMFILE``, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``) raises
:class:`RouterResourceError`: not the backend's fault, never counted against it.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import time
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

__all__ = ["HIGH_WATER", "MAX_RESPONSE_HEADER_BYTES", "ROUTER_RESOURCE_ERRNOS", "ConnectFailed",
           "RouterResourceError", "UpstreamClosed", "UpstreamConnection", "UpstreamError",
           "UpstreamPool", "UpstreamTimeout"]

HIGH_WATER = 256 << 10
# asyncio.wait_for can swallow a cancellation that races with completion (before 3.12);
# a client that leaves during a connect must cancel the request, so prefer timeout().
_timeout = getattr(asyncio, "timeout", None)
MAX_IDLE_PER_BACKEND = 256
# A backend's status line plus header fields; vLLM sends well under 1 KiB.
MAX_RESPONSE_HEADER_BYTES = 64 << 10
# connect() errors that mean the router itself ran out of a resource, not that the
# backend refused.
ROUTER_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
Interim = Callable[[int, bytes, "list[tuple[bytes, bytes]]"], None]


class UpstreamError(Exception):
    """A backend failure; ``kind`` is the ``backend_errors_total`` label."""

    kind = "error"


class ConnectFailed(UpstreamError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # refused | connect_timeout


class RouterResourceError(ConnectFailed):
    """The router could not open a connection for want of its own resources (file
    descriptors, buffers): the router's error, never a backend's."""

    def __init__(self, message: str) -> None:
        super().__init__("router_resources", message)


class UpstreamTimeout(UpstreamError):
    kind = "timeout"


class UpstreamClosed(UpstreamError):
    def __init__(self, message: str, received: bool) -> None:
        super().__init__(message)
        self.received = received
        self.kind = "mid_stream" if received else "disconnected"


class UpstreamConnection(asyncio.Protocol):
    def __init__(self, pool: UpstreamPool, backend: str) -> None:
        self.pool = pool
        self.backend = backend
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.closed = False
        self.received = False
        self.reused = False  # borrowed from the pool (a close before any byte may be stale)
        self.complete = False
        self.headers_done = False
        self.in_request = False  # a request is open: its response bytes are expected
        self.dirty = False  # a byte came that no open request asked for: never pool it
        self.on_interim: Interim | None = None  # relays a 1xx other than 100 (proxy)
        self._interim = False  # the message being parsed is a 1xx
        self._header_bytes = 0
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._last_activity = 0.0
        self._read_timeout = 0.0

    # ------------------------------------------------------------- protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is None and self.headers_done and not self.complete and not any(
                name in (b"content-length", b"transfer-encoding") for name, _ in self.headers):
            self.complete = True  # a body delimited by the close (RFC 9112 section 6.3)
            self.pool.busy.discard(self)
            self._wake()
        if not self.complete and self._error is None and self in self.pool.busy:
            self._fail(UpstreamClosed(
                f"backend {self.backend} closed the connection"
                + (f" ({exc!r})" if exc else ""), self.received))
        self.pool.busy.discard(self)

    def data_received(self, data: bytes) -> None:
        if not self.in_request:  # stray bytes on an idle pooled connection: not ours
            self.dirty = True
            self.close()
            return
        self.received = True
        self._last_activity = self.loop.time()
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self._header_bytes > self.pool.max_header_bytes:
                reason = (f"response headers exceed {self.pool.max_header_bytes} bytes")
            elif isinstance(exc, httptools.HttpParserUpgrade):
                reason = "it switched protocols (101) unasked"
            else:
                reason = str(exc)
            self.dirty = True
            self._fail(UpstreamClosed(f"backend {self.backend} sent a malformed response: "
                                      f"{reason}", True))
            if self.transport is not None:
                self.transport.abort()
            return
        if self.dirty and self.transport is not None:
            self.transport.abort()  # bytes behind the response: the stream is not ours

    def eof_received(self) -> bool | None:
        return None

    # ------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        if not self.in_request:  # a second message behind the complete response
            self.dirty = True

    def on_status(self, status: bytes) -> None:
        if self.dirty:
            return
        self._header_bytes += len(status)
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.dirty:
            return
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.pool.max_header_bytes:
            raise ValueError("response headers too large")  # the parser stops here
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.dirty:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # Interim: never the final response (RFC 9110 section 15.2). 100 answers an
            # Expect the router never forwards; the others (103) are relayed.
            self._interim = True
            headers, reason = self.headers, self.reason
            self.headers, self.reason, self._header_bytes = [], b"", 0
            if status != 100 and self.on_interim is not None:
                self.on_interim(status, reason, headers)
            return
        self.status = status
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.dirty:
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:  # the final response follows on the same connection
            self._interim = False
            return
        if self.dirty:
            return
        self.in_request = False
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self.pool.busy.discard(self)
        self._wake()

    # ------------------------------------------------------------ requests
    def send(self, head: bytes, body: bytes, read_timeout: float) -> None:
        """Write the request; reset the per-request state; watch it for silence."""
        assert self.transport is not None
        self.status, self.reason, self.headers = 0, b"", []
        self.received = self.complete = self.headers_done = False
        self.keep_alive = False
        self.on_interim = None
        self._interim = False
        self._header_bytes = 0
        self.in_request = True
        self._error = None
        self._read_timeout = read_timeout
        self._last_activity = self.loop.time()
        self.pool.watch(self)
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)

    async def head(self) -> None:
        """Wait for the response's status line and headers."""
        while not self.headers_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read(self) -> bytes:
        """The next body bytes (all that are buffered), ``b""`` at the end."""
        while True:
            if self._chunks:
                data = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
                self._chunks.clear()
                self._buffered = 0
                if self._paused and self.transport is not None:
                    self._paused = False
                    self._last_activity = self.loop.time()  # silence is timed afresh
                    self.transport.resume_reading()
                return data
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()

    def done(self) -> None:
        """Hand the connection back: pooled after a clean keep-alive response, else closed."""
        self.pool.busy.discard(self)
        self.on_interim = None
        if self.complete and self.keep_alive and not self.closed and not self._chunks and (
                not self.dirty):
            self.pool.give_back(self)
        else:
            self.close()

    def close(self) -> None:
        self.pool.busy.discard(self)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()  # abort: never linger on a backend we stopped reading

    # ------------------------------------------------------------- internals
    async def _wait(self) -> None:
        waiter = self._waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        self.in_request = False
        if self._error is None:
            self._error = error
        self.pool.busy.discard(self)
        self._wake()

    def check_silence(self, now: float) -> None:
        """Fail the request if the backend has sent nothing for ``read_timeout``; not
        while reading is paused for a slow client (the silence is the router's)."""
        if not self.complete and self._error is None and not self._paused and (
                now - self._last_activity >= self._read_timeout):
            self._fail(UpstreamTimeout(f"backend {self.backend} sent nothing for "
                                       f"{self._read_timeout:g} s"))


class UpstreamPool:
    """Idle keep-alive connections per backend base URL (``http://host:port``)."""

    def __init__(self, connect_timeout: float, read_timeout: float = 600.0,
                 max_header_bytes: int = MAX_RESPONSE_HEADER_BYTES) -> None:
        self.connect_timeout = connect_timeout
        self.max_header_bytes = max_header_bytes
        self.loop = asyncio.get_event_loop()
        # Requests waiting for their backend; one sweep checks their silence (a timer per
        # request cost ~7 us to arm and cancel). Checked every quarter of the read
        # timeout, within [10 ms, 1 s].
        self.busy: set[UpstreamConnection] = set()
        self.sweep_interval = min(1.0, max(0.01, read_timeout / 4))
        self._sweeper: asyncio.Task[None] | None = None
        self._idle: dict[str, list[UpstreamConnection]] = {}
        self._addresses: dict[str, tuple[str, int, bytes]] = {}
        self.opened = 0

    def address(self, backend: str) -> tuple[str, int, bytes]:
        """(host, port, Host header value) of a backend URL."""
        known = self._addresses.get(backend)
        if known is None:
            parts = urlsplit(backend)
            if parts.scheme != "http":
                raise ConnectFailed("refused", f"backend {backend}: only http:// is supported")
            host = parts.hostname or "127.0.0.1"
            port = parts.port or 80
            known = self._addresses[backend] = (host, port, parts.netloc.encode("latin-1"))
        return known

    async def connect(self, backend: str) -> UpstreamConnection:
        """An idle pooled connection, or a new one within ``connect_timeout``."""
        idle = self._idle.get(backend)
        while idle:
            connection = idle.pop()
            if not connection.closed and not connection.dirty and (
                    connection.transport is not None) and not connection.transport.is_closing():
                connection.reused = True
                return connection
        host, port, _ = self.address(backend)
        self.loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            connecting = self.loop.create_connection(
                lambda: UpstreamConnection(self, backend), host, port)
            if _timeout is not None:  # 3.11+: never swallows a cancellation
                async with _timeout(self.connect_timeout):
                    _, protocol = await connecting
            else:  # pragma: no cover - Python 3.10
                _, protocol = await asyncio.wait_for(connecting, self.connect_timeout)
        except asyncio.TimeoutError:
            raise ConnectFailed("connect_timeout", f"backend {backend}: no connection within "
                                f"{self.connect_timeout:g} s") from None
        except OSError as exc:
            if exc.errno in ROUTER_RESOURCE_ERRNOS:
                raise RouterResourceError(
                    f"router cannot open a connection to backend {backend}: "
                    f"{exc.strerror or exc} (the router's own limit, not the backend's; "
                    "see ulimit -n and --max-connections)") from None
            raise ConnectFailed("refused", f"backend {backend}: cannot connect "
                                f"({exc.strerror or exc}) after "
                                f"{time.monotonic() - started:.3f} s") from None
        self.opened += 1
        return protocol

    def watch(self, connection: UpstreamConnection) -> None:
        self.busy.add(connection)
        if self._sweeper is None:
            self._sweeper = self.loop.create_task(self._sweep(), name="upstream-silence")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            now = self.loop.time()
            for connection in list(self.busy):
                connection.check_silence(now)

    def give_back(self, connection: UpstreamConnection) -> None:
        idle = self._idle.setdefault(connection.backend, [])
        if len(idle) < MAX_IDLE_PER_BACKEND:
            idle.append(connection)
        else:
            connection.close()

    def drop(self, backend: str) -> None:
        """Close a backend's idle connections (it failed or left the pool)."""
        for connection in self._idle.pop(backend, []):
            connection.close()

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for backend in list(self._idle):
            self.drop(backend)

    def idle_count(self) -> int:
        return sum(len(v) for v in self._idle.values())
