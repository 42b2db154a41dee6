"""Test harness: stub vLLM servers and an ``affinity serve`` router, in-process.

``async with fleet(2, margin=0) as f`` starts two :class:`StubServer` instances and a
:class:`Router` on ephemeral loopback ports and stops all of them on exit, also when
the test fails. :func:`run` executes a test coroutine on a fresh event loop, so tests
need no asyncio plugin. :func:`serve_process` does the same with both as separate
processes, for what only a real process shows (signals, exit codes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import aiohttp
import attrs
from affinity_vllm.options import RouterOptions
from affinity_vllm.router import Router
from affinity_vllm.stub import StubOptions, StubServer

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run one test coroutine with an overall timeout (a hung test fails, not stalls)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@attrs.define
class Reply:
    status: int
    body: Any
    backend: str | None
    path: str | None
    headers: dict[str, str]


@attrs.define
class Fleet:
    stubs: list[StubServer]
    router: Router
    client: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router.port}"

    def stub_at(self, backend: str | None) -> StubServer:
        return next(s for s in self.stubs if s.url == backend)

    async def post(self, path: str, body: Any, session: str | None = None,
                   headers: dict[str, str] | None = None) -> Reply:
        hdrs = dict(headers or {})
        if session is not None:
            hdrs["x-session-id"] = session
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        async with self.client.post(self.url + path, data=data, headers=hdrs) as resp:
            raw = await resp.read()
            try:
                parsed: Any = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            return Reply(resp.status, parsed, resp.headers.get("x-affinity-backend"),
                         resp.headers.get("x-affinity-path"), dict(resp.headers))

    async def complete(self, session: str | None = None, prompt: Any = "hello",
                       **fields: Any) -> Reply:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, **fields}
        return await self.post("/v1/completions", body, session)

    async def get_json(self, path: str) -> Any:
        async with self.client.get(self.url + path) as resp:
            return await resp.json()

    async def metrics_text(self) -> str:
        async with self.client.get(self.url + "/metrics") as resp:
            assert resp.status == 200
            return await resp.text()

    def inflight(self) -> dict[str, int]:
        return {s: self.router.table.inflight(s) for s in self.router.table.servers}

    def assert_idle(self) -> None:
        """No count leaked: every backend's in-flight count and every lease is back to 0."""
        assert self.inflight() == dict.fromkeys(self.router.table.servers, 0), self.inflight()
        assert self.router.table.state.inflight_total == 0
        assert self.router.table.open_leases() == 0
        assert self.router.active_requests == 0


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0,
                     what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


async def settle(fleet_: Fleet, timeout: float = 5.0) -> None:
    """Wait until the router has released everything (a relay may still be unwinding)."""
    await wait_until(lambda: fleet_.router.table.state.inflight_total == 0
                     and fleet_.router.active_requests == 0, timeout, "in-flight to reach 0")


@contextlib.asynccontextmanager
async def fleet(n: int = 2, *, stub: dict[str, Any] | None = None,
                **router_options: Any) -> AsyncIterator[Fleet]:
    stubs = [StubServer(StubOptions(name=f"s{i}", **(stub or {}))) for i in range(n)]
    router: Router | None = None
    client: aiohttp.ClientSession | None = None
    try:
        for s in stubs:
            await s.start()
        defaults: dict[str, Any] = {"port": 0, "health_interval": 60.0}
        options = RouterOptions(backends=tuple(s.url for s in stubs),
                                **{**defaults, **router_options})
        router = Router(options)
        await router.start()
        client = aiohttp.ClientSession()
        yield Fleet(stubs, router, client)
    finally:
        if client is not None:
            await client.close()
        if router is not None:
            await router.stop()
        for s in stubs:
            await s.stop()


@contextlib.contextmanager
def serve_process(stub_args: list[str], serve_args: list[str]
                  ) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A stub (``python -m affinity_vllm.stub STUB_ARGS``) and ``affinity serve
    SERVE_ARGS`` in front of it, each its own process group; yields the router's process
    (stdout and stderr merged, its first line read) and its URL. Both are killed on
    exit unless they have already ended."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    stub = subprocess.Popen([sys.executable, "-m", "affinity_vllm.stub", *stub_args],
                            stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    router: subprocess.Popen[str] | None = None
    try:
        assert stub.stdout is not None
        port = int(stub.stdout.readline().split()[1])
        router = subprocess.Popen(
            [sys.executable, "-m", "affinity_cli.main", "serve", "--port", "0",
             "--backend", f"http://127.0.0.1:{port}", *serve_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True)
        assert router.stdout is not None
        line = router.stdout.readline()
        assert "listening on" in line, line
        yield router, line.split("listening on ")[1].split()[0]
    finally:
        for proc in (router, stub):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


async def gather_all(*aws: Awaitable[T]) -> list[T]:
    return list(await asyncio.gather(*aws))


@contextlib.asynccontextmanager
async def router_over(backends: list[str], **router_options: Any) -> AsyncIterator[Router]:
    """A router in front of already running backends (the real tier's vLLM servers)."""
    defaults: dict[str, Any] = {"port": 0, "health_interval": 60.0}
    router = Router(RouterOptions(backends=tuple(backends), **{**defaults, **router_options}))
    await router.start()
    try:
        yield router
    finally:
        await router.stop()


def assert_replays(*paths: Any) -> int:
    """The decision log files replay clean against the core (``affinity replay``'s
    checks, in-process); returns the number of records."""
    from affinity_conformance.log_replay import replay_files

    results = replay_files([str(p) for p in paths])
    for result in results:
        assert result.divergence is None, result.divergence
        assert result.truncated is None, result.truncated
    return sum(r.records for r in results)


async def raw_exchange(port: int, raw: bytes, *, pause: float = 0.0, rest: bytes = b"",
                       timeout: float = 5.0, to_eof: bool = False) -> bytes:
    """Send raw bytes (optionally ``rest`` after ``pause`` s) and read the answer: the
    first chunk the router sends (up to 1 MiB), or with ``to_eof`` everything until it
    closes the connection. Either way, at most ``timeout`` s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        if pause:
            await asyncio.sleep(pause)
        if rest:
            writer.write(rest)
            await writer.drain()
        return await asyncio.wait_for(reader.read(-1 if to_eof else 1 << 20), timeout)
    finally:
        writer.close()


def status_and_json(response: bytes) -> tuple[int, Any]:
    """Status code and JSON body of one raw HTTP/1.1 response with a Content-Length."""
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), head
    return status, json.loads(body)
