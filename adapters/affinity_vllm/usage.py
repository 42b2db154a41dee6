"""``--context-reuse``: the context band's ``c`` scaled by each backend's observed reuse.

Theory of operation
-------------------
The context band's premise is that breaking a pin throws away the session's cached
context; the prompt length is only an upper bound on that (on a replica whose prefix
cache thrashes, a break throws away almost nothing). vLLM reports, per response, how many
prompt tokens it served from its prefix cache (``usage.prompt_tokens_details.
cached_tokens``, with ``--enable-prompt-tokens-details``). :class:`ReuseFeed` sums those
per backend over *continuing* turns (leases on the core's ``kept`` path) in an
:class:`affinity_runtime.ReuseMeter`, and turns the prompt length ``c`` of a request
whose key is pinned to backend ``p`` into ``c * cached_p // looked_up_p``
(:meth:`ReuseFeed.context`). The pin is read with ``StickyLru.peek``: a pure read that
changes no recency, so the acquire that follows sees the same state the core would
without this option. Unpinned keys (and backends without evidence) send ``c``.

**Reading the usage without touching the response.** The proxy relays the response as it
always does; for a kept, 200 lease it also hands every relayed chunk to a
:class:`UsageTail`, a bounded rolling copy of the body's last :data:`TAIL_BYTES`
(amortised O(1) per byte: the buffer is trimmed only when it reaches twice the bound).
Only after the response is finished is the tail parsed (:func:`parse_usage`):

* an event stream (SSE): the usage is in the last ``data:`` event before ``data:
  [DONE]``, present only when the client asked ``stream_options.include_usage``; a
  stream without ``[DONE]`` did not complete and is ``invalid``;
* a JSON body held whole (at most the proxy's relay buffer): ``json.loads`` and its
  top-level ``usage``;
* a larger JSON body: the last ``"usage":`` key in the tail, decoded from there. The
  text ``"usage":`` cannot occur inside a JSON string (an inner quote is escaped), so
  the match is a key; vLLM writes ``usage`` after ``choices``, so it is in the tail.

Only well-formed integers count: ``0 <= cached_tokens <= prompt_tokens < 2**63``, no
booleans.
The result of each parsed response is counted in
``affinity_router_reuse_reports_total{backend,result}``: ``recorded``; ``no_usage`` (no
usage object, or one without ``prompt_tokens_details.cached_tokens``: vLLM without
``--enable-prompt-tokens-details``, or a stream without ``include_usage``); ``invalid``
(unparseable, or values out of range); ``left_pool`` (the backend left the pool while
the response ran -- even if it is back by the time the response ends: its evidence was
forgotten and is not restarted, or polluted, by a report measured before it left; each
backend's membership is numbered, and the proxy notes the number when the attempt starts).
Nothing here can fail or delay the client's response: parsing runs after it ended and
never raises. When a backend leaves the pool its evidence is dropped
(:meth:`ReuseFeed.forget`); a returning backend starts afresh.
"""

from __future__ import annotations

import json
import re
from typing import Any

from affinity_runtime.reuse import MAX_TOKENS, ReuseMeter

from .metrics import Registry
from .routing import RoutingTable

__all__ = ["RESULTS", "TAIL_BYTES", "ReuseFeed", "UsageTail", "parse_usage"]

TAIL_BYTES = 64 << 10
RESULTS = ("recorded", "no_usage", "invalid", "left_pool")
_USAGE_KEY = re.compile(rb'"usage"\s*:')
_DONE = re.compile(rb"^data:[ \t]*\[DONE\][ \t\r]*$", re.MULTILINE)
_DECODER = json.JSONDecoder()


class UsageTail:
    """The last :data:`TAIL_BYTES` (at least) of a relayed body, or a body held whole."""

    __slots__ = ("buffer", "held", "limit", "membership", "stream", "whole")

    def __init__(self, limit: int = TAIL_BYTES, membership: int = 0) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
        self.limit = limit
        self.buffer = bytearray()
        self.held: bytes | None = None
        self.whole = True  # nothing was dropped: the tail is the whole body
        self.stream = False  # an event stream (set by the proxy from the content type)
        self.membership = membership  # ReuseFeed.membership(sid) when the attempt started

    def hold(self, body: bytes) -> None:
        """The whole body, held by the proxy anyway (no copy)."""
        self.held = body

    def add(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if len(buffer) >= 2 * self.limit:  # trim rarely: each byte is moved O(1) times
            del buffer[:-self.limit]
            self.whole = False

    def tail(self) -> bytes:
        if self.held is not None:
            return self.held
        return bytes(self.buffer if self.whole else self.buffer[-self.limit:])


def _numbers(usage: object) -> tuple[int, int] | str:
    """``(prompt_tokens, cached_tokens)`` from a usage object, or the result label."""
    if usage is None:
        return "no_usage"
    if not isinstance(usage, dict):
        return "invalid"
    details = usage.get("prompt_tokens_details")
    if details is None:
        return "no_usage"
    if not isinstance(details, dict):
        return "invalid"
    cached = details.get("cached_tokens")
    if cached is None:
        return "no_usage"
    prompt = usage.get("prompt_tokens")
    for value in (prompt, cached):
        if isinstance(value, bool) or not isinstance(value, int):
            return "invalid"
    assert isinstance(prompt, int) and isinstance(cached, int)
    if not 0 <= cached <= prompt <= MAX_TOKENS:  # beyond 64 bits: corrupt (MAX_TOKENS)
        return "invalid"
    return prompt, cached


def _last(pattern: re.Pattern[bytes], text: bytes) -> re.Match[bytes] | None:
    last = None
    for found in pattern.finditer(text):
        last = found
    return last


def _stream_usage(tail: bytes) -> tuple[int, int] | str:
    done = _last(_DONE, tail)
    if done is None:
        return "invalid"  # the stream did not complete
    events = tail[:done.start()].replace(b"\r\n", b"\n").split(b"\n\n")
    for event in reversed(events):
        data = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
        if not data:
            continue  # blank or comment-only (keep-alive) events
        try:
            chunk = json.loads(b"\n".join(data))
        except (ValueError, RecursionError):
            return "invalid"
        return _numbers(chunk.get("usage")) if isinstance(chunk, dict) else "invalid"
    return "no_usage"


def parse_usage(tail: bytes, *, whole: bool, stream: bool) -> tuple[int, int] | str:
    """``(prompt_tokens, cached_tokens)`` reported by a response, or why not
    (``no_usage`` or ``invalid``). ``tail`` is the whole body when ``whole``. Never raises."""
    if stream:
        return _stream_usage(tail)
    if whole:
        try:
            body = json.loads(tail)
        except (ValueError, RecursionError):
            return "invalid"
        return _numbers(body.get("usage")) if isinstance(body, dict) else "invalid"
    match = _last(_USAGE_KEY, tail)
    if match is None:
        return "no_usage"
    try:
        text = tail[match.end():].decode("utf-8")
        value, _ = _DECODER.raw_decode(text, len(text) - len(text.lstrip()))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return "invalid"
    return _numbers(value)


class ReuseFeed:
    """The router's reuse meter, its metrics, and the scaled ``c`` (see the module doc)."""

    def __init__(self, table: RoutingTable, registry: Registry) -> None:
        self.table = table
        self.meter = ReuseMeter()
        p = "affinity_router_"
        self.reports = registry.counter(
            p + "reuse_reports_total", "kept 200 responses by what their usage gave the "
            "context reuse meter (recorded, no_usage, invalid, left_pool)",
            ["backend", "result"])
        self.ratio = registry.gauge(
            p + "backend_prefix_reuse", "cached / looked-up prompt tokens of the backend's "
            "continuing turns since it joined the pool (absent before the first)",
            ["backend"])
        for sid in table.servers:
            for result in RESULTS:
                self.reports.samples[sid, result] = 0.0
        self._left: dict[str, int] = {}  # times each backend left the pool

    def membership(self, sid: str) -> int:
        """Which stay of ``sid`` in the pool this is (bumped each time it leaves)."""
        return self._left.get(sid, 0)

    def context(self, key: str | None, prompt_tokens: int | None) -> int | None:
        """``c`` for an acquire: scaled by the reuse of the backend ``key`` is pinned to."""
        if key is None or prompt_tokens is None:
            return prompt_tokens
        pinned = self.table.state.lru.peek(key)  # no recency change (R-LRU-1)
        return prompt_tokens if pinned is None else self.meter.scaled(pinned, prompt_tokens)

    def finished(self, sid: str, tail: UsageTail) -> str:
        """A kept lease's 200 response on ``sid`` was relayed completely; returns the
        result label it was counted under."""
        parsed = parse_usage(tail.tail(), whole=tail.whole, stream=tail.stream)
        if not isinstance(parsed, tuple):
            result = parsed
        elif not self.table.is_active(sid) or tail.membership != self.membership(sid):
            result = "left_pool"  # gone, or gone and back: it measured a cache now forgotten
        else:
            try:
                self.meter.record(sid, *parsed)  # _numbers validated them; the meter too
            except ValueError:
                result = "invalid"
            else:
                cached, looked_up = self.meter.reuse(sid)
                if looked_up:
                    self.ratio.set(sid, value=cached / looked_up)
                result = "recorded"
        self.reports.inc(sid, result)
        return result

    def forget(self, sid: str) -> None:
        """``sid`` left the pool: drop its evidence (and its gauge)."""
        self.meter.forget(sid)
        self.ratio.remove(sid)
        self._left[sid] = self._left.get(sid, 0) + 1

    def status(self) -> dict[str, Any]:
        """Per backend: the cached and looked-up tokens behind the scaling."""
        out: dict[str, Any] = {}
        for sid in self.table.servers:
            cached, looked_up = self.meter.reuse(sid)
            out[sid] = {"cached_tokens": cached, "prompt_tokens": looked_up}
        return out
