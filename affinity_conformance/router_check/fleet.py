"""A recording fleet of stub OpenAI-compatible backends for black-box router checks.

Theory of operation
-------------------
The harness needs ground truth about where a router sent each request and control over
when each request completes, because completion is the spec's *release* event. So every
backend of a :class:`RecordingFleet`:

* records each generation request as an :class:`Arrival`: the backend's index, the
  global arrival order, the session-key headers it saw, whether it streams, and the
  *correlation id* the harness wrote into the prompt (``affinity-check:<id>``), which
  routers forward untouched even when they re-serialise the body; a prompt of token ids
  (the context band's traces) has no text, so there the id travels in the OpenAI
  ``user`` field, which is read too;
* holds the request open until the harness calls :meth:`RecordingFleet.release` for that
  id, then answers ``ok`` (200, or the rest of the event stream), or ``fail`` (HTTP 500;
  for a stream, the connection is cut after the first chunk, with no ``[DONE]``);
* answers a copy of an already completed request (a router's retry) at once, with the
  same outcome, and records it, so retries are visible but never hang the harness;
* streams like vLLM: for ``"stream": true`` the status line, headers and a first chunk go
  out at once, the last chunk and ``data: [DONE]`` only on release -- so a router that
  counts a streamed request as finished when its headers arrive is caught.

To look real to the routers under test, every backend answers the probes vllm-router
0.1.17 and sglang-router 0.3.2 send (``/health``, ``/health_generate``, ``/v1/models``,
``/server_info``, ``/get_server_info``, ``/model_info``, ``/get_model_info``,
``/get_load``, ``/kv_event_sources``, ``/metrics``); any other path gets a JSON 404 and is
recorded in :attr:`RecordingFleet.probes`, so a report can say what a router asked for.

All backends run in one asyncio loop (the caller's), each on its own 127.0.0.1 port.
Health can be switched off per backend (:meth:`RecordingFleet.set_healthy`), which is
how a pool change is driven for routers that only learn membership from health checks.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from typing import Any

import attrs
from aiohttp import web

__all__ = ["CORRELATION_PREFIX", "Arrival", "FleetError", "RecordingFleet", "correlation_prompt"]

CORRELATION_PREFIX = "affinity-check:"
_CORRELATION = re.compile(re.escape(CORRELATION_PREFIX) + r"([A-Za-z0-9_.-]+)")
MODEL = "affinity-check-model"
_KNOWN_GETS = ("/health", "/health_generate", "/v1/models", "/server_info", "/get_server_info",
               "/model_info", "/get_model_info", "/get_load", "/kv_event_sources", "/metrics")


class FleetError(RuntimeError):
    """The fleet was used wrongly (unknown correlation id, release twice, ...)."""


def correlation_prompt(correlation_id: str) -> str:
    """The prompt text that carries ``correlation_id`` through any router."""
    return f"{CORRELATION_PREFIX}{correlation_id} please answer briefly"


@attrs.frozen
class Arrival:
    seq: int                    # global arrival order over the whole fleet, from 0
    backend: int                # index into RecordingFleet.urls
    correlation_id: str | None  # None: a request the harness did not send (router probe)
    path: str
    stream: bool
    headers: tuple[tuple[str, str], ...]  # lower-cased names, in arrival order
    at: float                   # time.monotonic() at arrival

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)


@attrs.define
class _Held:
    arrival: Arrival
    done: asyncio.Future[str]


class RecordingFleet:
    """``size`` recording backends; see the module docstring."""

    def __init__(self, size: int, host: str = "127.0.0.1",
                 ports: tuple[int, ...] = ()) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 64:
            raise FleetError(f"fleet size must be an integer in [1, 64], got {size!r}")
        if ports and len(ports) != size:
            raise FleetError(f"{len(ports)} fleet ports given for {size} backends")
        self.size, self.host, self.ports = size, host, ports
        self.urls: list[str] = []
        self.arrivals: list[Arrival] = []
        self.probes: dict[str, int] = {}
        self.healthy = [True] * size
        self.probed = [0] * size  # GET probes (health, info, ...) per backend
        self._held: dict[str, _Held] = {}
        self._finished: dict[str, str] = {}  # correlation id -> outcome it was released with
        self._arrived: dict[str, asyncio.Event] = {}
        self._runners: list[web.AppRunner] = []

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> list[str]:
        for index in range(self.size):
            runner = web.AppRunner(self._app(index), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.ports[index] if self.ports else 0)
            await site.start()
            port = int(runner.addresses[0][1])
            self._runners.append(runner)
            self.urls.append(f"http://{self.host}:{port}")
        return list(self.urls)

    async def stop(self) -> None:
        self.release_all("ok")
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    async def __aenter__(self) -> RecordingFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ harness side
    def forget(self) -> None:
        """Drop the record (between runs against a fresh router); nothing may be held."""
        if self._held:
            raise FleetError(f"{len(self._held)} request(s) still held: {sorted(self._held)}")
        self.arrivals.clear()
        self._arrived.clear()
        self._finished.clear()

    async def wait_arrival(self, correlation_id: str, timeout: float) -> Arrival | None:
        """The first arrival of ``correlation_id``, or None if none came within ``timeout``."""
        event = self._arrived.setdefault(correlation_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return None
        return next(a for a in self.arrivals if a.correlation_id == correlation_id)

    def arrivals_of(self, correlation_id: str) -> list[Arrival]:
        return [a for a in self.arrivals if a.correlation_id == correlation_id]

    def is_held(self, correlation_id: str) -> bool:
        return correlation_id in self._held

    def release(self, correlation_id: str, outcome: str = "ok") -> Arrival:
        """Let the held request ``correlation_id`` complete with ``outcome`` (ok | fail)."""
        if outcome not in ("ok", "fail"):
            raise FleetError(f"outcome must be 'ok' or 'fail', got {outcome!r}")
        held = self._held.pop(correlation_id, None)
        if held is None:
            raise FleetError(f"no request {correlation_id!r} is held by the fleet")
        self._finished[correlation_id.split("#", 1)[0]] = outcome
        if not held.done.done():
            held.done.set_result(outcome)
        return held.arrival

    def release_all(self, outcome: str = "ok") -> int:
        ids = list(self._held)
        for cid in ids:
            self.release(cid, outcome)
        return len(ids)

    def held_ids(self) -> list[str]:
        return list(self._held)

    def held_on(self, backend: int) -> int:
        return sum(1 for h in self._held.values() if h.arrival.backend == backend)

    def set_healthy(self, backend: int, healthy: bool) -> None:
        self.healthy[backend] = healthy

    # ------------------------------------------------------------------ backend side
    def _app(self, index: int) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", functools.partial(self._generate, index, False))
        app.router.add_post("/v1/chat/completions",
                            functools.partial(self._generate, index, True))
        for path in _KNOWN_GETS:
            app.router.add_get(path, functools.partial(self._probe_handler, index, path))
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        return app

    async def _unknown(self, request: web.Request) -> web.StreamResponse:
        key = f"{request.method} {request.path}"
        self.probes[key] = self.probes.get(key, 0) + 1
        return web.json_response({"error": {"message": f"no route {key}", "type": "not_found"}},
                                 status=404)

    async def _probe_handler(self, index: int, path: str, _request: web.Request
                             ) -> web.StreamResponse:
        return await self._probe(index, path)

    async def _probe(self, index: int, path: str) -> web.StreamResponse:
        key = f"GET {path}"
        self.probed[index] += 1
        self.probes[key] = self.probes.get(key, 0) + 1
        if path.startswith("/health"):
            ok = self.healthy[index]
            return web.json_response({"status": "ok" if ok else "unhealthy"},
                                     status=200 if ok else 503)
        if path == "/v1/models":
            return web.json_response({"object": "list", "data": [
                {"id": MODEL, "object": "model", "owned_by": "affinity", "max_model_len": 4096}]})
        if path in ("/server_info", "/get_server_info"):
            return web.json_response({"model_path": MODEL, "served_model_name": MODEL,
                                      "max_model_len": 4096, "is_generation": True})
        if path in ("/model_info", "/get_model_info"):
            return web.json_response({"model_path": MODEL, "is_generation": True,
                                      "served_model_name": MODEL})
        if path == "/get_load":
            return web.json_response({"load": self.held_on(index)})
        if path == "/kv_event_sources":
            return web.json_response({"sources": []})
        running = self.held_on(index)
        return web.Response(text=f"vllm:num_requests_running{{model_name=\"{MODEL}\"}} "
                                 f"{running}\nvllm:num_requests_waiting{{model_name=\"{MODEL}\"}}"
                                 " 0\n", content_type="text/plain")

    async def _generate(self, index: int, chat: bool, request: web.Request
                        ) -> web.StreamResponse:
        try:
            payload = json.loads(await request.read() or b"{}")
        except (ValueError, UnicodeDecodeError):
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        if not isinstance(payload, dict):
            return web.json_response({"error": {"message": "body is not an object"}}, status=400)
        cid = _correlation_id(payload)
        stream = payload.get("stream") is True
        arrival = Arrival(len(self.arrivals), index, cid, request.path, stream,
                          tuple((k.lower(), v) for k, v in request.headers.items()),
                          time.monotonic())
        self.arrivals.append(arrival)
        if cid is None:  # a router's own readiness probe: answer at once
            return web.json_response(_body(chat, "ok"))
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._arrived.setdefault(cid, asyncio.Event()).set()
        if cid in self._finished:  # the router retries a request the harness completed:
            done.set_result(self._finished[cid])  # answer it at once, the same way
        else:  # a second copy of a request still held is held too, under its own key
            key = cid if cid not in self._held else f"{cid}#retry{arrival.seq}"
            self._held[key] = _Held(arrival, done)
        if not stream:
            outcome = await done
            if outcome == "fail":
                return web.json_response({"error": {"message": "injected backend failure",
                                                    "type": "internal_error"}}, status=500)
            return web.json_response(_body(chat, "done"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(_chunk(chat, "first"))
        outcome = await done
        if outcome == "fail":
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write(_chunk(chat, "last"))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _correlation_id(payload: dict[str, Any]) -> str | None:
    texts: list[str] = []
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        texts.append(prompt)
    elif isinstance(prompt, list):
        texts += [p for p in prompt if isinstance(p, str)]
    messages = payload.get("messages")
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                texts.append(content)
    user = payload.get("user")  # where token-id prompts carry the id (no text to hold it)
    if isinstance(user, str):
        texts.append(user)
    for text in texts:
        match = _CORRELATION.search(text)
        if match:
            return match.group(1)
    return None


def _body(chat: bool, text: str) -> dict[str, Any]:
    usage = {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
    if chat:
        return {"id": "chatcmpl-affinity", "object": "chat.completion", "model": MODEL,
                "created": 0, "usage": usage, "choices": [
                    {"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}]}
    return {"id": "cmpl-affinity", "object": "text_completion", "model": MODEL, "created": 0,
            "usage": usage, "choices": [{"index": 0, "text": text, "finish_reason": "stop",
                                         "logprobs": None}]}


def _chunk(chat: bool, text: str) -> bytes:
    if chat:
        data: dict[str, Any] = {"id": "chatcmpl-affinity", "object": "chat.completion.chunk",
                                "model": MODEL, "created": 0, "choices": [
                                    {"index": 0, "delta": {"content": text},
                                     "finish_reason": None}]}
    else:
        data = {"id": "cmpl-affinity", "object": "text_completion", "model": MODEL,
                "created": 0, "choices": [{"index": 0, "text": text, "finish_reason": None}]}
    return f"data: {json.dumps(data)}\n\n".encode()

