"""``affinity serve --context-reuse``: the context band's ``c`` scaled by observed reuse
(SPEC R-BAND-6: ``c = prompt * H_p // Q_p`` over completed kept turns on the pinned ``p``;
no valid usage adds nothing; a server leaving the pool loses its sums).

Fast tier. Stub backends report ``usage.prompt_tokens_details.cached_tokens`` from their
block prefix cache; a small fake backend (:func:`_fake`) answers with whatever body a test
gives it, for usage vLLM would not send. Prompts are token-id lists, so the prompt length
``c`` the router counts is exact (R-BAND-1) and the decision log shows the value each
acquire sent. With margin 0, T = 100, cap 3 and ``tie_break first``, sequential turns of
one session are new on the first backend and then kept there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from affinity_vllm.options import OptionsError, RouterOptions
from aiohttp import web

from affinity_cli.main import main
from affinity_conformance.decision_log import read_log

from .fleet import Fleet, fleet, router_over, run, settle, wait_until

BAND: dict[str, Any] = {"margin": 0, "affinity_break_tokens": 100,
                        "affinity_break_band_cap": 3, "tie_break": "first"}
REUSE: dict[str, Any] = {**BAND, "context_reuse": True}
TURNS = [list(range(1, 65)), list(range(1, 97)), list(range(1, 129))]  # growing prefix


def _contexts(log: Path) -> list[int | None]:
    return [r.data["event"].get("context_tokens") for r in read_log(log)
            if not r.is_header and r.data["event"]["op"] == "acquire"]


def _reports(f_or_router: Any, sid: str) -> dict[str, float]:
    router = getattr(f_or_router, "router", f_or_router)
    reuse = router.proxy.reuse
    assert reuse is not None
    return {result: value for (backend, result), value in reuse.reports.samples.items()
            if backend == sid}


# ------------------------------------------------------------------------ options
@pytest.mark.parametrize(("options", "message"), [
    ({"context_reuse": True}, "context_reuse scales the context band's c, so it needs "
     "affinity_break_tokens (an integer >= 1), got None (--context-reuse without "
     "--affinity-break-tokens)"),
    ({**REUSE, "context_tokens": "off"}, "context_reuse scales the prompt length, which "
     "context_tokens 'off' never counts; accepted with it: estimate, tokenize "
     "(--context-reuse with --context-tokens off)"),
    ({**BAND, "context_reuse": "yes"}, "context_reuse must be True or False, got 'yes'"),
    # Found by a new user: accepted, then every kept response parsed for a c the core ignores.
    ({**REUSE, "full_determinism": True}, "context_reuse scales the context band's c, "
     "which full_determinism ignores (pins are always kept, new keys hashed); accepted with it: "
     "full_determinism False (--context-reuse with --full-determinism)"),
])
def test_bad_reuse_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionsError) as caught:
        RouterOptions(backends=("http://h:1",), **options)
    assert str(caught.value) == message


@pytest.mark.parametrize(("argv", "message"), [
    (["--margin", "1", "--context-reuse"], "(--context-reuse without --affinity-break-tokens)"),
    (["--margin", "1", "--affinity-break-tokens", "100", "--affinity-break-band-cap", "2",
      "--context-tokens", "off", "--context-reuse"],
     "(--context-reuse with --context-tokens off)"),
    (["--margin", "1", "--affinity-break-tokens", "100", "--affinity-break-band-cap", "2",
      "--full-determinism", "--context-reuse"], "(--context-reuse with --full-determinism)"),
])
def test_bad_reuse_flags_fail_at_startup(argv: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--backend", "http://h:1", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_help_names_the_vllm_flag(capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at hyphens otherwise
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--context-reuse" in text and "--enable-prompt-tokens-details" in text
    assert "cumulative" in text and "include_usage" in text


# -------------------------------------------------------------- scaling with stubs
def test_kept_turns_feed_the_meter_and_pinned_keys_send_the_scaled_length(
        tmp_path: Path) -> None:
    log = tmp_path / "router.ndjson"

    async def scenario() -> tuple[Fleet, dict[str, Any], str]:
        async with fleet(2, **REUSE, decision_log=str(log)) as f:
            paths = [(await f.complete("conv", prompt=ids)).path for ids in TURNS]
            assert paths == ["new", "kept", "kept"]
            assert (await f.complete("other", prompt=[9] * 150)).path == "new"
            await settle(f)
            status = await f.get_json("/status")
            metrics = await f.metrics_text()
            f.assert_idle()
            return f, status, metrics

    f, status, metrics = run(scenario())
    first = f.router.table.servers[0]
    seen = f.stub_at(first).requests  # what the backend itself counted, turn by turn
    assert [r["prompt_tokens"] for r in seen] == [64, 96, 128, 150]
    prompt_2, cached_2 = seen[1]["prompt_tokens"], seen[1]["hit_tokens"]
    assert 0 < cached_2 < prompt_2  # a partial hit: the scaling is visible
    contexts = _contexts(log)
    # first turn: new, no pin; second: pinned, but no continuing turn recorded yet; third:
    # scaled by the second's reuse; "other": not pinned, its prompt length.
    assert contexts == [64, 96, 128 * cached_2 // prompt_2, 150]
    assert contexts[2] is not None and contexts[2] < 128
    # the second and third turns were kept and recorded; the first and "other" were new: nothing.
    recorded = [(r["prompt_tokens"], r["hit_tokens"]) for r in seen[1:3]]
    assert status["context_band"]["reuse"][first] == {
        "cached_tokens": sum(h for _, h in recorded),
        "prompt_tokens": sum(p for p, _ in recorded)}
    assert _reports(f, first) == {"recorded": 2, "no_usage": 0, "invalid": 0,
                                  "left_pool": 0}
    assert (f'affinity_router_reuse_reports_total{{backend="{first}",result="recorded"}} 2'
            in metrics)
    ratio = sum(h for _, h in recorded) / sum(p for p, _ in recorded)
    assert f'affinity_router_backend_prefix_reuse{{backend="{first}"}} {ratio!r}' in metrics


def test_streamed_turns_with_include_usage_are_recorded(tmp_path: Path) -> None:
    async def scenario() -> tuple[Fleet, list[str]]:
        async with fleet(2, **REUSE) as f:
            bodies = []
            for ids in TURNS[:2]:
                reply = await f.complete("conv", prompt=ids, stream=True,
                                         stream_options={"include_usage": True})
                assert reply.status == 200
                bodies.append(reply.body)
            await settle(f)
            return f, bodies

    f, bodies = run(scenario())
    first = f.router.table.servers[0]
    assert all(b.endswith("data: [DONE]\n\n") for b in bodies)  # relayed intact
    assert _reports(f, first)["recorded"] == 1  # the kept second turn
    seen = f.stub_at(first).requests[1]
    assert f.router.proxy.reuse is not None
    assert f.router.proxy.reuse.meter.reuse(first) == (seen["hit_tokens"],
                                                       seen["prompt_tokens"])


def test_broken_turns_record_nothing() -> None:
    async def scenario() -> tuple[Fleet, str]:
        async with fleet(2, **REUSE) as f:
            first, second = f.router.table.servers
            for key in ("hog", "conv"):
                assert (await f.complete(key, prompt=[5] * 10)).backend == first
            f.stubs[0].options.delay = 0.4
            hog = asyncio.create_task(f.complete("hog", prompt=[5] * 10))
            await wait_until(lambda: f.router.table.inflight(first) == 1, what="the hog")
            reply = await f.complete("conv", prompt=[5] * 20)  # c = 20 < T: breaks
            assert reply.path == "broken" and reply.backend == second
            assert (await hog).path == "kept"
            await settle(f)
            return f, second

    f, second = run(scenario())
    assert sum(_reports(f, second).values()) == 0
    assert f.router.proxy.reuse is not None
    assert f.router.proxy.reuse.meter.reuse(second) == (0, 0)


def test_without_the_option_nothing_is_kept_or_recorded(tmp_path: Path) -> None:
    log = tmp_path / "router.ndjson"

    async def scenario() -> tuple[Fleet, str]:
        async with fleet(2, **BAND, decision_log=str(log)) as f:
            for ids in TURNS:
                assert (await f.complete("conv", prompt=ids)).status == 200
            return f, await f.metrics_text()

    f, metrics = run(scenario())
    assert f.router.proxy.reuse is None and f.router.metrics.reuse is None
    assert "reuse_reports_total" not in metrics and "prefix_reuse" not in metrics
    assert _contexts(log) == [len(ids) for ids in TURNS]  # the prompt lengths, unscaled


def test_a_backend_leaving_the_pool_forgets_its_reuse() -> None:
    async def scenario() -> tuple[Fleet, str, str]:
        async with fleet(2, **REUSE) as f:
            first = f.router.table.servers[0]
            for ids in TURNS:
                await f.complete("conv", prompt=ids)
            reuse = f.router.proxy.reuse
            assert reuse is not None and reuse.meter.reuse(first)[1] > 0
            await f.stubs[0].set_fault("refuse")
            reply = await f.complete("conv", prompt=TURNS[2])  # ejected: connect error
            assert reply.status == 200 and reply.backend != first
            assert not f.router.table.is_active(first)
            return f, first, await f.metrics_text()

    f, first, metrics = run(scenario())
    assert f.router.proxy.reuse is not None
    assert f.router.proxy.reuse.meter.reuse(first) == (0, 0)
    assert f'prefix_reuse{{backend="{first}"}}' not in metrics


# --------------------------------------------------- odd usage from a fake backend
@contextlib.asynccontextmanager
async def _fake(body: bytes, content_type: str) -> AsyncIterator[str]:
    """One backend answering every generation request with ``body``."""
    async def generate(request: web.Request) -> web.StreamResponse:
        if content_type.lower() == "text/event-stream":
            response = web.StreamResponse(headers={"Content-Type": content_type})
            await response.prepare(request)
            for start in range(0, len(body), 50):  # many small chunks, like tokens
                await response.write(body[start:start + 50])
            await response.write_eof()
            return response
        return web.Response(body=body, content_type=content_type)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", generate)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[-1][1]}"
    finally:
        await runner.cleanup()


def _json_body(usage: Any, text: str = " t1") -> bytes:
    return json.dumps({"id": "cmpl-1", "choices": [{"index": 0, "text": text}],
                       "usage": usage}).encode()


def _stream_body(usage: Any) -> bytes:
    chunks = [{"id": "c", "choices": [{"index": 0, "text": f" t{i}"}]} for i in range(30)]
    if usage is not None:
        chunks.append({"id": "c", "choices": [], "usage": usage})
    return b"".join(b"data: %s\n\n" % json.dumps(c).encode() for c in chunks) \
        + b"data: [DONE]\n\n"


GOOD = {"prompt_tokens": 200, "completion_tokens": 1, "total_tokens": 201,
        "prompt_tokens_details": {"cached_tokens": 150}}


@pytest.mark.parametrize(("body", "content_type", "result"), [
    (_json_body(GOOD), "application/json", "recorded"),
    (_json_body(GOOD, text="x" * 600_000), "application/json", "recorded"),  # > relay buffer
    (_json_body({**GOOD, "prompt_tokens_details": None}), "application/json", "no_usage"),
    (_json_body(None), "application/json", "no_usage"),
    (_json_body({**GOOD, "prompt_tokens_details": {"cached_tokens": 201}}),
     "application/json", "invalid"),
    (_json_body({**GOOD, "prompt_tokens": True}), "application/json", "invalid"),
    (_json_body(GOOD)[:-20], "application/json", "invalid"),  # truncated
    (_stream_body(GOOD), "text/event-stream", "recorded"),
    (_stream_body(None), "text/event-stream", "no_usage"),  # no include_usage
    (_stream_body(GOOD), "Text/Event-Stream", "recorded"),  # Found by a new user: read as JSON
    (_stream_body({**GOOD, "prompt_tokens_details": {"cached_tokens": -1}}),
     "text/event-stream", "invalid"),
])
def test_odd_usage_records_nothing_and_the_client_gets_the_body_intact(
        body: bytes, content_type: str, result: str) -> None:
    async def scenario() -> tuple[list[bytes], dict[str, float], tuple[int, int]]:
        async with _fake(body, content_type) as url, \
                router_over([url], **REUSE) as router, aiohttp.ClientSession() as client:
            received = []
            for turn in range(2):  # new, then kept
                async with client.post(f"http://127.0.0.1:{router.port}/v1/completions",
                                       json={"model": "m", "prompt": [1] * 200},
                                       headers={"x-session-id": "s"}) as resp:
                    assert resp.status == 200
                    assert resp.headers["x-affinity-path"] == ("new", "kept")[turn]
                    received.append(await resp.read())
            await wait_until(lambda: router.active_requests == 0, what="the relay to end")
            assert router.proxy.reuse is not None
            return received, _reports(router, url), router.proxy.reuse.meter.reuse(url)

    received, reports, meter = run(scenario())
    assert received == [body, body]
    assert reports == {r: (1 if r == result else 0)
                       for r in ("recorded", "no_usage", "invalid", "left_pool")}
    assert meter == ((150, 200) if result == "recorded" else (0, 0))


async def _kept_turn_while(meanwhile: Callable[[Fleet, str], None]) -> tuple[Fleet, str]:
    """A conversation's third turn, kept on the first backend, with ``meanwhile`` done to
    that backend while the turn is in flight; the fleet after the relay has ended."""
    async with fleet(2, **REUSE) as f:
        first = f.router.table.servers[0]
        for ids in TURNS[:2]:
            await f.complete("conv", prompt=ids)
        f.stubs[0].options.delay = 0.3
        turn = asyncio.create_task(f.complete("conv", prompt=TURNS[2]))
        await wait_until(lambda: f.router.table.inflight(first) == 1, what="the turn")
        meanwhile(f, first)
        reply = await turn
        assert reply.status == 200 and reply.path == "kept"
        await settle(f)
        return f, first


def test_a_report_from_a_backend_that_left_the_pool_meanwhile_is_dropped() -> None:
    def leave(f: Fleet, first: str) -> None:
        for _ in range(3):  # three failed health checks in a row: out of the pool
            f.router.probed(first, False)
        assert not f.router.table.is_active(first)

    f, first = run(_kept_turn_while(leave))
    assert _reports(f, first) == {"recorded": 1, "no_usage": 0, "invalid": 0,
                                  "left_pool": 1}
    assert f.router.proxy.reuse is not None
    assert f.router.proxy.reuse.meter.reuse(first) == (0, 0)  # forgotten, not restarted


def test_corrupt_huge_counts_are_invalid_and_status_still_answers() -> None:
    """Found by a new user: eleven kept turns each reporting 4,299-digit counts were recorded; the
    sums grew past the 4,300 digits Python formats, and GET /status answered 500 with a
    traceback in the log (and the meter's ratio was that report's, for good)."""
    huge = 9 * 10**4299
    body = _json_body({"prompt_tokens": huge, "prompt_tokens_details": {"cached_tokens": huge}})

    async def scenario() -> tuple[dict[str, float], tuple[int, int], int]:
        async with _fake(body, "application/json") as url, \
                router_over([url], **REUSE) as router, aiohttp.ClientSession() as client:
            base = f"http://127.0.0.1:{router.port}"
            for _ in range(12):
                async with client.post(base + "/v1/completions",
                                       json={"model": "m", "prompt": [1] * 200},
                                       headers={"x-session-id": "s"}) as resp:
                    assert resp.status == 200 and await resp.read() == body
            await wait_until(lambda: router.active_requests == 0, what="the relay to end")
            async with client.get(base + "/status") as resp:
                status = resp.status
            assert router.proxy.reuse is not None
            return _reports(router, url), router.proxy.reuse.meter.reuse(url), status

    reports, meter, status = run(scenario())
    assert reports == {"recorded": 0, "no_usage": 0, "invalid": 11, "left_pool": 0}
    assert meter == (0, 0) and status == 200


def test_a_report_from_before_a_backend_left_and_returned_is_dropped() -> None:
    """Found by a new user: a kept turn in flight while its backend left the pool and came back was
    recorded into the returning backend's fresh sums (R-BAND-6: a server that leaves loses
    its sums; the turn measured the cache it had before it left)."""
    def leave_and_return(f: Fleet, first: str) -> None:
        for _ in range(3):  # out of the pool: its sums are forgotten
            f.router.probed(first, False)
        assert f.router.table.add(first)  # and back (a passing check would do this)

    f, first = run(_kept_turn_while(leave_and_return))
    assert _reports(f, first) == {"recorded": 1, "no_usage": 0, "invalid": 0,
                                  "left_pool": 1}
    assert f.router.proxy.reuse is not None
    assert f.router.proxy.reuse.meter.reuse(first) == (0, 0)  # still fresh
