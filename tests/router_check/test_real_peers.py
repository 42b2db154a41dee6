"""``affinity check-router`` against the real Rust routers from PyPI.

vllm-router 0.1.17 and sglang-router 0.3.2 run from ``.venv-routers`` (scripts/test.sh
creates it; without it these tests skip outside CI and fail under CI, tier ``peers`` of the
skip policy in tests/conftest.py). Each check runs twice, the second
time with every settle doubled, and the verdict and the kinds of divergence must agree:
the waits suffice. The findings asserted here are the ones docs/check-router.md explains.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affinity_cli.main import main

pytestmark = pytest.mark.peers  # tests/conftest.py: skipped or failed when the venv is missing


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str,
                                                                                      object]]:
    reports = []
    for factor in ("1", "2"):
        code = main(["check-router", *argv, "--settle-factor", factor, "--json",
                     "--out", str(tmp_path / f"f{factor}")])
        captured = capsys.readouterr()
        assert captured.out.strip(), f"check-router exited {code} without a report: {captured.err}"
        report = json.loads(captured.out)
        assert code == (1 if report["verdict"] == "fail" else 0)
        reports.append(report)
    assert reports[0]["verdict"] == reports[1]["verdict"]
    kinds = [{tuple(f["requirements"]) for f in r["failures"]} for r in reports]
    assert kinds[0] == kinds[1], kinds
    return reports


def test_vllm_router_sticky_least_loaded_counts_sessions_not_requests(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Fixed fleet ports: vllm-router's rendezvous hash covers the worker URLs, so with
    # them fixed the router is deterministic and both settles must find the same
    # divergence: the same step, the same choice, the same loads. The shrunk traces are
    # compared only as a diagnostic: one run of the router that passes where it should
    # fail (seen once in CI) changes which candidates the shrinker keeps, while the
    # finding stays the same. The ports sit below Linux's ephemeral range (32768-60999),
    # which any outgoing connection on the machine may be holding a port of at that moment.
    reports = _run(tmp_path, capsys, "--preset", "vllm-router:sticky_least_loaded",
                   "--policy", "legacy", "--no-failures", "--no-pool-changes", "--budget", "1",
                   "--seed", "4", "--length", "12", "--max-failures", "1",
                   "--fleet-ports", "30311,30312,30313")
    findings = []
    for report in reports:
        assert report["verdict"] == "fail"
        failure = report["failures"][0]  # type: ignore[index]
        assert failure["confirmed_on_rerun"], report["notes"]
        assert "R-PLACE-1" in failure["requirements"]
        assert any("sessions placed per backend" in v for v in failure["consistent_load_views"])
        assert not any("(the spec)" in v for v in failure["consistent_load_views"])
        assert failure["minimal_trace"][-1] == failure["op"]
        assert len(failure["minimal_trace"]) < failure["original_length"]
        findings.append((failure["op"], failure["diagnosis"], failure["loads_before"]))
    assert findings[0] == findings[1], [(r["notes"], r["failures"]) for r in reports]


def test_sglang_router_manual_places_new_keys_at_random(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Random placement: a new key lands on a busy backend with probability >= 1/3 whenever
    # loads differ; 5 traces of 10 ops over 8 keys all conforming has odds below 1e-3.
    reports = _run(tmp_path, capsys, "--preset", "sglang-router:manual", "--policy", "legacy",
                   "--no-failures", "--no-streams", "--budget", "5", "--length", "10",
                   "--sessions", "8", "--shrink-runs", "1", "--max-failures", "1")
    for report in reports:
        assert report["verdict"] == "fail"
        failure = report["failures"][0]  # type: ignore[index]
        assert "R-PLACE-1" in failure["requirements"]
        settle = report["settle"]
        assert isinstance(settle, dict) and settle["mode"] == "smg"
