"""``affinity check-router`` with the context band claim (SPEC §7.5, R-BAND-1, R-BAND-2).

Pure parts first (claim, traces, request bodies, explanations; no router), then three
checks against ``affinity serve`` on the stub fleet, each a few seconds:

* ``affinity serve`` started with the band passes ``--policy band=0,16,3``, and the run
  met hits that only the band keeps (so the pass is not vacuous);
* ``affinity serve`` with only the margin fails the same claim, with a divergence naming
  R-BAND-1, written as a vector whose acquires carry ``context_tokens`` (negative control);
* vice versa, ``affinity serve`` with the band fails the plain claim ``margin=0`` when the
  trace carries contexts (``--context-step 16``): it keeps pins the margin breaks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from affinity_vllm.context import estimate_tokens, token_ids_length

from affinity_cli.main import main
from affinity_conformance.router_check.claims import ClaimError, parse_claim
from affinity_conformance.router_check.explain import explain_choice
from affinity_conformance.router_check.fleet import _correlation_id
from affinity_conformance.router_check.harness import request_body
from affinity_conformance.router_check.presets import expand
from affinity_conformance.router_check.trace import TraceShape, describe, generate
from affinity_conformance.vector_format import EventStep, load_case
from affinity_engine import Acquire, Config, Release, State, draw_for, initial_state, step

COMMON = ["--budget", "2", "--length", "16", "--shrink-runs", "12", "--max-failures", "1",
          "--json"]
SERVE_MARGIN_ONLY = ("{python} -m affinity_cli.main serve --host 127.0.0.1 --port {port} "
                     "--backend={backend} --margin {margin} --log-level WARNING")


def test_band_claim_parses_and_refuses_out_of_range_values() -> None:
    claim = parse_claim(" band = 1, 16, 4 ")
    config = claim.config
    assert claim.band and not claim.deterministic
    assert (config.affinity_break_margin, config.affinity_break_tokens,
            config.affinity_break_band_cap) == (1, 16, 4)
    assert not parse_claim("margin=1").band
    for bad, words in (("band=0,16", "three integers"),
                       ("band=-1,16,3", "band margin M must be an integer >= 0, got -1"),
                       ("band=0,0,3", "band tokens T must be an integer >= 1, got 0"),
                       ("band=0,x,3", "band tokens T must be an integer >= 1, got 'x'"),
                       ("band=2,16,1", "band cap CAP must be an integer >= 2, got 1"),
                       ("band=0,16,0", "band cap CAP must be an integer >= 1, got 0")):
        with pytest.raises(ClaimError, match=words):
            parse_claim(bad)


def test_band_traces_give_each_acquire_a_context_around_the_steps() -> None:
    tokens = 16
    contexts = []
    for seed in range(1, 30):
        ops = generate(seed, TraceShape(band_tokens=tokens))
        assert ops == generate(seed, TraceShape(band_tokens=tokens))
        contexts += [op.context for op in ops if op.kind == "acquire"]
        assert all(op.context is None for op in ops if op.kind != "acquire")
    assert all(c is not None and 0 <= c < 6 * tokens for c in contexts)
    values = [c for c in contexts if c is not None]
    assert 0 in values and 5 * tokens in values            # both ends of the band's steps
    assert any(c % tokens == tokens - 1 for c in values)   # one short of a step: rounding
    assert any(0 < c % tokens < tokens - 1 for c in values)
    plain = generate(1, TraceShape())
    assert all(op.context is None for op in plain)  # no band: text prompts, no c
    first = next(op for op in generate(1, TraceShape(band_tokens=tokens)) if op.context)
    assert f"c={first.context}" in describe(first)


@pytest.mark.parametrize("context", [0, 1, 79])
def test_request_body_lets_the_router_count_c_exactly(context: int) -> None:
    body = request_body("r7-3", False, context)
    prompt = body["prompt"]
    assert isinstance(prompt, list) and len(prompt) == context
    assert _correlation_id(body) == "r7-3"  # the fleet still sees which request arrived
    # what affinity serve counts (adapters/affinity_vllm/context.py): the ids exactly; an
    # empty list carries neither ids nor text, so the estimate is 0 = c as well
    counted = token_ids_length(body, chat=False)
    assert (counted if counted is not None else estimate_tokens(body, chat=False)) == context
    assert isinstance(request_body("x", True, None)["prompt"], str)


def test_band_placeholders_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    cmd = expand(("r", "--port", "{port}", "{backends}", "--t", "{band_tokens}", "--cap",
                  "{band_cap}"), port=5, metrics_port=6, backends=["u"], routers=Path("v"),
                 margin=0, band=(16, 3))
    assert cmd == ["r", "--port", "5", "u", "--t", "16", "--cap", "3"]
    assert expand(("{band_tokens}",), port=1, metrics_port=2, backends=[], routers=Path("v"),
                  margin=None) == ["none"]
    with pytest.raises(SystemExit):
        main(["check-router", "--help"])
    out = capsys.readouterr().out
    for words in ("band=M,T,CAP", "--context-step", "{band_tokens}", "--affinity-break-tokens",
                  "no context band"):
        assert words in out, words
    assert main(["check-router", "--preset", "affinity", "--policy", "band=3,16,2"]) == 2
    err = capsys.readouterr().err
    assert "band cap CAP must be an integer >= 3, got 2" in err and "Traceback" not in err


def _state(config: Config, placements: list[str], releases: list[str],
           loads: dict[str, int]) -> State:
    """'s' pinned to the first placement, unkeyed requests on the others, then releases."""
    state = initial_state(config, ["b0", "b1", "b2"])
    for i, server in enumerate(placements):
        fed = draw_for(config, state, Acquire(request_id="s" if i == 0 else None), server)
        assert fed is not None, (i, server)
        state = step(config, state, fed).state
    for server in releases:
        state = step(config, state, Release(server_id=server)).state
    assert dict(state.pool.items()) == loads
    return state


def test_band_divergences_are_explained_with_r_band_1_and_r_band_2() -> None:
    keep = parse_claim("band=0,16,3").config
    # 's' pinned to b0 at load 2, min 1: c = 79 gives band 3, so the pin is kept
    state = _state(keep, ["b0", "b1", "b2", "b0"], [], {"b0": 2, "b1": 1, "b2": 1})
    event = Acquire(request_id="s", context_tokens=79)
    text, reqs, _ = explain_choice(keep, state, event, "b1", ("b0", "b1", "b2"),
                                   frozenset({"b0"}), {}, {}, {})
    assert reqs[0] == "R-BAND-1" and "R-LRU-2" not in reqs, reqs
    assert "min(0 + 79 // 16, 3)" in text and "without the context band (margin 0)" in text
    capped = parse_claim("band=0,16,1").config
    # 's' pinned to b0 at load 3, min 1: m + c // T = 2 > cap 1, so the pin must move
    state = _state(capped, ["b0", "b1", "b2"] * 3, ["b1", "b2"] * 2,
                   {"b0": 3, "b1": 1, "b2": 1})
    event = Acquire(request_id="s", context_tokens=33)
    text, reqs, _ = explain_choice(capped, state, event, "b0", ("b0", "b1", "b2"),
                                   frozenset({"b1", "b2"}), {}, {}, {})
    assert reqs[:2] == ["R-BAND-2", "R-BAND-1"] and "exceeds the cap 1" in text, (text, reqs)


def _check(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str],
           *argv: str) -> tuple[int, dict[str, object]]:
    code = main(["check-router", *argv, *COMMON, "--out", str(tmp_path / name)])
    captured = capsys.readouterr()
    assert captured.out.strip(), f"check-router exited {code} without a report: {captured.err}"
    report = json.loads(captured.out)
    assert isinstance(report, dict)
    return code, report


def test_affinity_serve_with_the_band_conforms_to_the_band_claim(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _check(tmp_path, "pass", capsys, "--preset", "affinity",
                          "--policy", "band=0,16,3")
    assert code == 0 and report["verdict"] == "pass", report
    command = " ".join(report["command"])  # type: ignore[arg-type]
    assert "--margin 0 " in command
    assert "--affinity-break-tokens 16 --affinity-break-band-cap 3" in command
    band = report["band_decisions"]
    assert isinstance(band, dict) and band["kept_by_band"] >= 1, band  # not vacuous


def test_margin_only_serve_fails_the_band_claim_naming_r_band_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _check(tmp_path, "fail", capsys, "--router-cmd", SERVE_MARGIN_ONLY,
                          "--policy", "band=0,16,3")
    assert code == 1 and report["verdict"] == "fail"
    failure = report["failures"][0]  # type: ignore[index]
    assert failure["requirements"][0] == "R-BAND-1", failure
    assert "without the context band (margin 0)" in failure["diagnosis"]
    assert failure["confirmed_on_rerun"] is True
    case = load_case(Path(failure["vector"]))
    assert "R-BAND-1" in case.requirements and "context_band" in case.features
    events = [s.event for s in case.steps if isinstance(s, EventStep)]
    assert any(isinstance(e, Acquire) and e.context_tokens for e in events)


def test_serve_with_the_band_fails_a_plain_margin_claim(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _check(tmp_path, "vice", capsys, "--preset", "affinity", "--router-extra",
                          "--affinity-break-tokens 16 --affinity-break-band-cap 3",
                          "--policy", "margin=0", "--context-step", "16")
    assert code == 1 and report["verdict"] == "fail"
    failure = report["failures"][0]  # type: ignore[index]
    assert "R-KEEP-1" in failure["requirements"]
    assert "a router with a context band" in failure["diagnosis"]
