"""The recording fleet: ground truth for the black-box router checks."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from affinity_conformance.router_check.fleet import (
    FleetError,
    RecordingFleet,
    correlation_prompt,
)


async def _post(http: aiohttp.ClientSession, url: str, cid: str, *, stream: bool = False,
                chat: bool = False) -> tuple[int, str]:
    body: dict[str, object] = {"model": "m", "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": correlation_prompt(cid)}]
    else:
        body["prompt"] = correlation_prompt(cid)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        async with http.post(url + path, json=body, headers={"x-session-id": "k"}) as resp:
            return resp.status, (await resp.read()).decode()
    except aiohttp.ClientPayloadError:
        return -1, "cut"


def test_holds_until_released_and_records_arrivals() -> None:
    async def scenario() -> None:
        async with RecordingFleet(2) as fleet, aiohttp.ClientSession() as http:
            task = asyncio.create_task(_post(http, fleet.urls[1], "c1"))
            arrival = await fleet.wait_arrival("c1", 5)
            assert arrival is not None and arrival.backend == 1 and arrival.seq == 0
            assert arrival.header("X-Session-Id") == "k"
            await asyncio.sleep(0.05)
            assert not task.done() and fleet.is_held("c1") and fleet.held_on(1) == 1
            fleet.release("c1")
            status, body = await task
            assert status == 200 and "done" in body
            assert fleet.held_ids() == []
            with pytest.raises(FleetError, match="no request 'c1' is held"):
                fleet.release("c1")

    asyncio.run(scenario())


def test_streams_send_first_chunk_at_once_and_failures_are_visible() -> None:
    async def scenario() -> None:
        async with RecordingFleet(1) as fleet, aiohttp.ClientSession() as http:
            url = fleet.urls[0]
            async with http.post(url + "/v1/completions",
                                 json={"prompt": correlation_prompt("s1"), "stream": True}) as r:
                first = await r.content.readline()  # arrives while the request is held
                assert first.startswith(b"data: ") and fleet.is_held("s1")
                fleet.release("s1")
                rest = (await r.read()).decode()
            assert rest.rstrip().endswith("data: [DONE]")
            failing = asyncio.create_task(_post(http, url, "f1", chat=True))
            assert await fleet.wait_arrival("f1", 5) is not None
            fleet.release("f1", "fail")
            assert (await failing)[0] == 500
            cut = asyncio.create_task(_post(http, url, "f2", stream=True))
            assert await fleet.wait_arrival("f2", 5) is not None
            fleet.release("f2", "fail")
            status, body = await cut
            assert status == -1 or "[DONE]" not in body
            retry = await _post(http, url, "f1", chat=True)  # a router's retry: answered at once
            assert retry[0] == 500 and len(fleet.arrivals_of("f1")) == 2

    asyncio.run(scenario())


def test_probes_health_and_unknown_paths() -> None:
    async def scenario() -> None:
        async with RecordingFleet(1) as fleet, aiohttp.ClientSession() as http:
            url = fleet.urls[0]
            for path in ("/health", "/v1/models", "/server_info", "/get_server_info",
                         "/model_info", "/get_load"):
                async with http.get(url + path) as resp:
                    assert resp.status == 200, path
            fleet.set_healthy(0, False)
            async with http.get(url + "/health") as resp:
                assert resp.status == 503
            async with http.get(url + "/nope") as resp:
                assert resp.status == 404
            assert fleet.probes["GET /nope"] == 1 and fleet.probes["GET /health"] == 2
            async with http.post(url + "/v1/completions", json={"prompt": "no id"}) as resp:
                assert resp.status == 200  # a router's own readiness probe: answered at once
            async with http.post(url + "/v1/completions", data=b"[1") as resp:
                assert resp.status == 400

    asyncio.run(scenario())


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(FleetError, match=r"\[1, 64\], got 0"):
        RecordingFleet(0)
    with pytest.raises(FleetError, match="2 fleet ports given for 3 backends"):
        RecordingFleet(3, ports=(1, 2))
