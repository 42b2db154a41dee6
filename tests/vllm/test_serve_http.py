"""`affinity serve`'s HTTP correctness and own resources, each found by an outside audit
against vllm-router 0.1.17:

* no response ever reaches a client other than the one that asked: a backend's 1xx is
  never the final response, stray bytes on a pooled connection close it, and a fuzz of
  1xx, strays, resets and truncations under 64 clients hands each client its own answer
  or an error; the router's own ``100 Continue`` never lands inside a pipelined response
  nor reaches an HTTP/1.0 client;
* the router's own resources (file descriptors, request-body memory) fail as the
  router's errors, never a backend's; a backend's response headers are bounded;
* health checks count in runs (3 to remove, 2 to return), never empty the pool alone,
  and ``/health`` is not ok before the first round;
* SIGTERM drains: every keep-alive client is told ``Connection: close``, none is reset;
* trailers are not headers, the request target is origin-form, ``Host`` is required
  once, bad JSON numbers and lone surrogates are 400s, the retry never lands on the
  backend that just failed, a slow reader is not a slow backend, https:// backends are
  refused (``test_cli``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from affinity_vllm.health import BackendHealth, HealthPolicy, PoolChange
from affinity_vllm.options import RouterOptions
from affinity_vllm.rogue_backend import RogueBackend
from affinity_vllm.router import Router

from affinity_conformance.decision_log import read_log

from .fleet import (
    assert_replays,
    fleet,
    raw_exchange,
    run,
    serve_process,
    settle,
    status_and_json,
    wait_until,
)


@contextlib.asynccontextmanager
async def rogue_router(n: int = 1, seed: int = 0, **options: Any
                       ) -> AsyncIterator[tuple[Router, list[RogueBackend]]]:
    backends = [RogueBackend(seed=seed + i) for i in range(n)]
    for backend in backends:
        await backend.start()
    router = Router(RouterOptions(backends=tuple(b.url for b in backends), port=0,
                                  health_interval=60.0, **options))
    await router.start()
    try:
        yield router, backends
    finally:
        await router.stop()
        for backend in backends:
            await backend.stop()


def _post(tag: str, mode: str = "", version: bytes = b"1.1", extra: bytes = b"") -> bytes:
    body = b'{"model": "m", "prompt": "p"}'
    return (b"POST /v1/completions HTTP/" + version + b"\r\nHost: r\r\n"
            b"Content-Type: application/json\r\nx-request-tag: " + tag.encode() + b"\r\n"
            + (b"x-rogue: " + mode.encode() + b"\r\n" if mode else b"") + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    """One final response (1xx skipped): (status, head, body); Content-Length only."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if 100 <= status < 200:
            # A real interim has no body framing and none of the router's final tags; a
            # 1xx relayed as the final response has both.
            assert b"content-length" not in head.lower(), head
            assert b"x-affinity-backend" not in head.lower(), head
            continue
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        return status, head, await reader.readexactly(length)


# ------------------------------------------------------------- 1xx and strays
def test_backend_1xx_is_never_the_final_response_and_103_is_relayed() -> None:
    async def scenario() -> None:
        async with rogue_router() as (router, _):
            assert router.port is not None
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            try:
                for i in range(4):  # one keep-alive connection, one pooled upstream
                    writer.write(_post(f"r{i}", "interim" if i % 2 == 0 else "ok"))
                    status, head, body = await _read_response(reader)
                    assert status == 200, head
                    assert json.loads(body) == {"id": f"r{i}"}, (i, body)
            finally:
                writer.close()
            # The backend's 103 reaches an HTTP/1.1 client before the final response;
            # its 100 does not (the router answered Expect itself); nothing to HTTP/1.0.
            seen = b""
            for _ in range(10):  # the rogue draws 1-3 interim statuses at random
                data = await raw_exchange(router.port, _post("x", "interim", extra=(
                    b"Connection: close\r\n")), to_eof=True)
                assert data.rstrip().endswith(b'{"id": "x"}'), data
                seen += data
                old = await raw_exchange(router.port, _post("y", "interim", b"1.0"),
                                         to_eof=True)
                assert old.startswith(b"HTTP/1.1 200 OK"), old[:100]
            assert b"HTTP/1.1 103 " in seen and b"HTTP/1.1 100 " not in seen
            assert b"link: </style.css>" in seen
            await settle_router(router)
    run(scenario())


async def settle_router(router: Router) -> None:
    await wait_until(lambda: router.table.state.inflight_total == 0
                     and router.active_requests == 0, 5.0, "in-flight to reach 0")


def test_stray_bytes_on_an_idle_pooled_connection_never_become_a_response() -> None:
    async def scenario() -> None:
        async with rogue_router() as (router, (backend,)):
            backend.stray_delay = 0.02
            assert router.port is not None
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            try:
                for i, mode in enumerate(("stray_idle", "ok", "stray_after", "ok",
                                          "garbage", "ok")):
                    writer.write(_post(f"r{i}", mode))
                    status, _, body = await _read_response(reader)
                    assert (status, json.loads(body)) == (200, {"id": f"r{i}"}), (i, body)
                    await asyncio.sleep(0.1)  # the strays arrive on the idle connection
            finally:
                writer.close()
            assert router.pool.idle_count() <= 1
    run(scenario())


def test_fuzz_64_clients_each_get_their_own_answer_or_an_error() -> None:
    """Backends answer with random 1xx, strays, resets, truncations and pauses; every
    client either gets 200 with its own id or an error -- never another's answer."""
    async def client(port: int, name: str, rounds: int, outcomes: dict[str, int]) -> None:
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        for i in range(rounds):
            tag = f"{name}-{i}"
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                assert reader is not None
                writer.write(_post(tag))
                status, head, body = await asyncio.wait_for(_read_response(reader), 10)
            except (ConnectionError, asyncio.IncompleteReadError):
                outcomes["cut"] = outcomes.get("cut", 0) + 1
                if writer is not None:
                    writer.close()
                reader = writer = None
                continue
            if status == 200:
                assert json.loads(body) == {"id": tag}, (tag, body)  # the whole point
                outcomes["own"] = outcomes.get("own", 0) + 1
            else:
                assert status in (502, 503, 504), (status, body)
                assert b'"error"' in body
                outcomes[str(status)] = outcomes.get(str(status), 0) + 1
            if b"connection: close" in head.lower():
                assert writer is not None
                writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()

    async def scenario() -> None:
        async with rogue_router(2, seed=7, retry=True) as (router, backends):
            assert router.port is not None
            outcomes: dict[str, int] = {}
            started = asyncio.get_running_loop().time()
            await asyncio.gather(*(client(router.port, f"c{n}", 12, outcomes)
                                   for n in range(64)))
            assert sum(outcomes.values()) == 64 * 12, outcomes
            assert outcomes.get("own", 0) > 64 * 12 // 3, outcomes  # mostly answered
            assert asyncio.get_running_loop().time() - started < 40
            assert all(b.modes.get(m) for b in backends
                       for m in ("interim", "stray_after", "garbage", "reset", "truncate"))
            await settle_router(router)
            assert router.table.open_leases() == 0
    run(scenario(), timeout=60)


def test_router_100_continue_waits_for_the_pipelined_response_and_skips_http10() -> None:
    async def scenario() -> None:
        async with fleet(1, stub={"delay": 0.3}) as f:
            assert f.router.port is not None
            first = _post("a")
            body = b'{"model": "m", "prompt": "p"}'
            second_head = (b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nExpect: 100-continue"
                           b"\r\nContent-Length: %d\r\n\r\n" % len(body))
            reader, writer = await asyncio.open_connection("127.0.0.1", f.router.port)
            try:
                writer.write(first + second_head)  # the second body waits for a 100
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                # the first response comes first and whole, no 100 inside it
                assert head.startswith(b"HTTP/1.1 200"), head
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                first_body = await reader.readexactly(length)
                assert b"100 Continue" not in first_body
                assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == (
                    b"HTTP/1.1 100 Continue\r\n\r\n")
                writer.write(body)
                status, _, _ = await asyncio.wait_for(_read_response(reader), 5)
                assert status == 200
            finally:
                writer.close()
            old = (b"POST /v1/completions HTTP/1.0\r\nHost: r\r\nExpect: 100-continue\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body))
            data = await raw_exchange(f.router.port, old, pause=0.2, rest=body, to_eof=True)
            assert data.startswith(b"HTTP/1.1 200"), data[:80]  # no 100 to HTTP/1.0
            await settle(f)
            f.assert_idle()
    run(scenario())


# ------------------------------------------------------- the router's resources
def test_fd_exhaustion_on_connect_is_the_routers_error_and_never_ejects(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with fleet(2) as f:
            loop = asyncio.get_running_loop()
            real = loop.create_connection

            stub_ports = {s.port for s in f.stubs}

            async def out_of_fds(*args: Any, **kwargs: Any) -> Any:
                if len(args) == 3 and args[2] in stub_ports:  # the router's upstream connects
                    raise OSError(errno.EMFILE, "Too many open files")
                return await real(*args, **kwargs)

            loop.create_connection = out_of_fds  # type: ignore[method-assign]
            try:
                f.router.pool.drop(f.stubs[0].url)
                f.router.pool.drop(f.stubs[1].url)
                replies = [await f.complete(f"k{i}") for i in range(5)]
            finally:
                loop.create_connection = real  # type: ignore[method-assign]
            assert {r.status for r in replies} == {503}, replies
            assert "router cannot open a connection" in replies[0].body["error"]["message"]
            assert f.router.table.active == f.router.table.servers  # nobody ejected
            assert f.router.table.pool_changes == {"added": 0, "removed": 0}
            assert not f.router.metrics.backend_errors.samples
            text = await f.metrics_text()
            assert 'affinity_router_router_errors_total{kind="fd"} 5' in text
            assert (await f.complete("after")).status == 200
            f.assert_idle()
    run(scenario())
    lines = [r for r in caplog.records if "router resource error (fd)" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]  # rate-limited: once


def test_a_second_at_the_descriptor_limit_is_the_routers_error(
        caplog: pytest.LogCaptureFixture) -> None:
    """uvloop drops an accept it has no descriptor for without a word; the sweep looks at
    the descriptors in use once a second and reports being at the limit, counted and
    logged (rate-limited), and nothing while below it."""
    async def scenario() -> None:
        async with fleet(1) as f:
            server = f.router.server
            server.fd_probe = lambda: (500, 1024)  # far below the limit
            await asyncio.sleep(1.3)
            assert "fd" not in f.router.router_errors.counts
            server.fd_probe = lambda: (1020, 1024)  # within FD_HEADROOM of it
            await wait_until(lambda: f.router.router_errors.counts.get("fd", 0) >= 1,
                             timeout=3.0)
            text = await f.metrics_text()
            assert re.search(r'affinity_router_router_errors_total\{kind="fd"\} [1-9]', text)
            assert (await f.complete("still served")).status == 200
    run(scenario())
    lines = [r.getMessage() for r in caplog.records if "router resource error (fd)" in
             r.getMessage()]
    assert lines and "1020 files open of the limit 1024" in lines[0], lines


def test_an_accept_error_reaches_the_server_that_counts_it_when_another_started_later(
        ) -> None:
    """The loop has one exception handler. The pool API's servers start after the
    client-facing one and install theirs last, so they must pass on the accept errors they
    have nobody to count; otherwise fd exhaustion goes unlogged whenever the API is on."""
    from affinity_vllm.http1 import ServerLimits
    from affinity_vllm.http_server import HttpServer

    async def handler(request: Any) -> None:
        raise AssertionError("no request is sent")

    async def scenario() -> list[tuple[str, str]]:
        counted: list[tuple[str, str]] = []
        client = HttpServer(handler, ServerLimits(), router_error=lambda k, m: counted.append(
            (k, m)))
        admin = HttpServer(handler, ServerLimits())
        await client.start("127.0.0.1", 0)
        await admin.start("127.0.0.1", 0)
        try:
            loop = asyncio.get_running_loop()
            loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                         "exception": OSError(errno.EMFILE, "Too many open "
                                                              "files")})
        finally:
            for server in (admin, client):
                server.stop_listening()
                server.abort_all()
        return counted

    counted = run(scenario())
    assert [kind for kind, _ in counted] == ["fd"], counted
    assert "could not be accepted" in counted[0][1]


def test_descriptor_use_counts_this_process_open_files() -> None:
    from affinity_vllm.limits import descriptor_use

    before = descriptor_use()
    assert before is not None and before[1] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    held = [socket.socket() for _ in range(5)]
    try:
        after = descriptor_use()
        assert after is not None and after[0] == before[0] + 5
    finally:
        for sock in held:
            sock.close()


def test_max_connections_is_fitted_to_the_fd_limit_at_start() -> None:
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))\n"
        "from affinity_vllm.limits import fit_fd_limit\n"
        "print(repr(fit_fd_limit(10000, 4096, 2)))\n"
        "print(repr(fit_fd_limit(100, 4096, 2)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    fitted, message = eval(out[0])  # a (int, str) repr from our own function
    assert fitted == (1024 - 64 - 16) // 2, out
    assert "--max-connections 10000" in message and "ulimit -n" in message
    assert "is 1024" in message and f"at most {fitted}" in message
    assert eval(out[1]) == (100, None)
    # and the router serves with the fitted limit, saying so
    code = (
        "import asyncio, logging, resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "from affinity_vllm.options import RouterOptions\n"
        "from affinity_vllm.router import Router\n"
        "async def main():\n"
        "    router = Router(RouterOptions(backends=('http://127.0.0.1:9',)))\n"
        "    print(router.server.limits.max_connections)\n"
        "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert int(done.stdout) == (1024 - 64 - 8) // 2  # one backend
    assert "needs about" in done.stderr and "ulimit -n" in done.stderr


def test_request_bodies_share_one_memory_budget() -> None:
    async def scenario() -> None:
        async with fleet(1, max_body_bytes=40_000, body_memory_budget=100_000) as f:
            assert f.router.port is not None
            held = []
            head = (b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n"
                    b"Content-Length: 40000\r\n\r\n{")
            for _ in range(2):  # 80,000 bytes reserved, bodies still coming
                reader, writer = await asyncio.open_connection("127.0.0.1", f.router.port)
                writer.write(head)
                held.append((reader, writer))
            await wait_until(lambda: f.router.server.body_budget.in_use == 80_000)
            status, body = status_and_json(await raw_exchange(f.router.port, head))
            assert status == 503 and "--body-memory-budget" in body["error"]["message"]
            # a chunked body is counted as it arrives
            chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n" + b"7530\r\n" + b"x" * 30000)
            status, body = status_and_json(await raw_exchange(f.router.port, chunked))
            assert status == 503
            for _, writer in held:
                writer.close()
            await wait_until(lambda: f.router.server.body_budget.in_use == 0)
            assert (await f.complete("s")).status == 200
            assert f.router.server.body_budget.in_use == 0
            assert f.router.router_errors.counts == {"body_memory": 2}
    run(scenario())


def test_backend_response_headers_are_bounded() -> None:
    async def scenario() -> None:
        async with rogue_router() as (router, _):
            assert router.port is not None
            close = b"Connection: close\r\n"
            data = await raw_exchange(router.port, _post("h", "big_headers", extra=close),
                                      to_eof=True)
            status, body = status_and_json(data)
            assert status == 502
            assert "response headers exceed 65536 bytes" in body["error"]["message"]
            data = await raw_exchange(router.port, _post("ok", "ok", extra=close), to_eof=True)
            assert status_and_json(data) == (200, {"id": "ok"})
    run(scenario())


# ------------------------------------------------------------------- health
def test_health_checks_count_in_runs_and_never_empty_the_pool(tmp_path: Path) -> None:
    health = BackendHealth(HealthPolicy())  # vllm-router's 3 and 2
    assert [health.probe(False, 1.0) for _ in range(2)] == [PoolChange.NONE] * 2
    assert health.probe(False, 1.0, others_routable=False) is PoolChange.NONE  # the last
    assert health.probe(False, 1.0) is PoolChange.REMOVE
    assert health.probe(True, 2.0) is PoolChange.NONE
    assert health.probe(False, 2.0) is PoolChange.NONE  # the run of passes is broken
    assert health.probe(True, 3.0) is PoolChange.NONE
    assert health.probe(True, 4.0) is PoolChange.ADD

    log = tmp_path / "decisions.jsonl"

    async def scenario() -> None:
        async with fleet(2, health_timeout=0.1, decision_log=str(log)) as f:
            both = f.router.table.servers
            for stub in f.stubs:  # a shared stall of both backends
                await stub.set_fault("hang")
            for _ in range(2):
                await f.router.monitor.check_health()
                assert f.router.table.active == both  # 1 or 2 failures: nothing removed
            await f.router.monitor.check_health()
            await f.router.monitor.check_health()
            assert len(f.router.table.active) == 1  # never the last one by checks alone
            body = await f.get_json("/health")
            assert body["status"] == "no_backends" and body["healthy_backends"] == 0
            for stub in f.stubs:
                await stub.set_fault("none")
            await f.router.monitor.check_health()
            assert len(f.router.table.active) == 1  # 1 pass of the 2 it needs
            assert (await f.get_json("/health"))["status"] == "ok"
            await f.router.monitor.check_health()
            assert sorted(f.router.table.active) == sorted(both)
    run(scenario())
    # Each pool change the checks made is in the decision log with its cause.
    changes = [(r.data["event"]["op"], r.data.get("reason")) for r in read_log(log)
               if not r.is_header and r.data["event"]["op"] in ("add_servers", "remove_servers")]
    assert changes == [("remove_servers", "health: failed health checks"),
                       ("add_servers", "health: checks passed")], changes
    assert_replays(log)


def test_health_is_not_ok_before_the_first_round() -> None:
    async def scenario() -> None:
        async with fleet(1, health_timeout=0.5) as f:
            await f.stubs[0].set_fault("hang")  # the next router's first round is slow
            router = Router(RouterOptions(backends=(f.stubs[0].url,), port=0,
                                          health_interval=60.0, health_timeout=0.5))
            starting = asyncio.create_task(router.start())
            await wait_until(lambda: router.port is not None)
            assert router.port is not None
            status, body = status_and_json(await raw_exchange(
                router.port, b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n"))
            assert (status, body["status"]) == (503, "starting")
            await f.stubs[0].set_fault("none")
            await starting
            await router.stop()
    run(scenario())


def test_health_is_not_ok_while_no_backend_has_passed_a_check() -> None:
    """A router started beside backends that still refuse (they are starting) completes
    its first round with every check failed, below the removal threshold: it says
    ``no_backends``, not ok, until a backend passes."""
    async def scenario() -> None:
        async with fleet(1, health_timeout=0.5) as f:
            await f.stubs[0].set_fault("refuse")
            router = Router(RouterOptions(backends=(f.stubs[0].url,), port=0,
                                          health_interval=60.0, health_timeout=0.5))
            await router.start()
            try:
                assert router.port is not None
                for _ in range(2):  # below the failure threshold: still in the pool
                    status, body = status_and_json(await raw_exchange(
                        router.port, b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n"))
                    assert (status, body["status"], body["active_backends"]) == (
                        503, "no_backends", 1)
                    await router.monitor.check_health()
                await f.stubs[0].set_fault("none")
                await router.monitor.check_health()
                status, body = status_and_json(await raw_exchange(
                    router.port, b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n"))
                assert (status, body["status"], body["healthy_backends"]) == (200, "ok", 1)
            finally:
                await router.stop()
    run(scenario())


# ------------------------------------------------------------------ drain
def test_sigterm_drain_tells_keep_alive_clients_to_go_and_resets_none() -> None:
    async def client(port: int, results: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in range(100):
                writer.write(_post(f"t{i}").replace(b"x-request-tag", b"x-session-id"))
                status, head, _ = await _read_response(reader)
                assert status == 200, head
                if b"connection: close" in head.lower():
                    assert await reader.read() == b""  # a clean close: EOF, no reset
                    results.append("closed")
                    return
            results.append("never told")
        except ConnectionResetError:
            results.append("reset")
        finally:
            writer.close()

    async def scenario() -> None:
        async with fleet(1, stub={"delay": 0.05}) as f:
            assert f.router.port is not None
            port = f.router.port
            results: list[str] = []
            clients = [asyncio.create_task(client(port, results)) for _ in range(8)]
            await wait_until(lambda: f.router.active_requests >= 8)
            await asyncio.sleep(0.1)
            await f.router.stop(grace=5.0)  # what SIGTERM runs
            await asyncio.gather(*clients)
            assert results == ["closed"] * 8, results
            with pytest.raises(OSError):  # no longer accepting
                await asyncio.open_connection("127.0.0.1", port)
    run(scenario())


async def _loop_until_told(port: int) -> str:
    """One keep-alive client looping keyed POSTs: how its connection ended. ``closed``:
    a complete response said ``Connection: close`` and EOF followed; ``cut``: the
    connection ended without one (a reset, or EOF inside or instead of a response)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i in range(400):
            writer.write(_post(f"s{i}").replace(b"x-request-tag", b"x-session-id"))
            status, head, _ = await asyncio.wait_for(_read_response(reader), 20)
            assert status == 200, head
            if b"connection: close" in head.lower():
                return "closed" if await reader.read() == b"" else "bytes after close"
        return "never told"
    except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError):
        return "cut"
    finally:
        writer.close()


def _signal_under_keep_alive_load(sig: signal.Signals) -> tuple[list[str], int | None, str]:
    """``affinity serve`` as its own process in front of a stub that takes 50 ms per
    request; 8 keep-alive clients loop POSTs; ``sig`` arrives while all 8 are in flight.
    Returns each client's ending, the router's exit code and its output."""
    with serve_process(["--delay", "0.05"],
                       ["--shutdown-grace", "10", "--health-interval", "60"]) as (router, url):
        port = int(url.rsplit(":", 1)[1])

        async def scenario() -> list[str]:
            clients = [asyncio.create_task(_loop_until_told(port)) for _ in range(8)]
            await asyncio.sleep(1.0)  # every client is mid-loop: one request in flight each
            router.send_signal(sig)
            return list(await asyncio.gather(*clients))

        endings = run(scenario())
        output, _ = router.communicate(timeout=20)
        return endings, router.returncode, output


def test_a_real_sigterm_resets_no_keep_alive_client() -> None:
    """The signal itself, on the command line: every busy keep-alive client is answered,
    told ``Connection: close`` and closed cleanly; the router exits 0 without a
    traceback."""
    endings, code, output = _signal_under_keep_alive_load(signal.SIGTERM)
    assert endings == ["closed"] * 8, (endings, output)
    assert code == 0 and "Traceback" not in output, output


def test_negative_control_sigkill_cuts_the_same_clients() -> None:
    """The same load and client check with SIGKILL, which drains nothing: the check
    above sees the cut connections it exists to catch."""
    endings, code, _ = _signal_under_keep_alive_load(signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert "closed" not in endings and "cut" in endings, endings


# ---------------------------------------------------------- smaller gaps
def test_trailers_are_not_headers() -> None:
    async def scenario() -> None:
        async with rogue_router() as (router, (backend,)):
            assert router.port is not None
            raw = (b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nConnection: close\r\n"
                   b"Transfer-Encoding: chunked\r\nx-rogue: ok\r\nx-request-tag: t\r\n\r\n"
                   b"2\r\n{}\r\n0\r\nx-session-id: trailer-key\r\nAuthorization: Bearer s\r\n"
                   b"\r\n")
            data = await raw_exchange(router.port, raw, to_eof=True)
            assert status_and_json(data) == (200, {"id": "t"})
            _, headers = backend.requests[-1]
            assert b"authorization" not in headers and b"x-session-id" not in headers
            assert router.table.decisions == {"unkeyed": 1}  # the trailer did not route
    run(scenario())


def test_request_target_reaches_the_backend_in_origin_form_only() -> None:
    async def scenario() -> None:
        async with rogue_router() as (router, (backend,)):
            assert router.port is not None
            for target, expected in ((b"http://evil.example/v1/completions?a=1#frag",
                                      b"/v1/completions?a=1"),
                                     (b"/v1/completions#frag", b"/v1/completions")):
                raw = _post("t", "ok", extra=b"Connection: close\r\n").replace(
                    b"POST /v1/completions ", b"POST " + target + b" ", 1)
                data = await raw_exchange(router.port, raw, to_eof=True)
                assert status_and_json(data)[0] == 200, data
                assert backend.requests[-1][0] == expected
    run(scenario())


@pytest.mark.parametrize("hosts", [b"", b"Host: a\r\nHost: b\r\n"])
def test_a_request_needs_exactly_one_host(hosts: bytes) -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            assert f.router.port is not None
            raw = b"GET /health HTTP/1.1\r\n" + hosts + b"\r\n"
            status, body = status_and_json(await raw_exchange(f.router.port, raw))
            assert status == 400 and "exactly one Host" in body["error"]["message"]
            assert f.router.table.decisions == {}
    run(scenario())


def test_huge_json_integers_and_lone_surrogate_keys_are_400s(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with fleet(1, session_body_field="user") as f:
            huge = b'{"model": "m", "prompt": "p", "max_tokens": ' + b"9" * 5000 + b"}"
            reply = await f.post("/v1/completions", huge)
            assert reply.status == 400, reply.body
            assert "not acceptable JSON" in reply.body["error"]["message"]
            reply = await f.post("/v1/completions", b'{"prompt": "p", "user": "\\ud800x"}')
            assert reply.status == 400, reply.body
            assert "lone surrogate" in reply.body["error"]["message"]
            assert f.router.table.decisions == {}
    run(scenario())
    assert not [r for r in caplog.records if r.exc_info]  # no traceback


def test_the_retry_never_lands_on_the_backend_that_just_failed() -> None:
    async def scenario() -> None:
        async with fleet(2, tie_break="first") as f:
            failing, busy = f.router.table.servers
            await f.stub_at(failing).set_fault("error")
            # The other backend carries 2 requests of other clients: with the failed
            # request held, the failing backend (1) is still the least loaded.
            f.router.table.observe([(busy, 2)])
            reply = await f.complete(None)
            assert reply.status == 200, reply.body
            assert reply.backend == busy and reply.headers.get("x-affinity-retried") == "1"
            # one 5xx on the failing backend: the retry did not go back to it
            assert f.router.metrics.backend_errors.get(failing, "5xx") == 1
            await settle(f)
            f.assert_idle()
    run(scenario())


def test_a_slow_reader_is_not_blamed_on_the_backend() -> None:
    async def scenario() -> None:
        async with fleet(1, upstream_timeout=0.3, stub={"huge_bytes": 8 << 20}) as f:
            assert f.router.port is not None
            backend = f.router.table.servers[0]
            await f.stubs[0].set_fault("huge")
            reader, writer = await asyncio.open_connection("127.0.0.1", f.router.port)
            try:
                writer.write(_post("slow"))
                head = await reader.readuntil(b"\r\n\r\n")
                await asyncio.sleep(1.2)  # read nothing for 4 upstream timeouts
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                got = 0
                while got < length:
                    got += len(await asyncio.wait_for(reader.read(1 << 20), 5))
                    await asyncio.sleep(0.01)
                assert got == length
            finally:
                writer.close()
            assert f.router.metrics.backend_errors.get(backend, "timeout") == 0
            assert f.router.metrics.backend_errors.get(backend, "mid_stream") == 0
            await settle(f)
    run(scenario())


def test_audit_fd_scenario_on_the_command_line_keeps_the_backend() -> None:
    """The audit: ``ulimit -n 1024`` and 1,100 idle client connections made upstream
    connects fail, counted as the backend refusing, and ejected it. Now the router
    serves fewer connections (fitted to the limit, said at start), and a request on an
    early connection still reaches the backend, which stays in the pool."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    stub = subprocess.Popen([sys.executable, "-m", "affinity_vllm.stub", "--name", "p"],
                            stdout=subprocess.PIPE, text=True, env=env)
    router: subprocess.Popen[str] | None = None
    idle: list[socket.socket] = []
    try:
        assert stub.stdout is not None
        stub_port = int(stub.stdout.readline().split()[1])
        router = subprocess.Popen(
            [sys.executable, "-m", "affinity_cli.main", "serve", "--port", "0",
             "--backend", f"http://127.0.0.1:{stub_port}", "--health-interval", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            preexec_fn=limit)
        assert router.stdout is not None
        lines: list[str] = []
        while True:
            line = router.stdout.readline()
            assert line, lines
            lines.append(line)
            if "listening on" in line:
                break
        assert any("ulimit -n" in seen and "serving at most" in seen for seen in lines), lines
        port = int(re.findall(r":(\d+) ", lines[-1])[0])
        first = socket.create_connection(("127.0.0.1", port))
        for _ in range(1100):
            idle.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(1.0)  # the router accepts up to its limit (before: every descriptor)
        body = b'{"model": "tiny", "prompt": "hi", "max_tokens": 2}'
        first.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nx-session-id: s\r\n"
                      b"Content-Type: application/json\r\nConnection: close\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
        first.settimeout(10)
        reply = b""
        while chunk := first.recv(65536):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
        first.close()
        for sock in idle:
            sock.close()
        idle.clear()
        metrics = urllib_get(port, "/metrics")
        assert 'affinity_router_pool_changes_total{change="removed"} 0' in metrics
        assert f'affinity_router_backend_up{{backend="http://127.0.0.1:{stub_port}"}} 1' in (
            metrics)
    finally:
        for sock in idle:
            sock.close()
        for proc in (router, stub):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)


def urllib_get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return str(resp.read().decode())
