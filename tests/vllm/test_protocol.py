"""Protocol hygiene and limits: JSON 400s for every malformed input, read
timeouts, a connection cap, query strings, end-to-end and hop-by-hop headers,
X-Forwarded-For, chunked relay of huge bodies, and an overhead metric that starts at
the request's first byte."""

from __future__ import annotations

import asyncio
import logging

import pytest
from affinity_vllm.proxy import end_to_end

from .fleet import fleet, raw_exchange, router_over, run, settle, status_and_json

COMPLETION = b'{"model": "tiny", "prompt": "hi", "max_tokens": 1}'


def _post(extra_headers: bytes = b"", body: bytes = COMPLETION,
          target: bytes = b"/v1/completions") -> bytes:
    return (b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + extra_headers + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def test_malformed_inputs_get_a_json_400_and_no_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with fleet(1, max_header_bytes=1024) as f:
            port = f.router.port
            assert port is not None
            cases = [
                (_post(b"x-session-id: \xff\xfe\r\n"), "not valid UTF-8"),
                (_post(body=b"[" * 200_000 + b"]" * 200_000), "nested too deeply"),
                (_post(b"x-big: " + b"v" * 4000 + b"\r\n"), "got more than 1024 bytes"),
                (b"GET /" + b"a" * 4000 + b" HTTP/1.1\r\n\r\n", "request line"),
                (b"\x00\x01 garbage\r\n\r\n", "malformed HTTP request"),
                (_post(b"Transfer-Encoding: chunked\r\n", body=b"zz\r\n"), "malformed"),
            ]
            for raw, expected in cases:
                status, body = status_and_json(await raw_exchange(port, raw))
                assert status == 400, (raw[:60], body)
                assert expected in body["error"]["message"], body
            assert f.router.table.decisions == {}
            assert (await f.complete("after")).status == 200
    run(scenario())
    assert not [r for r in caplog.records if r.name.startswith("affinity")
                and (r.exc_info or r.levelno >= logging.ERROR)]


def test_half_written_requests_time_out_with_408_and_close() -> None:
    async def scenario() -> None:
        async with fleet(1, header_timeout=0.3, body_timeout=0.3, idle_timeout=0.3) as f:
            port = f.router.port
            assert port is not None
            started = asyncio.get_running_loop().time()
            half_head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            half_body = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                         b"{\"a\"")
            replies = await asyncio.gather(
                *(raw_exchange(port, half_head) for _ in range(40)),
                *(raw_exchange(port, half_body) for _ in range(10)))
            assert asyncio.get_running_loop().time() - started < 2.0
            for reply in replies[:40]:
                status, body = status_and_json(reply)
                assert status == 408 and "--header-timeout" in body["error"]["message"]
            for reply in replies[40:]:
                status, body = status_and_json(reply)
                assert status == 408 and "--body-timeout" in body["error"]["message"]
            idle = await raw_exchange(port, b"")  # connected, silent: closed, no answer
            assert idle == b""
            await asyncio.sleep(0.05)
            assert len(f.router.server.connections) == 0
            assert f.router.server.read_timeouts == 50
    run(scenario())


def test_connections_beyond_the_cap_get_503() -> None:
    async def scenario() -> None:
        async with fleet(1, max_connections=3) as f:
            port = f.router.port
            assert port is not None
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            try:
                await asyncio.sleep(0.05)
                status, body = status_and_json(await raw_exchange(port, _post()))
                assert status == 503 and "--max-connections" in body["error"]["message"]
            finally:
                for _, writer in held:
                    writer.close()
            await asyncio.sleep(0.05)
            assert (await f.complete("after")).status == 200
    run(scenario())


def test_query_headers_and_forwarded_for_pass_as_a_proxy_should() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            port = f.router.port
            assert port is not None
            hop = (b"Connection: keep-alive, x-private\r\nx-private: secret\r\n"
                   b"Keep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Authorization: Basic eA==\r\n"
                   b"Authorization: Bearer t\r\nX-Forwarded-For: 6.6.6.6\r\n"
                   b"x-session-id: q\r\n")
            reply = await raw_exchange(port, _post(hop, target=b"/v1/completions?a=1&b=two"))
            head = reply.partition(b"\r\n\r\n")[0].lower()
            assert head.startswith(b"http/1.1 200"), head
            assert b"\r\nx-request-id: cmpl-s0-" in head  # end-to-end response header
            record = f.stubs[0].requests[-1]
            assert record["query"] == "a=1&b=two"
            sent = {name: value for name, value in record["all_headers"]}
            for name in ("x-private", "keep-alive", "te", "proxy-authorization"):
                assert name not in sent, (name, sent)
            assert sent["authorization"] == "Bearer t"  # end-to-end: forwarded
            assert sent["x-forwarded-for"] == "6.6.6.6, 127.0.0.1"  # appended, not trusted
            assert sent["x-session-id"] == "q"
            await f.stubs[0].set_fault("unauthorized")
            denied = await f.complete("q")
            assert denied.status == 401
            headers = {k.lower(): v for k, v in denied.headers.items()}
            assert headers["www-authenticate"] == 'Bearer realm="stub"'
            assert headers["x-request-id"] == "auth-1"
    run(scenario())


def test_hop_by_hop_response_headers_are_dropped() -> None:
    upstream = [(b"content-type", b"application/json"), (b"connection", b"keep-alive, x-hop"),
                (b"x-hop", b"1"), (b"keep-alive", b"timeout=5"), (b"transfer-encoding", b"chunked"),
                (b"content-length", b"5"), (b"x-request-id", b"r1"),
                (b"www-authenticate", b"Bearer"), (b"proxy-authenticate", b"Basic")]
    assert end_to_end(upstream) == [(b"content-type", b"application/json"),
                                    (b"x-request-id", b"r1"), (b"www-authenticate", b"Bearer")]


def test_huge_response_is_relayed_in_chunks_not_buffered_whole() -> None:
    size = 64 << 20

    async def scenario() -> None:
        async with fleet(1, stub={"huge_bytes": size}) as f:
            stub = f.stubs[0]
            await stub.set_fault("huge")
            async with f.client.post(f.url + "/v1/completions",
                                     json={"model": "tiny", "prompt": "x"}) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Length"] == str(size)
                first = await resp.content.read(1 << 20)
                await asyncio.sleep(0.3)  # a slow reader: the router must not read ahead
                assert 0 < stub.huge_sent < size // 2, stub.huge_sent
                total = len(first)
                while chunk := await resp.content.read(4 << 20):
                    total += len(chunk)
            assert total == size
            await settle(f, timeout=2.0)
            f.assert_idle()
    run(scenario(), timeout=60)


def test_overhead_is_measured_from_the_first_byte_including_parsing() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            port = f.router.port
            assert port is not None
            raw = _post()
            head, _, body = raw.partition(b"\r\n\r\n")
            reply = await raw_exchange(port, head + b"\r\n\r\n", pause=0.2, rest=body)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
            histogram = f.router.metrics.overhead
            assert histogram.count == 1
            assert histogram.total >= 0.2  # receipt of the first byte -> first byte upstream
    run(scenario())


def test_a_body_delimited_by_the_backend_closing_is_relayed_whole() -> None:
    async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"x-request-id: eof-1\r\nconnection: close\r\n\r\n{\"ok\": true}")
        await writer.drain()
        writer.close()

    async def scenario() -> None:
        server = await asyncio.start_server(backend, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with router_over([f"http://127.0.0.1:{port}"]) as router:
                assert router.port is not None
                reply = await raw_exchange(router.port, _post())
                status, body = status_and_json(reply)
                assert (status, body) == (200, {"ok": True})
                assert b"x-request-id: eof-1" in reply
                assert router.table.state.inflight_total == 0
        finally:
            server.close()
    run(scenario())
