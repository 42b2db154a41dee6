"""SSE streaming through the router: passed through chunk by chunk, released at the end."""

from __future__ import annotations

import json
import time

from .fleet import fleet, run, settle


async def _read_events(resp: object) -> list[str]:
    events: list[str] = []
    buffer = b""
    async for chunk in resp.content.iter_any():  # type: ignore[attr-defined]
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            events.append(event.decode())
    assert buffer == b"", buffer
    return events


def test_completion_stream_is_relayed_chunk_by_chunk() -> None:
    async def scenario() -> None:
        async with fleet(2, stub={"token_delay": 0.05}) as f:
            body = {"model": "tiny", "prompt": "stream me", "max_tokens": 8, "stream": True}
            started = time.perf_counter()
            first_chunk_at: float | None = None
            received = b""
            async with f.client.post(f.url + "/v1/completions", json=body,
                                     headers={"x-session-id": "st"}) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                backend = resp.headers["x-affinity-backend"]
                assert f.router.table.inflight(backend) == 1  # held for the whole stream
                async for chunk in resp.content.iter_any():
                    if first_chunk_at is None:
                        first_chunk_at = time.perf_counter() - started
                    received += chunk
            total = time.perf_counter() - started
            assert first_chunk_at is not None
            # 8 tokens x 50 ms: the first event arrives long before the stream ends,
            # so the router did not buffer the response.
            assert first_chunk_at < total - 0.2, (first_chunk_at, total)
            events = [e for e in received.decode().split("\n\n") if e]
            assert events[-1] == "data: [DONE]"
            pieces = [json.loads(e[len("data: "):]) for e in events[:-1]]
            assert "".join(p["choices"][0]["text"] for p in pieces if p["choices"]).count(
                " t") == 8
            assert pieces[-1]["usage"]["completion_tokens"] == 8
            await settle(f)
            f.assert_idle()
    run(scenario())


def test_stream_bytes_equal_the_backends_own_stream() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 5, "stream": True}
            async with f.client.post(f.url + "/v1/completions", json=body) as resp:
                via_router = await resp.read()
            async with f.client.post(f.stubs[0].url + "/v1/completions", json=body) as resp:
                direct = await resp.read()
            # identical except the completion id, which counts requests per stub
            assert via_router.replace(b"cmpl-s0-1", b"X") == direct.replace(b"cmpl-s0-2", b"X")
    run(scenario())


def test_chat_stream_and_stickiness() -> None:
    async def scenario() -> None:
        async with fleet(2) as f:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3, "stream": True}
            backends = []
            for _ in range(3):
                async with f.client.post(f.url + "/v1/chat/completions", json=body,
                                         headers={"x-session-id": "chat-1"}) as resp:
                    events = await _read_events(resp)
                    backends.append(resp.headers["x-affinity-backend"])
                assert events[-1] == "data: [DONE]"
                first = json.loads(events[0][len("data: "):])
                assert first["object"] == "chat.completion.chunk"
                assert "content" in first["choices"][0]["delta"]
            assert len(set(backends)) == 1
            await settle(f)
            f.assert_idle()
    run(scenario())


def test_client_leaving_mid_stream_releases_the_count() -> None:
    async def scenario() -> None:
        async with fleet(2, stub={"token_delay": 0.05}) as f:
            body = {"model": "tiny", "prompt": "long", "max_tokens": 200, "stream": True}
            async with f.client.post(f.url + "/v1/completions", json=body) as resp:
                await resp.content.readany()
                assert f.router.table.state.inflight_total == 1
                resp.close()  # drop the connection mid-stream
            await settle(f)
            f.assert_idle()
            assert f.router.metrics.client_disconnects.get() == 1
    run(scenario())
