"""The router's client side: a lean HTTP/1.1 server on asyncio protocols and httptools.

Theory of operation
-------------------
One :class:`ClientConnection` (an :class:`asyncio.Protocol`) per client connection
feeds the bytes it receives to an ``httptools`` request parser. When a request is
complete, the connection hands an :class:`IncomingRequest` to the server's handler in a
new task and answers through :meth:`ClientConnection.start_response`,
:meth:`~ClientConnection.send` and :meth:`~ClientConnection.finish`. There is no
per-request framework object, middleware chain or header multidict: the router's own
cost per request is parsing, one task and a few writes.

**Limits, all refused with the router's JSON error body and the connection closed:**

* the request line and every header field at most ``max_header_bytes``, at most
  ``max_headers`` fields, the whole header section at most ``max_headers *
  max_header_bytes`` (400);
* a body above ``max_body_bytes`` (413, from Content-Length before reading it, or
  while reading a chunked body);
* a request whose headers are not complete ``header_timeout`` seconds after its first
  byte, or whose body is not complete ``body_timeout`` seconds after its headers
  (408) -- half-written requests cannot hold a connection;
* a connection idle between requests for ``idle_timeout`` seconds is closed;
* (these three are deadlines on the connection, fired by one sweep of all connections
  every quarter of the shortest timeout -- at most 1 s late -- instead of a timer armed
  and cancelled per request phase);
* connections beyond ``max_connections`` get 503 and are closed at once;
* a body that does not fit the server's global ``body_memory_budget`` (the bodies of all
  connections held at once, :class:`~affinity_vllm.limits.BodyBudget`) gets 503;
* an HTTP/1.1 request without a ``Host`` field, or any request with more than one
  (RFC 9112 section 3.2), gets 400;
* bytes the parser cannot read (400) -- behind pipelined requests, only after their
  answers (a too-short Content-Length still gets its answer, then the 400).

A HEAD response is never followed by its body (a keep-alive client would misread it).

**Interim responses.** ``100 Continue`` goes only to an HTTP/1.1 client that sent
``Expect: 100-continue``, and only when no earlier response is still being written on
the connection (a 1xx in the middle of a pipelined response would be read as part of
it): behind a response in progress it is sent when that response ends, if the body has
not come by then. :meth:`ClientConnection.interim` relays a backend's other 1xx (``103
Early Hints``) the same way: to HTTP/1.1 clients, before the final response's head.

**Draining** (``server.draining``, at SIGTERM): every response from then on says
``Connection: close`` and its connection closes after it, so a keep-alive client learns
to reconnect elsewhere instead of sending its next request into a reset.

**Client abandonment.** While a handler runs, the connection keeps reading, so a close
or reset by the client is seen at once: ``connection_lost`` (or EOF) cancels the
handler's task. The handler's ``finally`` blocks then release whatever it holds; the
cancellation reaches the upstream request, whose connection is closed. Pipelined
requests are parsed as they arrive and queued (reading pauses above
:data:`PIPELINE_DEPTH` queued requests); each is handled after the previous response
ended.

**Flow control.** ``send`` returns an awaitable only while the transport's write buffer
is above its high-water mark (``pause_writing``), so a slow client slows the relay
instead of growing memory. Everything runs on the event loop thread; nothing here
blocks or holds a lock.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

import httptools

from .http_messages import IncomingRequest, ServerLimits, error_body, status_line

if TYPE_CHECKING:
    from .http_server import HttpServer

__all__ = ["PIPELINE_DEPTH", "ClientConnection", "Handler", "IncomingRequest", "ServerLimits",
           "error_body"]

PIPELINE_DEPTH = 16
# Fields of a relayed 1xx that describe the backend's connection, not the response.
_INTERIM_DROPPED = frozenset({b"connection", b"keep-alive", b"transfer-encoding",
                              b"content-length", b"upgrade", b"proxy-connection", b"te",
                              b"trailer"})


class _Refuse(Exception):
    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


Handler = Callable[[IncomingRequest], Coroutine[Any, Any, None]]


class ClientConnection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.parser = httptools.HttpRequestParser(self)
        self.parsing: IncomingRequest | None = None  # the request being read
        self.request: IncomingRequest | None = None  # the request being answered
        self.queue: collections.deque[IncomingRequest] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.responding = False  # a response is in progress (a handler runs)
        self.head_sent = False
        self.chunked = False
        self.no_body = False  # answering HEAD: headers only
        self._refusal: _Refuse | None = None  # for a request behind the one being answered
        self._continue_due: IncomingRequest | None = None  # its 100 waits for the response
        self._reserved = 0  # body budget held by the request being read
        self._body: list[bytes] = []
        self._body_size = 0
        self._head_size = 0
        self._url_size = 0
        self._headers_done = True
        self._reading_paused = False
        self.deadline = 0.0  # loop time when _on_expire runs; 0: none (see HttpServer._sweep)
        self._on_expire: Callable[[], None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._write_paused = False

    # ------------------------------------------------------------ transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.server.connections.add(self)
        if len(self.server.connections) > self.limits.max_connections:
            self.server.refused_connections += 1
            self._refuse(_Refuse(503, f"router at its connection limit of "
                                 f"{self.limits.max_connections} (--max-connections)",
                                 "overloaded"))
            return
        self._arm(self.limits.idle_timeout, self._idle_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self._reserved:
            self.server.body_budget.give_back(self._reserved)
            self._reserved = 0
        for queued in self.queue:
            self._give_back(queued)
        if self.task is None:
            self._give_back(self.request)
        self._disarm()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("client went away"))
        self._abandon()

    def eof_received(self) -> bool | None:
        # A client that half-closes while its request runs has gone (as for nginx).
        self._abandon()
        return None  # close the transport

    def _abandon(self) -> None:
        """The client left: cancel the running handler once (it releases on the way out)."""
        task, request = self.task, self.request
        if task is not None and not task.done() and request is not None and (
                not request.abandoned):
            request.abandoned = True
            self.server.client_gone(request)
            task.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    def data_received(self, data: bytes) -> None:
        if self._refusal is None:  # after a parse error the parser's state is undefined
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        try:
            if not self._headers_done:
                self._head_size += len(data)
            self.parser.feed_data(data)
            if not self._headers_done and self._head_size > (
                    self.limits.max_headers * self.limits.max_header_bytes):
                raise _Refuse(400, "request header section exceeds "
                              f"{self.limits.max_headers * self.limits.max_header_bytes} bytes",
                              "invalid_request_error")
        except _Refuse as refusal:
            self._refuse(refusal)
        except httptools.HttpParserUpgrade:
            self._refuse(_Refuse(400, "protocol upgrades are not supported",
                                 "invalid_request_error"))
        except httptools.HttpParserError as exc:
            cause = exc.__context__ if isinstance(exc.__context__, _Refuse) else None
            if cause is not None:
                self._refuse(cause)
            else:
                self._refuse(_Refuse(400, f"malformed HTTP request: {exc}",
                                     "invalid_request_error"))

    # ------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        self.parsing = IncomingRequest(self, time.perf_counter())
        self._headers_done = False
        self._head_size = 0
        self._url_size = 0
        self._body = []
        self._body_size = 0
        self._arm(self.limits.header_timeout, self._read_expired)

    def on_url(self, url: bytes) -> None:
        assert self.parsing is not None
        self._url_size += len(url)
        if self._url_size > self.limits.max_header_bytes:
            raise _Refuse(400, f"request line: got more than {self.limits.max_header_bytes} "
                          "bytes (--max-header-bytes)", "invalid_request_error")
        self.parsing.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.parsing is not None
        headers = self.parsing.headers
        if len(name) + len(value) > self.limits.max_header_bytes:
            raise _Refuse(400, f"header field {name[:64]!r}: got more than "
                          f"{self.limits.max_header_bytes} bytes (--max-header-bytes)",
                          "invalid_request_error")
        if len(headers) >= self.limits.max_headers:
            raise _Refuse(400, f"more than {self.limits.max_headers} request headers",
                          "invalid_request_error")
        if self._headers_done:
            # A chunked body's trailer field: never a header (RFC 9110 section 6.5.1),
            # so it cannot route (a session key) nor be forwarded (credentials).
            return
        headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        request = self.parsing
        assert request is not None
        self._headers_done = True
        request.method = self.parser.get_method().decode("ascii", "replace")
        request.version = self.parser.get_http_version()
        try:
            parsed = httptools.parse_url(request.target)
        except httptools.HttpParserInvalidURLError:
            raise _Refuse(400, "malformed request target", "invalid_request_error") from None
        path = parsed.path or b"/"
        request.path = path.decode("latin-1")
        request.query = parsed.query or b""
        # Origin form only: the scheme, authority and fragment of the raw target never
        # reach a backend.
        request.target = path + b"?" + request.query if request.query else path
        hosts = sum(1 for name, _ in request.headers if name == b"host")
        if hosts > 1 or (hosts == 0 and request.version != "1.0"):
            raise _Refuse(400, f"a request needs exactly one Host header field, got {hosts} "
                          "(RFC 9112 section 3.2)", "invalid_request_error")
        length = request.header(b"content-length")
        if length is not None and length.strip().isdigit():
            declared = int(length)
            if declared > self.limits.max_body_bytes:
                raise _Refuse(413, f"request body exceeds the limit of "
                              f"{self.limits.max_body_bytes} bytes (--max-body-bytes)",
                              "request_too_large")
            self._reserve(declared)
        if request.header(b"expect") == b"100-continue" and request.version == "1.1" and (
                self.transport is not None):
            if self.responding or self.queue:
                self._continue_due = request  # sent when the responses before it end
            else:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._arm(self.limits.body_timeout, self._read_expired)

    def _reserve(self, size: int) -> None:
        if not self.server.body_budget.reserve(size):
            self.server.router_error("body_memory", f"a request body of {size} bytes does "
                                     "not fit the request-body memory budget of "
                                     f"{self.limits.body_memory_budget} bytes")
            raise _Refuse(503, "router out of request-body memory: the bodies held now "
                          f"leave less than {size} bytes of the "
                          f"{self.limits.body_memory_budget}-byte budget "
                          "(--body-memory-budget); retry later", "router_overloaded")
        self._reserved += size

    def _give_back(self, request: IncomingRequest | None) -> None:
        if request is not None and request.reserved:
            self.server.body_budget.give_back(request.reserved)
            request.reserved = 0

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self.limits.max_body_bytes:
            raise _Refuse(413, f"request body exceeds the limit of "
                          f"{self.limits.max_body_bytes} bytes (--max-body-bytes)",
                          "request_too_large")
        if self._body_size > self._reserved:  # chunked, or more than declared
            self._reserve(self._body_size - self._reserved)
        self._body.append(body)

    def on_message_complete(self) -> None:
        request = self.parsing
        assert request is not None
        self.parsing = None
        self._disarm()
        request.body = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        self._body = []
        request.reserved, self._reserved = self._reserved, 0
        if self._continue_due is request:
            self._continue_due = None
        request.keep_alive = self.parser.should_keep_alive()
        self.queue.append(request)
        if len(self.queue) >= PIPELINE_DEPTH and self.transport is not None:
            self.transport.pause_reading()
            self._reading_paused = True
        if not self.responding:
            self._next()

    def _next(self) -> None:
        request = self.queue.popleft()
        self.request = request
        self.responding = True
        self.head_sent = False
        self.task = self.loop.create_task(self.server.handler(request))
        self.task.add_done_callback(self._handler_done)

    # ------------------------------------------------------------- responses
    def start_response(self, status: int, headers: list[tuple[bytes, bytes]],
                       content_length: int | None, body: bytes = b"") -> None:
        """Send the status line and headers (and ``body``, in the same write);
        ``content_length`` None means chunked."""
        if self.transport is None or self.closed:
            return
        request = self.request
        keep = request is not None and request.keep_alive and not self.server.draining
        parts = [status_line(status)]
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if content_length is not None:
            parts.append(b"content-length: %d\r\n" % content_length)
            self.chunked = False
        elif request is not None and request.version == "1.0":
            keep = False  # an HTTP/1.0 client reads to the close
            self.chunked = False
        else:
            parts.append(b"transfer-encoding: chunked\r\n")
            self.chunked = True
        if not keep:
            parts.append(b"connection: close\r\n")
            if request is not None:
                request.keep_alive = False
        self.no_body = request is not None and request.method == "HEAD"
        parts += (b"\r\n",) if self.no_body else (b"\r\n", body)
        self.transport.write(b"".join(parts))
        self.head_sent = True

    def interim(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        """Relay a backend's 1xx (not 100) before the final head: HTTP/1.1 clients only
        (RFC 9110 section 15.2), end-to-end fields only."""
        request = self.request
        if self.transport is None or self.closed or self.head_sent or request is None or (
                request.version != "1.1" or request.abandoned):
            return
        parts = [b"HTTP/1.1 %d %s\r\n" % (status, reason.strip() or b"Informational")]
        for name, value in headers:
            if name not in _INTERIM_DROPPED:
                parts += (name, b": ", value, b"\r\n")
        parts.append(b"\r\n")
        self.transport.write(b"".join(parts))

    def send(self, data: bytes) -> Awaitable[None] | None:
        """Write body bytes; returns an awaitable while the client is not keeping up."""
        if self.transport is None or self.closed:
            raise ConnectionResetError("client went away")
        if data and not self.no_body:
            if self.chunked:
                self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
            else:
                self.transport.write(data)
        if self._write_paused:
            if self._drain is None:
                self._drain = self.loop.create_future()
            return self._drain
        return None

    def finish(self) -> None:
        """End the response: the chunked terminator, then keep-alive or close."""
        if self.transport is None or self.closed:
            return
        if self.chunked:
            if not self.no_body:
                self.transport.write(b"0\r\n\r\n")
            self.chunked = False
        request = self.request
        if request is None or not request.keep_alive:
            self.transport.close()

    def respond(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        """A whole response in one write."""
        self.start_response(status, headers, len(body), body)
        self.finish()

    def abort(self) -> None:
        """Cut the connection (a response that broke off after its head was sent)."""
        if self.request is not None:
            self.request.keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- helpers
    def _handler_done(self, task: asyncio.Task[None]) -> None:
        self.task = None
        self.responding = False
        self._give_back(self.request)
        keep = self.request is not None and self.request.keep_alive
        if task.cancelled() and self.request is not None:  # cancelled before it started
            self.server.unhandled(self.request)
        self.request = None
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        if not keep:
            self.transport.close()
            return
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        if self.queue:
            self._next()
        elif self._refusal is not None:
            self._answer_refusal(self._refusal)
        elif self.parsing is None:
            self._arm(self.limits.idle_timeout, self._idle_expired)
        elif self._continue_due is self.parsing:  # its body waits for our 100
            self._continue_due = None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _refuse(self, refusal: _Refuse) -> None:
        self.server.on_refused(refusal.status)
        self._disarm()
        if self.transport is None or self.closed or self._refusal is not None:
            return
        if self.responding:  # answer the requests before it first (see the docstring)
            self._refusal = refusal
            return
        self._answer_refusal(refusal)

    def _answer_refusal(self, refusal: _Refuse) -> None:
        self._refusal = refusal  # nothing more is read from this connection
        if self.transport is None or self.closed:
            return
        body = error_body(refusal.status, refusal.message, refusal.kind)
        self.request = self.parsing
        if self.request is not None:
            self.request.keep_alive = False
        self.start_response(refusal.status, [(b"content-type", b"application/json")],
                            len(body), body)
        self.transport.close()

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        # A deadline, not a timer: arming and disarming cost an assignment; the server's
        # sweep fires expired deadlines (a timer per phase cost ~7 us each to arm+cancel).
        self.deadline = self.loop.time() + delay
        self._on_expire = callback

    def _disarm(self) -> None:
        self.deadline = 0.0

    def expire(self, now: float) -> None:
        """Run the armed callback if its deadline has passed (from the sweep)."""
        if self.deadline and self.deadline <= now and self._on_expire is not None:
            self.deadline = 0.0
            self._on_expire()

    def _idle_expired(self) -> None:
        if self.transport is not None and not self.responding and not self.queue:
            self.transport.close()

    def _read_expired(self) -> None:
        phase = "headers" if not self._headers_done else "body"
        limit = self.limits.header_timeout if not self._headers_done else self.limits.body_timeout
        self.server.read_timeouts += 1
        self._refuse(_Refuse(408, f"request {phase} not received within {limit:g} s "
                             f"(--{'header' if phase == 'headers' else 'body'}-timeout)",
                             "request_timeout"))
