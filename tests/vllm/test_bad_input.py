"""Bad input: clear 4xx errors, no crash, no leaked count."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .fleet import Fleet, fleet, run, settle


async def _raw_request(f: Fleet, raw: bytes) -> bytes:
    """Send raw bytes to the router and return the whole response (it closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", f.router.port)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1 << 20), 5)
    finally:
        writer.close()


async def _still_serving(f: Fleet) -> None:
    reply = await f.complete("after")
    assert reply.status == 200
    f.assert_idle()
    assert f.router.table.decisions.get("rejected", 0) == 0


def test_malformed_json_is_400_with_a_message() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            reply = await f.post("/v1/completions", b'{"prompt": "x",', session="s")
            assert reply.status == 400
            message = reply.body["error"]["message"]
            assert message.startswith("request body is not valid JSON") and "column" in message
            for bad, expected in ((b"[1, 2]", "must be a JSON object, got list"),
                                  (b"\xff\xfe", "not valid UTF-8 JSON"),
                                  (b"", "not valid JSON")):
                reply = await f.post("/v1/chat/completions", bad)
                assert reply.status == 400
                assert expected in reply.body["error"]["message"], reply.body
            # nothing was routed: no decision, no sticky entry
            assert f.router.table.decisions == {}
            assert (await f.get_json("/status"))["sticky_entries"] == 0
            await _still_serving(f)
    run(scenario())


def test_body_over_the_limit_is_413_with_and_without_content_length() -> None:
    async def scenario() -> None:
        async with fleet(1, max_body_bytes=4096) as f:
            big = b'{"prompt": "' + b"x" * 5000 + b'"}'
            reply = await f.post("/v1/completions", big)
            assert reply.status == 413
            assert "4096 bytes" in reply.body["error"]["message"]

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(10):
                    yield b"x" * 1000

            async with f.client.post(f.url + "/v1/completions", data=chunks()) as resp:
                assert resp.status == 413  # chunked: caught while reading
                assert "4096 bytes" in (await resp.json())["error"]["message"]
            just_fits = b'{"prompt": "' + b"y" * 3000 + b'", "max_tokens": 1}'
            assert (await f.post("/v1/completions", just_fits)).status == 200
            await _still_serving(f)
    run(scenario())


def test_unknown_path_is_404_and_wrong_method_405() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            reply = await f.post("/v1/embeddings", {"input": "x"})
            assert reply.status == 404
            assert "no route for POST /v1/embeddings" in reply.body["error"]["message"]
            async with f.client.get(f.url + "/nope") as resp:
                assert resp.status == 404
                assert (await resp.json())["error"]["type"] == "not_found"
            async with f.client.get(f.url + "/v1/completions") as resp:
                assert resp.status == 405
                assert "allowed: POST" in (await resp.json())["error"]["message"]
            text = await f.metrics_text()
            assert 'affinity_router_requests_total{route="unmatched",code="404"} 2' in text
            await _still_serving(f)
    run(scenario())


def test_oversized_headers_are_refused() -> None:
    async def scenario() -> None:
        async with fleet(1, max_header_bytes=1024) as f:
            long_value = b"v" * 4000
            raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-session-id: " + long_value
                   + b"\r\nContent-Length: 2\r\n\r\n{}")
            response = await _raw_request(f, raw)
            status_line = response.split(b"\r\n", 1)[0]
            assert status_line.split()[1] == b"400", response[:200]
            assert b"got more than 1024 bytes" in response.lower()
            long_path = b"GET /" + b"a" * 4000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
            assert (await _raw_request(f, long_path)).split()[1] == b"400"
            many = b"".join(b"x-h%d: 1\r\n" % i for i in range(200))
            flood = b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n"
            assert (await _raw_request(f, flood)).split()[1] == b"400"
            assert f.router.table.decisions == {}
            await _still_serving(f)
    run(scenario())


def test_bad_session_keys_are_400() -> None:
    async def scenario() -> None:
        async with fleet(1, session_body_field="conversation") as f:
            reply = await f.complete(None, conversation={"nested": 1})
            assert reply.status == 400
            assert "must be a string or an integer, got dict" in reply.body["error"]["message"]
            reply = await f.complete("k" * 2000)
            assert reply.status == 400 and "limit is 1024" in reply.body["error"]["message"]
            assert f.router.table.decisions == {}
            await _still_serving(f)
    run(scenario())


def test_garbage_on_the_socket_does_not_crash_the_router() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            for raw in (b"\x00\x01\x02garbage\r\n\r\n", b"GET\r\n\r\n",
                        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 10\r\n\r\n{\"a\""):
                _reader, writer = await asyncio.open_connection("127.0.0.1", f.router.port)
                writer.write(raw)
                await writer.drain()
                writer.close()  # half a request, then gone
                await asyncio.sleep(0.05)
            await _still_serving(f)
    run(scenario())


def test_full_determinism_requires_a_session_key() -> None:
    async def scenario() -> None:
        async with fleet(2, full_determinism=True) as f:
            reply = await f.complete(None)
            assert reply.status == 400 and "session key" in reply.body["error"]["message"]
            first = await f.complete("k1")
            assert first.status == 200 and first.path == "new"
            async with f.client.get(f.url + "/v1/models") as resp:
                assert resp.status == 200  # listed through a fixed key, not refused
            await settle(f)
            f.assert_idle()
    run(scenario())
