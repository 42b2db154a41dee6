"""Claims, traces and the command's bad-input handling (no router started)."""

from __future__ import annotations

import pytest

from affinity_cli.main import main
from affinity_conformance.router_check.claims import ClaimError, parse_claim
from affinity_conformance.router_check.presets import PresetError, expand, parse_template
from affinity_conformance.router_check.trace import TraceShape, describe, generate


def test_claims() -> None:
    assert parse_claim("margin=2").config.affinity_break_margin == 2
    assert parse_claim("legacy").config.affinity_break_margin is None
    assert parse_claim("deterministic").deterministic
    for bad, words in (("margin=-1", "got -1"), ("margin=x", "got 'x'"), ("gate", "got 'gate'")):
        with pytest.raises(ClaimError, match=words):
            parse_claim(bad)


def test_traces_are_reproducible_and_well_formed() -> None:
    shape = TraceShape(pool_percent=20)
    ops = generate(7, shape)
    assert ops == generate(7, shape) and ops != generate(8, shape)
    acquired: set[int] = set()
    for op in ops:
        if op.kind == "acquire":
            acquired.add(op.ident)
        elif op.kind == "release":
            assert op.ident in acquired, describe(op)
    assert {op.kind for op in ops} >= {"acquire", "release"}


def test_templates() -> None:
    cmd = expand(("run", "--port", "{port}", "--b={backend}", "{backends}"), port=5,
                 metrics_port=6, backends=["u1", "u2"], routers=__import__("pathlib").Path("v"),
                 margin=None)
    assert cmd == ["run", "--port", "5", "--b=u1", "--b=u2", "u1", "u2"]
    with pytest.raises(PresetError, match=r"must contain \{port\}"):
        parse_template("router {backends}")
    with pytest.raises(PresetError, match="unknown or malformed placeholder"):
        expand(("{nope}",), port=1, metrics_port=2, backends=[], routers=__import__(
            "pathlib").Path("v"), margin=1)


@pytest.mark.parametrize(("argv", "words"), [
    (["--preset", "affinity", "--policy", "margin=-3"], "margin must be an integer >= 0, got -3"),
    (["--router-cmd", "x --port {port}"], "must contain {backends} or {backend}"),
    (["--router-cmd", "x {port} {backends}"], "--router-cmd needs --policy"),
    (["--url", "http://127.0.0.1:9", "--policy", "legacy"], "--url needs --fleet-ports"),
    (["--preset", "affinity", "--router-cmd", "x {port} {backends}"], "exactly one of"),
])
def test_bad_input_exits_2_with_a_message(argv: list[str], words: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-router", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_help_documents_presets_and_settle(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["check-router", "--help"])
    out = capsys.readouterr().out
    for words in ("vllm-router:sticky_least_loaded", "sglang-router:manual", "--settle-factor",
                  "--policy", "{backends}"):
        assert words in out
