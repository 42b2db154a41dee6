"""An in-repo fake vLLM server for the fast test tier (``python -m affinity_vllm.stub``).

Theory of operation
-------------------
The stub speaks the part of vLLM's OpenAI API that a router touches -- ``POST
/v1/completions`` (text or token-id prompts, also batched), ``POST
/v1/chat/completions``, SSE streaming for both, ``GET /v1/models``, ``GET /health``,
``POST /tokenize`` (the stub's own tokens, counted in ``tokenize_calls``) --
and exposes ``GET /metrics`` with vLLM 0.32's metric names, so routing, stickiness,
streaming, faults and load scraping can be tested in seconds without a model.

**Prefix cache.** :class:`~affinity_vllm.prefix_cache.BlockPrefixCache` models vLLM's
automatic prefix caching by chained block hashes (see that module);
``vllm:prefix_cache_queries_total`` counts prompt tokens and
``vllm:prefix_cache_hits_total`` hit tokens, like vLLM's. Text is tokenised as its UTF-8
bytes; chat messages as ``role\\ncontent\\n`` each.

**Load.** At most ``max_num_seqs`` requests run at once; the others wait on a
semaphore. ``vllm:num_requests_running`` / ``waiting`` report those two numbers plus
``phantom_running`` (load from "other clients", which tests set to exercise the
router's ``ObserveLoads`` path). A request takes ``delay + prefill_delay *
uncached_tokens`` before its first token and ``token_delay`` per generated token.

**Faults** (:meth:`StubServer.set_fault`, or ``POST /_stub/fault {"mode": ...}``):
``refuse`` closes the listening socket and all connections (connections are refused
until ``accept``), ``hang`` makes every route wait until the fault is cleared,
``die_mid_stream`` aborts the connection after ``die_after_chunks`` chunks of a
streaming response (or half a non-streaming body), ``error`` answers 500, ``slow`` makes
generation wait ``slow_seconds`` before its first byte while ``/health`` stays fast (a
busy but healthy server), ``huge`` answers a non-streaming request with a JSON body of
``huge_bytes`` written in 1 MiB pieces (``huge_sent`` counts what the socket took), and
``unauthorized`` answers 401 with a ``WWW-Authenticate`` challenge. Every generation
answer carries ``X-Request-Id``; each recorded request keeps its query string and all
its headers.

Output is deterministic: generated token ``i`` is a function of the prompt and ``i``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import attrs
from aiohttp import web

from .prefix_cache import BlockPrefixCache, chat_tokens, prompt_tokens

__all__ = ["FAULT_MODES", "BlockPrefixCache", "StubOptions", "StubServer", "main"]

FAULT_MODES = ("none", "refuse", "hang", "die_mid_stream", "error", "slow", "huge",
               "unauthorized")


@attrs.define
class StubOptions:
    name: str = "stub"
    model: str = "tiny"
    block_size: int = 16
    cache_blocks: int = 256
    max_num_seqs: int = 8
    delay: float = 0.0  # seconds before the first token
    prefill_delay: float = 0.0  # extra seconds per uncached prompt token
    token_delay: float = 0.0  # seconds per generated token
    die_after_chunks: int = 2
    slow_seconds: float = 2.0
    huge_bytes: int = 64 << 20
    log_path: str | None = None


class StubServer:
    def __init__(self, options: StubOptions | None = None) -> None:
        self.options = options or StubOptions()
        self.cache = BlockPrefixCache(self.options.block_size, self.options.cache_blocks)
        self.fault = "none"
        self._unhang = asyncio.Event()
        self._slots = asyncio.Semaphore(self.options.max_num_seqs)
        self.running = 0
        self.waiting = 0
        self.phantom_running = 0
        self.completed = 0
        self.generated_tokens = 0
        self.requests: list[dict[str, Any]] = []  # one record per generate request
        self.tokenize_calls = 0
        self.huge_sent = 0  # bytes of the current "huge" body the socket has taken
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self._counter = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -------------------------------------------------------------- lifecycle
    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/_stub/fault", self._set_fault_http)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.host = host
        self._runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await self._listen(port)
        return self.port

    async def _listen(self, port: int) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, self.host, port, reuse_address=True)
        await self._site.start()
        self.port = int(self._runner.addresses[-1][1])

    async def stop(self) -> None:
        self._unhang.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def set_fault(self, mode: str) -> None:
        if mode not in FAULT_MODES:
            raise ValueError(f"fault mode must be one of {FAULT_MODES}, got {mode!r}")
        previous, self.fault = self.fault, mode
        if mode == "refuse" and previous != "refuse" and self._runner is not None:
            # Stop the whole runner (listener and open keep-alive connections), so new
            # connections are refused; keep the port number to listen on it again.
            self._unhang.set()
            await self._runner.cleanup()
            self._runner = None
        if previous == "refuse" and mode != "refuse":
            self._runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=0.1)
            await self._runner.setup()
            await self._listen(self.port)
        if mode == "hang":
            self._unhang = asyncio.Event()
        else:
            self._unhang.set()

    # --------------------------------------------------------------- handlers
    async def _gate(self) -> None:
        if self.fault == "hang":
            await self._unhang.wait()

    async def _set_fault_http(self, request: web.Request) -> web.Response:
        body = await request.json()
        mode = body.get("mode") if isinstance(body, dict) else None
        if mode not in FAULT_MODES or mode == "refuse":
            # "refuse" would close this very connection; it is in-process only.
            return web.json_response({"error": f"mode must be one of {FAULT_MODES[:1]}"
                                      f" + {FAULT_MODES[2:]}"}, status=400)
        await self.set_fault(str(mode))
        return web.json_response({"fault": self.fault})

    async def _health(self, request: web.Request) -> web.Response:
        await self._gate()
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        await self._gate()
        return web.json_response({"object": "list", "data": [
            {"id": self.options.model, "object": "model", "owned_by": "affinity-stub",
             "max_model_len": 4096}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        await self._gate()
        labels = f'{{engine="0",model_name="{self.options.model}"}}'
        used = min(1.0, self.running * 2 / self.cache.capacity)
        lines = []
        for name, kind, value in (
            ("vllm:num_requests_running", "gauge", self.running + self.phantom_running),
            ("vllm:num_requests_waiting", "gauge", self.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", used),
            ("vllm:prefix_cache_queries_total", "counter", self.cache.queries),
            ("vllm:prefix_cache_hits_total", "counter", self.cache.hits),
            ("vllm:request_success_total", "counter", self.completed),
            ("vllm:generation_tokens_total", "counter", self.generated_tokens),
        ):
            lines += [f"# TYPE {name} {kind}", f"{name}{labels} {float(value)}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize``, completion (``prompt``) or chat (``messages``) form."""
        await self._gate()
        self.tokenize_calls += 1
        try:
            body = await request.json()
            tokens = (chat_tokens(body["messages"]) if "messages" in body
                      else prompt_tokens(body["prompt"])[0])
        except (ValueError, TypeError, KeyError) as exc:
            return web.json_response({"error": {"message": f"bad tokenize request: {exc!r}",
                                                "type": "BadRequestError", "code": 400}},
                                     status=400)
        return web.json_response({"count": len(tokens), "max_model_len": 4096,
                                  "tokens": tokens})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        await self._gate()
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            prompts = [chat_tokens(body.get("messages"))] if chat else prompt_tokens(
                body.get("prompt"))
            max_tokens = int(body.get("max_tokens") or 16)
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": {"message": str(exc), "type": "BadRequestError",
                                                "code": 400}}, status=400)
        if self.fault == "error":
            return web.json_response({"error": {"message": "injected fault",
                                                "type": "InternalServerError", "code": 500}},
                                     status=500)
        if self.fault == "unauthorized":
            return web.json_response(
                {"error": {"message": "bad token", "type": "AuthenticationError", "code": 401}},
                status=401, headers={"WWW-Authenticate": 'Bearer realm="stub"',
                                     "X-Request-Id": "auth-1"})
        if self.fault == "slow":
            await asyncio.sleep(self.options.slow_seconds)
        if self.fault == "huge" and not body.get("stream"):
            self._record(request, body, [], [])
            return await self._huge(request)
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            return await self._run(request, body, prompts, max_tokens, chat)
        finally:
            self.running -= 1
            self._slots.release()

    async def _run(self, request: web.Request, body: dict[str, Any], prompts: list[list[int]],
                   max_tokens: int, chat: bool) -> web.StreamResponse:
        hits = [self.cache.admit(p) for p in prompts]
        uncached = sum(len(p) - h for p, h in zip(prompts, hits, strict=True))
        self._record(request, body, prompts, hits)
        await asyncio.sleep(self.options.delay + self.options.prefill_delay * uncached)
        outputs = [[(sum(p) + 7919 * i) % 1000 for i in range(max_tokens)] for p in prompts]
        self._counter += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self.options.name}-{self._counter}"
        usage = {"prompt_tokens": sum(map(len, prompts)),
                 "completion_tokens": max_tokens * len(prompts),
                 "total_tokens": sum(map(len, prompts)) + max_tokens * len(prompts),
                 "prompt_tokens_details": {"cached_tokens": sum(hits)}}
        if body.get("stream"):
            return await self._stream(request, rid, outputs, chat, usage)
        await asyncio.sleep(self.options.token_delay * max_tokens)
        choices = [self._choice(i, out, chat, body) for i, out in enumerate(outputs)]
        payload = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                   "created": int(time.time()), "model": self.options.model,
                   "choices": choices, "usage": usage, "backend": self.options.name}
        self._finish(outputs)
        data = json.dumps(payload).encode()
        if self.fault == "die_mid_stream":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = len(data)
            await response.prepare(request)
            await response.write(data[: len(data) // 2])
            self._abort(request)
            return response
        return web.Response(body=data, content_type="application/json",
                            headers={"X-Request-Id": rid})

    async def _huge(self, request: web.Request) -> web.StreamResponse:
        size = self.options.huge_bytes
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = size
        await response.prepare(request)
        self.huge_sent = 0
        piece = b" " * (1 << 20)
        await response.write(b"{")
        self.huge_sent = 1
        while self.huge_sent < size - 1:
            n = min(len(piece), size - 1 - self.huge_sent)
            await response.write(piece[:n])  # waits while the reader is behind
            self.huge_sent += n
        await response.write(b"}")
        self.huge_sent += 1
        await response.write_eof()
        return response

    def _choice(self, index: int, out: list[int], chat: bool, body: dict[str, Any]
                ) -> dict[str, Any]:
        text = "".join(f" t{t}" for t in out)
        if chat:
            return {"index": index, "message": {"role": "assistant", "content": text},
                    "finish_reason": "length"}
        choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None,
                                  "finish_reason": "length"}
        if body.get("return_token_ids"):
            choice["token_ids"] = out
        return choice

    async def _stream(self, request: web.Request, rid: str, outputs: list[list[int]],
                      chat: bool, usage: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache",
                                               "X-Request-Id": rid})
        await response.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        sent = 0
        for position in range(max(map(len, outputs))):
            for index, out in enumerate(outputs):
                if position >= len(out):
                    continue
                piece = f" t{out[position]}"
                choice: dict[str, Any] = (
                    {"index": index, "delta": {"content": piece}, "finish_reason": None}
                    if chat else {"index": index, "text": piece, "finish_reason": None})
                chunk = {"id": rid, "object": kind, "model": self.options.model,
                         "choices": [choice], "backend": self.options.name}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                sent += 1
                if self.fault == "die_mid_stream" and sent >= self.options.die_after_chunks:
                    self._abort(request)
                    return response
            await asyncio.sleep(self.options.token_delay)
        final = {"id": rid, "object": kind, "model": self.options.model, "choices": [],
                 "usage": usage, "backend": self.options.name}
        await response.write(f"data: {json.dumps(final)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        self._finish(outputs)
        await response.write_eof()
        return response

    def _abort(self, request: web.Request) -> None:
        transport = request.transport
        if transport is not None:
            transport.abort()  # RST, no orderly chunked terminator: the client sees a cut

    def _finish(self, outputs: list[list[int]]) -> None:
        self.completed += len(outputs)
        self.generated_tokens += sum(map(len, outputs))

    def _record(self, request: web.Request, body: dict[str, Any], prompts: list[list[int]],
                hits: list[int]) -> None:
        record = {"backend": self.options.name, "path": request.path,
                  "query": request.query_string,
                  "all_headers": [[k.lower(), v] for k, v in request.headers.items()],
                  "headers": {k.lower(): v for k, v in request.headers.items()
                              if k.lower().startswith("x-")},
                  "user": body.get("user"), "prompt_tokens": sum(map(len, prompts)),
                  "hit_tokens": sum(hits), "stream": bool(body.get("stream"))}
        self.requests.append(record)
        if self.options.log_path:
            with open(self.options.log_path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (:mod:`affinity_vllm.stub_cli`)."""
    from .stub_cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
