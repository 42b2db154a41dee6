"""``affinity check`` against real and deliberately broken implementations.

* verl 0.9.1's real class: every legacy-API suite passes with ``--tie-break any``; the
  margin-based suites are reported unsupported (not crashed); the validation suite fails
  exactly on the spec's documented deviations from verl (R-CFG-4 and friends); with
  ``--tie-break first`` its random ties are diagnosed as R-TIE-2.
* Affinity's own adapter passes every suite it can express.
* MiniBalancer (an independent spec implementation) passes with ``--tie-break first``.
* NoRefreshLruBalancer fails the eviction suite with R-LRU-2; StrictMarginBalancer fails
  the margin suite with R-KEEP-1 at the band's edge; MarginUnderDeterminismBalancer fails
  with R-DET-4 (not as an LRU bug); NoRepinBalancer with R-BREAK-1 (not as '<'). The
  failing minimal traces are written as vectors that the reference consumer replays.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from affinity_conformance.check import CheckReport, run_check
from affinity_conformance.vector_format import load_case
from affinity_conformance.vector_runner import run_case

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "tests" / "conformance" / "broken_balancers.py"
VERL = "verl.workers.rollout.router:GlobalRequestLoadBalancer"
ADAPTER = "affinity_verl:AffinityLoadBalancer"
LEGACY_API_SUITES = ("legacy", "eviction", "failover", "determinism")
MARGIN_SUITES = ("margin", "counters", "dual_threshold", "unkeyed")
VERL_DEVIATIONS = {"config_cache_zero", "config_cache_true", "config_cache_fraction",
                   "config_determinism_string", "config_determinism_integer",
                   "state_server_id_empty"}


def _failed_cases(report: CheckReport, suite: str) -> set[str]:
    return {f.origin.rsplit("/", 1)[-1].removesuffix(".json")
            for f in report.suites[suite].failures}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "affinity_cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def verl_any(tmp_path_factory: pytest.TempPathFactory) -> CheckReport:
    return run_check(VERL, tie_mode="any", budget=120, out_dir=tmp_path_factory.mktemp("v"))


def test_verl_passes_legacy_suites_with_random_ties(verl_any: CheckReport) -> None:
    for suite in LEGACY_API_SUITES:
        result = verl_any.suites[suite]
        assert result.verdict == "pass", (suite, result.failures)
        assert result.passed >= 5 and result.traces_passed > 0
    assert verl_any.suites["legacy"].unsupported == 0


def test_verl_margin_suites_are_unsupported_not_crashed(verl_any: CheckReport) -> None:
    for suite in MARGIN_SUITES:
        result = verl_any.suites[suite]
        assert result.verdict == "unsupported" and result.failed == 0
        assert result.unsupported > 0 and result.missing
    assert "margin" in verl_any.suites["margin"].missing


def test_verl_validation_fails_exactly_on_documented_deviations(verl_any: CheckReport) -> None:
    assert verl_any.suites["validation"].verdict == "fail"
    assert _failed_cases(verl_any, "validation") == VERL_DEVIATIONS
    ids = {r for f in verl_any.suites["validation"].failures
           for r in f.divergence.requirements}
    assert {"R-CFG-4", "R-CFG-2"} <= ids


def test_verl_first_mode_is_diagnosed_as_random_ties(tmp_path: Path) -> None:
    report = run_check(VERL, tie_mode="first", budget=0, out_dir=tmp_path,
                       suites=["legacy"])
    result = report.suites["legacy"]
    assert result.verdict == "fail"
    assert all("R-TIE-2" in f.divergence.requirements for f in result.failures)
    assert "--tie-break any" in result.failures[0].divergence.words


def test_adapter_passes_every_suite(tmp_path: Path) -> None:
    report = run_check(ADAPTER, tie_mode="any", budget=150, out_dir=tmp_path)
    assert report.verdict == "pass", [f.to_json() for r in report.suites.values()
                                      for f in r.failures]
    expressible = [s for s, r in report.suites.items() if r.verdict == "pass"]
    assert set(LEGACY_API_SUITES) | set(MARGIN_SUITES) | {"leases", "ties", "validation"} <= \
        set(expressible)
    assert report.suites["margin"].unsupported == 0
    assert list(tmp_path.iterdir()) == []  # no failure vectors written


def test_independent_mini_balancer_passes_first_mode(tmp_path: Path) -> None:
    report = run_check(f"{BROKEN}:MiniBalancer", tie_mode="first", budget=100,
                       out_dir=tmp_path)
    assert report.verdict == "pass"
    assert report.suites["margin"].passed >= 30 and report.suites["legacy"].passed >= 30


def test_no_refresh_lru_is_diagnosed(tmp_path: Path) -> None:
    report = run_check(f"{BROKEN}:NoRefreshLruBalancer", tie_mode="first", budget=100,
                       out_dir=tmp_path)
    assert report.suites["eviction"].verdict == "fail"
    assert report.suites["legacy"].verdict == "pass"
    assert report.suites["margin"].verdict == "unsupported"  # verl's constructor
    failures = report.suites["eviction"].failures
    assert all("R-LRU-2" in f.divergence.requirements for f in failures)
    named = [f for f in failures
             if f.origin.endswith("refresh_decides_which_session_survives.json")]
    assert named and len(named[0].trace) <= 5
    _assert_failure_vectors_replay(failures)


def test_strict_margin_is_diagnosed(tmp_path: Path) -> None:
    report = run_check(f"{BROKEN}:StrictMarginBalancer", tie_mode="first", budget=100,
                       out_dir=tmp_path)
    assert report.suites["margin"].verdict == "fail"
    for suite in ("legacy", "eviction", "failover"):
        assert report.suites[suite].verdict == "pass"
    failures = report.suites["margin"].failures
    assert all("R-KEEP-1" in f.divergence.requirements for f in failures)
    everywhere = [f for s in report.suites.values() for f in s.failures]
    assert all("'<' comparison" in f.divergence.words for f in everywhere)
    assert all("or, if IMPL compares with '<='" in f.divergence.words
               for f in everywhere if "did not re-pin" in f.divergence.words)
    boundary = [f for f in failures if f.origin.endswith("boundary_is_inclusive.json")]
    assert boundary and "band's edge" in boundary[0].divergence.words
    minimal = [f for f in failures if f.origin.endswith("band_margin1_kept.json")]
    assert minimal and minimal[0].trace == ("acquire('a')", "acquire('a')")
    _assert_failure_vectors_replay(failures)


def test_margin_under_full_determinism_is_diagnosed_as_r_det_4(tmp_path: Path) -> None:
    # Not "IMPL behaved as if 'a' had no sticky entry ... a lookup must refresh
    # recency" with R-LRU-2: the wrong rule, for a class whose LRU is right.
    # Which vectors catch it depends on hash(request_id) (caller mode, the class's own
    # process): counters/full_determinism_counts_kept does under every PYTHONHASHSEED.
    report = run_check(f"{BROKEN}:MarginUnderDeterminismBalancer", tie_mode="first",
                       budget=50, out_dir=tmp_path)
    assert report.levels["full_determinism"].verdict == "fail"
    failures = [f for s in report.suites.values() for f in s.failures]
    assert any(f.origin.endswith("full_determinism_counts_kept.json") for f in failures)
    for f in failures:
        words, reqs = f.divergence.words, f.divergence.requirements
        assert "under full_determinism the margin, the context band and the gate are " \
            "ignored" in words, words
        assert "R-DET-4" in reqs and "R-LRU-2" not in reqs and "sticky entry" not in words


def test_break_without_re_pin_is_diagnosed_as_r_break_1(tmp_path: Path) -> None:
    # Not "the pin sits exactly on the band's edge: a '<' comparison breaks
    # here, the spec's '<=' keeps": the wrong rule, for a class that compares with '<='.
    report = run_check(f"{BROKEN}:NoRepinBalancer", tie_mode="first", budget=50,
                       out_dir=tmp_path)
    assert report.suites["margin"].verdict == "fail"
    failures = [f for s in report.suites.values() for f in s.failures]
    assert failures and all("R-BREAK-1" in f.divergence.requirements for f in failures)
    # Where the spec's pin sits on the band's edge, a '<' would move it too: both named.
    definite = [f for f in failures if "or, if IMPL compares" not in f.divergence.words]
    assert definite
    for f in definite:
        assert "IMPL did not re-pin" in f.divergence.words
        assert "'<' comparison" not in f.divergence.words
        assert f.divergence.requirements[0] == "R-BREAK-1"


def _assert_failure_vectors_replay(failures: list) -> None:  # type: ignore[type-arg]
    paths = [f.vector_path for f in failures if f.vector_path]
    assert paths
    for path in paths:
        case = load_case(path)
        assert case.suite == "regressions" and case.source == "regression"
        assert run_case(case) is None


def test_cli_text_and_json_output(tmp_path: Path) -> None:
    text = _cli("check", f"{BROKEN}:StrictMarginBalancer", "--tie-break", "first",
                "--budget", "20", "--out", str(tmp_path), "--suite", "margin")
    assert text.returncode == 1, text.stderr
    assert "margin          FAIL" in text.stdout
    assert "first divergence: step 2 acquire('a')" in text.stdout
    assert "as a vector:" in text.stdout and "Traceback" not in text.stderr
    js = _cli("check", VERL, "--budget", "30", "--json", "--out", str(tmp_path),
              "--suite", "legacy", "--suite", "margin")
    assert js.returncode == 0, js.stderr
    data = json.loads(js.stdout)
    assert data["suites"]["legacy"]["verdict"] == "pass"
    assert data["suites"]["margin"]["verdict"] == "unsupported"
    assert data["tie_break"] == "any" and data["seed"] == 1


@pytest.mark.parametrize(("ctor", "margin_verdict"), [
    ("yaml", "pass"), ("pr7435", "pass"), ("verl", "unsupported")])
def test_constructor_conventions(tmp_path: Path, ctor: str, margin_verdict: str) -> None:
    """verl's plug-in path (servers, yaml_dict), PR #7435's keywords, verl's keywords."""
    report = run_check(ADAPTER, ctor=ctor, budget=20, out_dir=tmp_path,
                       suites=["legacy", "margin"])
    assert report.convention == ctor
    assert report.suites["legacy"].verdict == "pass"
    assert report.suites["margin"].verdict == margin_verdict


def test_factory_function_is_accepted(tmp_path: Path) -> None:
    factory = tmp_path / "factory.py"
    factory.write_text(
        "from affinity_verl import AffinityLoadBalancer\n\n"
        "def make(servers, max_cache_size=10000, **options):\n"
        "    return AffinityLoadBalancer(servers=servers, max_cache_size=max_cache_size,\n"
        "                                **options)\n")
    report = run_check(f"{factory}:make", budget=20, out_dir=tmp_path,
                       suites=["legacy", "margin"])
    assert report.verdict == "pass" and report.suites["margin"].passed >= 30
