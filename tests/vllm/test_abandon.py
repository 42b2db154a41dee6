"""Client abandonment and shutdown: a client that leaves releases its slot at
once, streaming or not, before or after the headers; it is counted and never a 500; a
shutdown is bounded by ``--shutdown-grace``. Every scenario ends with in-flight 0 within
2 s and a decision log that replays clean."""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from .fleet import Fleet, assert_replays, fleet, run, serve_process, settle, wait_until

BODY = {"model": "tiny", "prompt": "hello", "max_tokens": 20}


def _codes(f: Fleet) -> dict[str, float]:
    return {code: n for (_, code), n in f.router.metrics.requests.samples.items()}


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    # the router's own log (the stub's aiohttp server may complain about cut connections)
    bad = [r for r in caplog.records if r.name.startswith("affinity")
           and (r.exc_info or r.levelno >= logging.ERROR)]
    assert not bad, [r.getMessage() for r in bad]


async def _abandon(f: Fleet, body: dict[str, object], after: float,
                   read_first_chunk: bool = False) -> None:
    async def call() -> None:
        async with f.client.post(f.url + "/v1/completions", json=body,
                                 headers={"x-session-id": "gone"}) as resp:
            if read_first_chunk:
                await resp.content.readany()
            await asyncio.sleep(60)

    task = asyncio.create_task(call())
    await asyncio.sleep(after)
    task.cancel()  # aiohttp closes the unfinished connection
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_client_leaving_before_the_headers_releases_at_once(
        stream: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with fleet(2, decision_log=str(tmp_path / "log.ndjson"),
                         stub={"slow_seconds": 30.0}) as f:
            for stub in f.stubs:
                await stub.set_fault("slow")  # the backend would answer in 30 s
            await _abandon(f, {**BODY, "stream": stream}, after=0.2)
            started = time.monotonic()
            await settle(f, timeout=2.0)  # released at once, not after --upstream-timeout
            assert time.monotonic() - started < 2.0
            assert f.router.metrics.client_disconnects.get() == 1
            codes = _codes(f)
            assert codes.get("499") == 1 and "500" not in codes, codes
            f.assert_idle()
        assert_replays(tmp_path / "log.ndjson")
    run(scenario())
    _no_tracebacks(caplog)


def test_streaming_client_leaving_after_the_headers_releases_at_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with fleet(1, decision_log=str(tmp_path / "log.ndjson"),
                         stub={"token_delay": 0.5}) as f:
            await _abandon(f, {**BODY, "stream": True}, after=0.3, read_first_chunk=True)
            await settle(f, timeout=2.0)
            assert f.router.metrics.client_disconnects.get() == 1
            assert "500" not in _codes(f)
            f.assert_idle()
        assert_replays(tmp_path / "log.ndjson")
    run(scenario())
    _no_tracebacks(caplog)


def test_cancel_storm_leaves_no_slot_no_500_and_a_clean_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with fleet(2, decision_log=str(tmp_path / "log.ndjson"),
                         stub={"delay": 0.05, "token_delay": 0.01}) as f:
            rng = random.Random(7)

            async def one(i: int) -> None:
                body = {**BODY, "stream": i % 2 == 0, "max_tokens": 30}
                async with f.client.post(f.url + "/v1/completions", json=body,
                                         headers={"x-session-id": f"k{i % 13}"}) as resp:
                    await resp.read()

            tasks = [asyncio.create_task(one(i)) for i in range(120)]
            await asyncio.sleep(0.02)
            for task in tasks:
                asyncio.get_running_loop().call_later(rng.uniform(0, 0.4), task.cancel)
            await asyncio.gather(*tasks, return_exceptions=True)
            await settle(f, timeout=2.0)
            f.assert_idle()
            codes = _codes(f)
            assert "500" not in codes, codes
            assert codes.get("499", 0) == f.router.metrics.client_disconnects.get() > 0
            assert (await f.complete("after")).status == 200
        assert_replays(tmp_path / "log.ndjson")
    run(scenario())
    _no_tracebacks(caplog)


def test_stop_with_a_hung_backend_cancels_at_the_grace_deadline(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="affinity_vllm.router")

    async def scenario() -> None:
        async with fleet(1, decision_log=str(tmp_path / "log.ndjson")) as f:
            await f.stubs[0].set_fault("hang")
            pending = asyncio.create_task(f.complete("stuck"))
            await wait_until(lambda: f.router.active_requests == 1, what="in flight")
            started = time.monotonic()
            await f.router.stop(grace=0.3)
            assert 0.3 <= time.monotonic() - started < 2.0
            assert f.router.table.state.inflight_total == 0
            assert f.router.table.open_leases() == 0
            assert f.router.active_requests == 0
            await asyncio.gather(pending, return_exceptions=True)
        assert_replays(tmp_path / "log.ndjson")
    run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    assert any("1 requests still open" in m for m in messages), messages
    assert any("cancelling 1 open requests" in m for m in messages), messages


def test_sigterm_on_the_command_line_is_bounded_by_shutdown_grace(tmp_path: Path) -> None:
    with serve_process(["--fault", "hang"],
                       ["--shutdown-grace", "0.5", "--health-interval", "60"]) as (router, url):

        async def hang_one() -> None:
            async with aiohttp.ClientSession() as client:
                task = asyncio.create_task(client.post(url + "/v1/completions", json=BODY))
                await asyncio.sleep(0.5)
                router.send_signal(signal.SIGTERM)
                await asyncio.gather(task, return_exceptions=True)

        started = time.monotonic()
        asyncio.run(hang_one())
        output, _ = router.communicate(timeout=10)
        assert router.returncode == 0, output
        assert time.monotonic() - started < 8.0, output  # grace 0.5 s; slack for load
        assert "grace of 0.5 s over; cancelling 1 open requests" in output, output
        assert "Traceback" not in output, output
