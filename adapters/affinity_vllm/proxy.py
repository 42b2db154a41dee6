"""Forwarding one OpenAI-style request to the backend the core chose.

Theory of operation
-------------------
:meth:`Proxy.forward` runs after the router has read and validated the request:

1. ``acquire`` on the routing table (the core decides; the lease names the backend);
2. borrow a pooled connection to that backend, write the request (the client's bytes,
   never re-encoded; an origin-form target; hop-by-hop headers dropped; ``X-Forwarded-For``
   gets the client's address appended), and observe ``routing_overhead_seconds`` --
   from the request's first byte to this write, parsing included;
3. relay the answer with its end-to-end headers:

   * ``text/event-stream`` is relayed chunk by chunk as it arrives;
   * anything else is held up to :data:`RELAY_BUFFER` bytes, so a small response is
     sent in one write (and a backend that fails inside it still gets a clean 502);
     a larger one is then relayed in chunks, never buffered whole;

4. ``release`` the lease in a ``finally`` -- exactly once, whatever happened,
   including when the client goes away and the task is cancelled (the upstream
   connection is then closed, which aborts the generation in vLLM).

**Retry.** A generation request changes nothing on a vLLM server, so it is safe to
repeat while no byte has reached the client. Once, on: a connect error (nothing was
sent), a 5xx status, or a connection closed before any response byte. The retry acquires
while the failed lease is still held, so the core sees the failed backend one request
busier; if the failure took the backend out of the pool the retry keeps the session key
and its group (a pinned session is re-placed, path ``reselected``), otherwise it is an
unkeyed acquire (least loaded, the session's and the group's pins untouched). The retry
never lands on the backend that just failed (:meth:`Proxy._acquire_elsewhere`: while the
core still chooses it, that choice is held as well and the core asked again). A read
timeout is never retried: the backend may still be working on it.

**Context reuse** (``--context-reuse``, :mod:`affinity_vllm.usage`). Each acquire of a
pinned key sends ``c`` scaled by the pinned backend's observed reuse (the retry's acquire
re-reads the pin). A 200 response on a ``kept`` lease is relayed exactly as above, while a
bounded copy of its end is kept; once it has reached the client complete, its usage
feeds the meter. Without the option no copy is kept and nothing is parsed.

**Health.** Every outcome is reported to :mod:`affinity_vllm.health`, which may eject the
backend (5xx or connect-error runs) -- a read timeout is counted but never ejects. A
connect that failed for want of the router's own descriptors
(:class:`~affinity_vllm.upstream.RouterResourceError`) is the router's error: 503, no
report, no other backend tried.

**Interim responses.** A backend's ``103 Early Hints`` are relayed to the client before
the final head (:meth:`~affinity_vllm.http1.ClientConnection.interim`); the upstream
connection consumes ``100`` and never takes a 1xx as final.

**Faults after the head was sent.** An event stream ends with ``data: {"error": ...}``
naming the backend and no ``[DONE]``; any other body is cut (the client connection is
aborted), since its status can no longer change.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from affinity_engine import Rejected

from .http1 import ClientConnection, IncomingRequest, error_body
from .observability import RouterMetrics
from .options import RouterOptions
from .prefix_placement import PrefixPlacement
from .routing import Lease, LogUnavailable, RoutingTable
from .upstream import (
    ConnectFailed,
    RouterResourceError,
    UpstreamClosed,
    UpstreamConnection,
    UpstreamError,
    UpstreamPool,
    UpstreamTimeout,
)
from .usage import ReuseFeed, UsageTail

__all__ = ["HOP_BY_HOP", "RELAY_BUFFER", "Proxy"]

RELAY_BUFFER = 256 << 10
# RFC 9110 section 7.6.1 (and the proxy headers of RFC 9110 section 11.7): meaningful for
# one connection only, never forwarded in either direction. Content-Length and framing
# are recomputed by the router.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                        b"transfer-encoding", b"upgrade", b"proxy-authenticate",
                        b"proxy-authorization", b"content-length", b"host", b"expect"})
_JSON = [(b"content-type", b"application/json")]

# Outcome of one attempt, for the retry loop: done, retry (the request had reached the
# backend: at most once), replace (a connect error: nothing was sent anywhere).
_DONE, _RETRY, _REPLACE = 0, 1, 2
# How many times a retry placed on the backend that just failed is held and re-asked.
RETRY_HOLDS = 8

Report = Callable[[str, str, int | None], None]  # (backend, kind, status) -> None
RouterError = Callable[[str, str], None]  # (kind, message): the router's own resources


def _drop_named(headers: list[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Header names listed in Connection (hop-by-hop by declaration)."""
    named: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            named.update(part.strip().lower() for part in value.split(b","))
    return frozenset(named)


def end_to_end(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    named = _drop_named(headers)
    return [(n, v) for n, v in headers if n not in HOP_BY_HOP and n not in named]


class Proxy:
    def __init__(self, options: RouterOptions, table: RoutingTable, metrics: RouterMetrics,
                 pool: UpstreamPool, report: Report,
                 router_error: RouterError | None = None) -> None:
        self.options = options
        self.table = table
        self.metrics = metrics
        self.pool = pool
        self._report = report  # the health book: success, 5xx, connect errors, timeouts
        self._router_error = router_error
        self._sid_bytes: dict[str, bytes] = {}
        # --context-reuse: c scaled by the pinned backend's reuse, fed by kept responses.
        self.reuse = ReuseFeed(table, metrics.registry) if options.context_reuse else None
        metrics.reuse = self.reuse
        # --placement-margin: the router's index of the prompt blocks it routed where.
        self.placement = (PrefixPlacement(options.prefix_block_size,
                                          options.prefix_index_blocks)
                          if table.config.prefix_placement else None)
        metrics.placement = self.placement

    def left_pool(self, sid: str) -> None:
        """``sid`` was removed or ejected: with ``--context-reuse`` its reuse evidence goes
        (a returning backend starts afresh; its cache may be cold)."""
        if self.reuse is not None:
            self.reuse.forget(sid)
        if self.placement is not None:
            self.placement.forget(sid)

    def _head(self, request: IncomingRequest, backend: str) -> bytes:
        _, _, host = self.pool.address(backend)
        target = request.target  # path and query string exactly as the client sent them
        parts = [request.method.encode("ascii"), b" ", target, b" HTTP/1.1\r\nhost: ",
                 host, b"\r\n"]
        forwarded = request.client.encode("latin-1")
        named = _drop_named(request.headers)
        for name, value in request.headers:
            if name in HOP_BY_HOP or name in named:
                continue
            if name == b"x-forwarded-for":  # appended, never trusted or replaced
                forwarded = value + b", " + forwarded
                continue
            parts += (name, b": ", value, b"\r\n")
        if forwarded:
            parts += (b"x-forwarded-for: ", forwarded, b"\r\n")
        parts.append(b"content-length: %d\r\n\r\n" % len(request.body))
        return b"".join(parts)

    async def forward(self, request: IncomingRequest, key: str | None,
                      context_tokens: int | None = None, group_id: str | None = None,
                      prompt: tuple[list[bytes], tuple[tuple[str, int], ...]] | None = None
                      ) -> int:
        """Route, relay and release; returns the status the client got (499: it left).

        ``context_tokens`` is the context band's ``c`` (None without the band);
        ``group_id`` the request's group (None without group stickiness); ``prompt`` the
        prompt's block chain and its ``cached_prefix`` estimate (None without prefix-aware
        placement): the chosen backend is credited with the chain at once."""
        client = request.connection
        reuse = self.reuse
        lease = self.table.acquire(key, context_tokens if reuse is None
                                   else reuse.context(key, context_tokens), group_id,
                                   () if prompt is None else prompt[1])
        if not isinstance(lease, Lease):
            client.respond(503, error_body(503, lease.message, "no_backend_available"), _JSON)
            return 503
        if prompt is not None and self.placement is not None:
            self.placement.placed(lease.server_id, prompt[0])
        measured = False
        held: Lease | None = None
        retried = False  # the one retry after the request reached a backend is used
        try:
            for tries in range(len(self.table.servers) + 1):
                outcome, status, measured = await self._attempt(
                    request, lease, retried, tries, measured)
                if outcome == _DONE:
                    return status
                retried = retried or outcome == _RETRY
                # Retry: acquire while the failed lease is held (the core sees the failed
                # backend busier); keep the key only if the failure took it out of the pool.
                self.metrics.retries.inc()
                retry_key, retry_context = self._retry_args(lease.server_id, key,
                                                            context_tokens)
                retry = self._acquire_elsewhere(lease.server_id, retry_key, retry_context,
                                                None if retry_key is None else group_id)
                held, lease = lease, retry if isinstance(retry, Lease) else lease
                self.table.release(held)
                held = None
                if retry is None:
                    client.respond(502, error_body(502, f"backend {lease.server_id} failed and "
                                                   "every other backend is busier: not "
                                                   "retried", "upstream_error"), _JSON)
                    return 502
                if not isinstance(retry, Lease):
                    client.respond(503, error_body(503, retry.message + " (retrying after a "
                                                   "backend failure)", "no_backend_available"),
                                   _JSON)
                    return 503
            raise AssertionError("unreachable: every backend refused yet one stayed routable")
        finally:
            if held is not None:
                self.table.release(held)
            self.table.release(lease)

    def _acquire_elsewhere(self, failed: str, key: str | None, context_tokens: int | None,
                           group_id: str | None = None
                           ) -> Lease | Rejected | LogUnavailable | None:
        """The retry's acquire, never on ``failed``. While the core still chooses
        ``failed`` (least loaded even with the failed request held), that choice is held
        too, so the core sees ``failed`` busier, and the core is asked again -- at most
        :data:`RETRY_HOLDS` times; the holds are released at once (each is an Acquire
        and a Release in the decision log). None: every other backend is busier still."""
        holds: list[Lease] = []
        try:
            retry = self.table.acquire(key, context_tokens, group_id)
            while isinstance(retry, Lease) and retry.server_id == failed and (
                    len(holds) < RETRY_HOLDS):
                holds.append(retry)
                retry = self.table.acquire(key, context_tokens, group_id)
        finally:
            for hold in holds:
                self.table.release(hold)
        if isinstance(retry, Lease) and retry.server_id == failed:
            self.table.release(retry)
            return None
        return retry

    def _retry_args(self, failed: str, key: str | None, context_tokens: int | None
                    ) -> tuple[str | None, int | None]:
        """The acquire a retry makes: keyed only if the failure took the backend out of
        the pool (its pin is then re-placed); otherwise unkeyed, so the pin stays."""
        retry_key = None if self.table.is_active(failed) else key
        retry_context = None if retry_key is None else context_tokens
        if self.reuse is not None:  # the pin may have changed with the failure: re-read
            retry_context = self.reuse.context(retry_key, retry_context)
        return retry_key, retry_context

    async def _attempt(self, request: IncomingRequest, lease: Lease, retried: bool,
                       tries: int, measured: bool) -> tuple[int, int, bool]:
        sid = lease.server_id
        client = request.connection
        request.backend, request.decision = sid, lease.path  # access log, histograms
        # --context-reuse: the backend's stay in the pool this attempt belongs to, noted
        # before the first await (a report from an earlier stay is dropped).
        membership = 0 if self.reuse is None else self.reuse.membership(sid)
        tags = [(b"x-affinity-backend", self._encoded(sid)),
                (b"x-affinity-path", lease.path.encode())]
        if tries:
            tags.append((b"x-affinity-retried", b"%d" % tries))
        try:
            upstream = await self.pool.connect(sid)
        except RouterResourceError as exc:
            # The router's own descriptors ran out: not the backend's fault (no health
            # report, no other backend tried -- they would fail the same way).
            if self._router_error is not None:
                self._router_error("fd", str(exc))
            return self._fail(client, 503, str(exc), "router_overloaded", tags), 503, measured
        except ConnectFailed as exc:
            # Nothing was sent: try the next backend without using the retry. Release
            # first, then count the failure toward ejection, so a refusing backend leaves
            # the pool with no lease of this request open on it.
            self.table.release(lease)
            self._report(sid, exc.kind, None)
            if tries < len(self.table.servers) and any(s != sid for s in self.table.active):
                return _REPLACE, 0, measured
            return self._fail(client, 502, f"no backend accepted the request: {exc}"
                              + (f" (tried {tries + 1} backends)" if tries else ""),
                              "upstream_unavailable", tags), 502, measured
        try:
            upstream.send(self._head(request, sid), request.body, self.options.upstream_timeout)
            upstream.on_interim = client.interim  # 103 Early Hints reach the client
            if not measured:
                self.metrics.overhead.observe(time.perf_counter() - request.received_at)
                measured = True
            try:
                await upstream.head()
            except UpstreamTimeout as exc:
                self._report(sid, exc.kind, None)
                return self._fail(client, 504, f"backend {sid} did not answer within "
                                  f"{self.options.upstream_timeout:g} s", "upstream_timeout",
                                  tags), 504, measured
            except UpstreamClosed as exc:
                stale = upstream.reused and not exc.received
                if not stale:
                    self._report(sid, exc.kind, None)
                if stale and tries == 0:  # a keep-alive the backend had just closed
                    return _REPLACE, 0, measured
                if self._may_retry(sid, retried):
                    return _RETRY, 0, measured
                return self._fail(client, 502, f"backend {sid} failed before responding: {exc}",
                                  "upstream_error", tags), 502, measured
            status = upstream.status
            request.first_byte_at = time.perf_counter()  # time-to-first-byte histogram
            # Report first: a 5xx that ejects the backend changes where a retry would go.
            self._report(sid, "5xx" if status >= 500 else "ok", status)
            if status >= 500 and self._may_retry(sid, retried):
                return _RETRY, 0, measured
            reuse = self.reuse
            if reuse is None or status != 200 or lease.path != "kept":
                await self._relay(client, upstream, sid, status, tags, None)
            else:  # a continuing turn: its usage feeds the reuse meter once it is relayed
                tail = UsageTail(membership=membership)
                if await self._relay(client, upstream, sid, status, tags, tail):
                    reuse.finished(sid, tail)
            return _DONE, status, measured
        finally:
            upstream.done()

    def _may_retry(self, sid: str, retried: bool) -> bool:
        """The one retry is unused and another backend could take it (a retry the core
        must place on the same backend again would just double the failure)."""
        return self.options.retry and not retried and any(s != sid for s in self.table.active)

    def _encoded(self, sid: str) -> bytes:
        value = self._sid_bytes.get(sid)
        if value is None:
            value = self._sid_bytes[sid] = sid.encode()
        return value

    def _fail(self, client: ClientConnection, status: int, message: str, kind: str,
              tags: list[tuple[bytes, bytes]]) -> int:
        client.respond(status, error_body(status, message, kind), _JSON + tags)
        return _DONE

    async def _relay(self, client: ClientConnection, upstream: UpstreamConnection, sid: str,
                     status: int, tags: list[tuple[bytes, bytes]], tail: UsageTail | None
                     ) -> bool:
        """Relay the response; True when it reached the client complete. ``tail``
        (``--context-reuse``) gets a copy of the body's end."""
        headers = end_to_end(upstream.headers) + tags
        # Media types are case-insensitive (RFC 9110 8.3.1): "Text/Event-Stream" was held
        # up to RELAY_BUFFER like a JSON body, and its usage read as invalid JSON.
        streaming = any(n == b"content-type"
                        and v.strip().lower().startswith(b"text/event-stream")
                        for n, v in upstream.headers)
        if streaming:
            if tail is not None:
                tail.stream = True
            return await self._relay_stream(client, upstream, sid, status, headers, tail)
        # Hold up to RELAY_BUFFER: a small body goes out in one write with its length.
        held: list[bytes] = []
        size = 0
        try:
            while size <= RELAY_BUFFER:
                data = await upstream.read()
                if not data:
                    body = b"".join(held)
                    client.respond(status, body, headers)
                    if tail is not None:
                        tail.hold(body)
                    return True
                held.append(data)
                size += len(data)
        except UpstreamError as exc:
            timed_out = isinstance(exc, UpstreamTimeout)
            self._report(sid, exc.kind, None)
            self._fail(client, 504 if timed_out else 502,
                       f"backend {sid} failed while sending its response: {exc}",
                       "upstream_error", tags)
            return False
        length = next((int(v) for n, v in upstream.headers
                       if n == b"content-length" and v.strip().isdigit()), None)
        client.start_response(status, headers, length)
        try:
            data = b"".join(held)
            while data:
                waiting = client.send(data)
                if tail is not None:
                    tail.add(data)
                if waiting is not None:
                    await waiting
                data = await upstream.read()
        except UpstreamError as exc:
            self._report(sid, exc.kind, None)
            client.abort()  # the head is out: cut the body so the client sees it is short
            return False
        client.finish()
        return True

    async def _relay_stream(self, client: ClientConnection, upstream: UpstreamConnection,
                            sid: str, status: int, headers: list[tuple[bytes, bytes]],
                            usage: UsageTail | None) -> bool:
        client.start_response(status, headers, None)
        tail = b"\n\n"
        complete = True
        try:
            while True:
                data = await upstream.read()
                if not data:
                    break
                waiting = client.send(data)
                if usage is not None:
                    usage.add(data)
                if waiting is not None:
                    await waiting
                tail = (tail + data)[-2:]
        except UpstreamError as exc:
            self._report(sid, exc.kind, None)
            error = {"error": {"message": f"backend {sid} failed mid-stream ({exc}); the "
                               "response is incomplete", "type": "upstream_error",
                               "code": 502}}
            # Terminate a half-relayed event first so the error is an event of its own.
            prefix = b"" if tail == b"\n\n" else b"\n\n"
            client.send(prefix + b"data: " + json.dumps(error).encode() + b"\n\n")
            complete = False
        client.finish()
        return complete
