"""The context band through ``affinity serve`` (SPEC §7.5): where ``c`` comes from.

Fast tier, stub backends. The skew scenario: two backends, ``tie_break first``, margin
0, T = 100 tokens, cap 3. "hog" and "conv" are pinned to the first backend; a slow
"hog" turn holds it at load 1 while the other idles; then "conv" sends a turn. It is kept
iff its band ``min(0 + c // 100, 3)`` is at least 1, i.e. iff ``c >= 100`` -- so the path
("kept" or "broken") shows which ``c`` the router computed, and the decision log shows
the value itself.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from affinity_vllm.cli import options_from_args
from affinity_vllm.context import BYTES_PER_TOKEN, estimate_tokens, token_ids_length
from affinity_vllm.options import OptionsError, RouterOptions
from affinity_vllm.stub import StubServer
from aiohttp import web

from affinity_cli.main import build_parser, main
from affinity_conformance.decision_log import read_log

from .fleet import Fleet, Reply, fleet, run, wait_until

ROOT = Path(__file__).resolve().parents[2]

BAND: dict[str, Any] = {"margin": 0, "affinity_break_tokens": 100,
                        "affinity_break_band_cap": 3, "tie_break": "first"}


# ------------------------------------------------------------------ pure functions
@pytest.mark.parametrize(("payload", "chat", "length"), [
    ({"prompt": [5] * 150}, False, 150),
    ({"prompt": [[1] * 80, [2] * 70]}, False, 150),  # a batch: every prompt is prefilled
    ({"prompt": [[], [3]]}, False, 1),
    ({"prompt": "text"}, False, None),
    ({"prompt": ["a", "b"]}, False, None),
    ({"prompt": []}, False, None),
    ({"prompt": [True, 1]}, False, None),  # booleans are not token ids
    ({}, False, None),
    ({"messages": [], "kv_transfer_params": {"prompt_token_ids": [1] * 90}}, True, 90),
    ({"messages": [], "kv_transfer_params": {"other": 1}}, True, None),
    ({"messages": [], "prompt": [1] * 50}, True, None),  # not a chat field in vLLM
])
def test_token_ids_are_counted_when_the_request_carries_them(
    payload: dict[str, Any], chat: bool, length: int | None
) -> None:
    assert token_ids_length(payload, chat) == length


@pytest.mark.parametrize(("payload", "chat", "tokens"), [
    ({"prompt": "a" * 400}, False, 100),
    ({"prompt": "a" * 399}, False, 99),
    ({"prompt": "日本語" * 100}, False, 225),  # 900 UTF-8 bytes: bytes, not characters
    ({"prompt": ["a" * 200, "b" * 200]}, False, 100),  # a batch of texts: summed
    ({"messages": [{"role": "system", "content": "s" * 100},
                   {"role": "user", "content": [{"type": "text", "text": "u" * 300},
                                                {"type": "image_url", "image_url": {}}]}]},
     True, 100),  # text parts only; images count 0
    ({"messages": "not a list"}, True, 0),
    ({"prompt": 42}, False, 0),
])
def test_the_estimate_is_utf8_bytes_over_four(
    payload: dict[str, Any], chat: bool, tokens: int
) -> None:
    assert BYTES_PER_TOKEN == 4
    assert estimate_tokens(payload, chat) == tokens


# ------------------------------------------------------------------------ options
@pytest.mark.parametrize(("argv", "message"), [
    (["--margin", "1", "--affinity-break-tokens", "0", "--affinity-break-band-cap", "2"],
     "--affinity-break-tokens must be null or an integer >= 1, got 0 (int)"),
    (["--margin", "2", "--affinity-break-tokens", "100", "--affinity-break-band-cap", "1"],
     "--affinity-break-band-cap must be an integer >= --margin (2), got 1"),
    (["--margin", "1", "--affinity-break-tokens", "100"], "are set together"),
    (["--affinity-break-tokens", "100", "--affinity-break-band-cap", "2"],
     "--margin, which is null; set the margin too"),
])
def test_bad_band_options_fail_at_startup(argv: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--backend", "http://h:1", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--affinity-break-tokens", "--affinity-break-band-cap"])
@pytest.mark.parametrize("value", ["1.5", "nan", "abc", ""])
def test_a_band_value_that_is_no_integer_names_the_range(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Found by a new user: argparse said "invalid int value: '1.5'", naming no accepted range.
    argv = ["--margin", "1", "--affinity-break-tokens", "100", "--affinity-break-band-cap", "2"]
    argv[argv.index(flag) + 1] = value
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--backend", "http://h:1", *argv])
    assert exc.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.endswith(f"argument {flag}: {flag} must be 'none' or an integer >= 1, "
                         f"got {value!r}")


def test_none_is_off_as_the_message_for_zero_says() -> None:
    # Found by a new user: "--affinity-break-tokens must be null or an integer >= 1, got 0", and
    # then "--affinity-break-tokens null" was refused.
    args = build_parser(["serve"]).parse_args(
        ["serve", "--backend", "http://h:1", "--margin", "1", "--affinity-break-tokens",
         "null", "--affinity-break-band-cap", "None"])
    options = options_from_args(args)
    assert options.affinity_break_tokens is None and options.affinity_break_band_cap is None
    assert not options.core_config().context_band


def test_the_readmes_example_of_a_bad_band_is_the_real_message(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Found by a new user: the README quoted the core's option names (affinity_break_band_cap ...
    # affinity_break_margin); the router prints its flags.
    text = " ".join((ROOT / "adapters/affinity_vllm/README.md").read_text().split())
    match = re.search(r"e\.g\. `affinity serve (--margin [^`]*?) \.\.\.` prints `([^`]*)`", text)
    assert match is not None
    assert main(["serve", "--backend", "http://h:1", *match.group(1).split()]) == 2
    assert capsys.readouterr().err.strip() == match.group(2)


def test_bad_context_mode_is_refused() -> None:
    with pytest.raises(OptionsError, match="context_tokens must be one of estimate, "
                       "tokenize, off, got 'guess'"):
        RouterOptions(backends=("http://h:1",), context_tokens="guess")
    with pytest.raises(SystemExit):
        main(["serve", "--backend", "http://h:1", "--context-tokens", "guess"])


# ------------------------------------------------------------------ through the router
def _contexts(log: Path) -> list[int | None]:
    return [r.data["event"].get("context_tokens") for r in read_log(log)
            if not r.is_header and r.data["event"]["op"] == "acquire"]


async def _conv_turn_under_skew(f: Fleet, path: str, body: dict[str, Any]) -> Reply:
    """"hog" and "conv" pinned to backend 0, a slow hog turn holding it, then conv."""
    first = f.router.table.servers[0]
    for key in ("hog", "conv"):
        assert (await f.complete(key, prompt="hi")).backend == first
    f.stubs[0].options.delay = 0.4
    hog = asyncio.create_task(f.complete("hog", prompt="hi"))
    await wait_until(lambda: f.router.table.inflight(first) == 1, what="the hog in flight")
    reply = await f.post(path, {"model": "tiny", "max_tokens": 2, **body}, "conv")
    assert (await hog).path == "kept"
    assert reply.status == 200, reply.body
    return reply


def _scenario(tmp_path: Path, path: str, body: dict[str, Any], **options: Any
              ) -> tuple[Reply, list[int | None], dict[str, Any], str]:
    log = tmp_path / "router.ndjson"

    async def scenario() -> tuple[Reply, list[int | None], dict[str, Any], str]:
        async with fleet(2, **{**BAND, "decision_log": str(log), **options}) as f:
            reply = await _conv_turn_under_skew(f, path, body)
            status = await f.get_json("/status")
            metrics = await f.metrics_text()
            f.assert_idle()
        return reply, _contexts(log), status, metrics
    return run(scenario())


COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.mark.parametrize(("path", "body", "context", "kept"), [
    (COMPLETIONS, {"prompt": [7] * 150}, 150, True),  # ids: exact
    (COMPLETIONS, {"prompt": [7] * 99}, 99, False),
    (COMPLETIONS, {"prompt": [[7] * 60, [8] * 60]}, 120, True),
    (COMPLETIONS, {"prompt": "x" * 400}, 100, True),  # text: 400 bytes / 4
    (COMPLETIONS, {"prompt": "x" * 399}, 99, False),
    (CHAT, {"messages": [{"role": "user", "content": "y" * 800}]}, 200, True),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}],
            "kv_transfer_params": {"prompt_token_ids": [1] * 100}}, 100, True),
])
def test_the_band_uses_the_requests_context(tmp_path: Path, path: str, body: dict[str, Any],
                                            context: int, kept: bool) -> None:
    reply, contexts, status, metrics = _scenario(tmp_path, path, body)
    assert reply.path == ("kept" if kept else "broken")
    # pinning turns "hi" (estimate 0), the hog's turn, then conv's: c as computed.
    assert contexts == [0, 0, 0, context]
    source = "ids" if isinstance(body.get("prompt"), list) or "kv_transfer_params" in body \
        else "estimate"
    assert status["context_band"]["sources"][source] >= 1
    assert status["context_band"]["context_tokens"] == "estimate"
    assert f'affinity_router_context_sources_total{{source="{source}"}}' in metrics


def test_tokenize_mode_asks_a_backend(tmp_path: Path) -> None:
    # The stub tokenizes text as its UTF-8 bytes: 150 tokens, where the estimate says 37.
    reply, contexts, status, _ = _scenario(tmp_path, COMPLETIONS, {"prompt": "z" * 150},
                                           context_tokens="tokenize")
    assert reply.path == "kept"
    assert contexts == [2, 2, 2, 150]
    assert status["context_band"]["sources"] == {
        "ids": 0, "estimate": 0, "tokenize": 4, "tokenize_fallback": 0}


@pytest.mark.parametrize("failure", ["status 500", "no count", "timeout"])
def test_tokenize_failures_fall_back_to_the_estimate_and_are_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    async def broken(self: StubServer, request: web.Request) -> web.Response:
        if failure == "timeout":
            await asyncio.sleep(2)
        if failure == "no count":
            return web.json_response({"tokens": []})
        return web.json_response({"error": "down"}, status=500)

    monkeypatch.setattr(StubServer, "_tokenize", broken)
    reply, contexts, status, metrics = _scenario(
        tmp_path, COMPLETIONS, {"prompt": "z" * 150}, context_tokens="tokenize",
        health_timeout=0.2)
    assert reply.status == 200 and reply.path == "broken"  # 150 bytes // 4 = 37 < 100
    assert contexts == [0, 0, 0, 37]
    assert status["context_band"]["sources"]["tokenize_fallback"] == 4
    assert 'affinity_router_context_sources_total{source="tokenize_fallback"} 4' in metrics


def test_off_mode_and_unbanded_routers_send_no_context(tmp_path: Path) -> None:
    reply, contexts, status, _ = _scenario(tmp_path, COMPLETIONS, {"prompt": [7] * 500},
                                           context_tokens="off")
    assert reply.path == "broken" and contexts == [None] * 4
    assert status["context_band"]["sources"] == dict.fromkeys(
        ("ids", "estimate", "tokenize", "tokenize_fallback"), 0)
    plain = tmp_path / "plain"
    plain.mkdir()
    reply, contexts, status, _ = _scenario(plain, COMPLETIONS, {"prompt": [7] * 500},
                                           affinity_break_tokens=None,
                                           affinity_break_band_cap=None)
    assert reply.path == "broken" and contexts == [None] * 4
    assert "context_band" not in status


def test_unkeyed_requests_are_not_counted(tmp_path: Path) -> None:
    async def scenario() -> dict[str, int]:
        async with fleet(2, **BAND) as f:
            assert (await f.complete(None, prompt=[1] * 300)).path == "unkeyed"
            assert f.router.context is not None
            return dict(f.router.context.sources)
    assert sum(run(scenario()).values()) == 0
