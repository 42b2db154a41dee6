"""The one skip policy for the tiers (tests/conftest.py).

A tier whose environment is missing skips outside CI, with the tier and the reason; under
``CI=true`` it fails unless opted out by name (``AFFINITY_OPT_OUT``), and the terminal
summary lists every tier that did not run. Checked on the ``vllm`` tier, whose probe is an
environment variable, in a pytest run of its own that uses this repository's conftest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
TIER_TEST = """
import pytest

@pytest.mark.vllm
def test_needs_vllm():
    assert True

def test_plain():
    assert True

@pytest.fixture
def ray_cluster():
    yield

def test_on_ray(ray_cluster):
    assert True
"""


@pytest.fixture
def tiers(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makeini("[pytest]\naddopts = --strict-markers\nmarkers =\n    vllm: v\n    ray: r\n")
    pytester.makepyfile(test_tiers=TIER_TEST)
    for var in ("CI", "AFFINITY_OPT_OUT", "AFFINITY_VLLM_PYTHON", "AFFINITY_ALLOW_NO_VLLM"):
        monkeypatch.delenv(var, raising=False)
    return pytester


def test_outside_ci_a_missing_tier_skips_with_the_reason(tiers: pytest.Pytester) -> None:
    run = tiers.runpytest_subprocess("-rs")
    run.assert_outcomes(passed=2, skipped=1)
    run.stdout.fnmatch_lines(["*tiers not run*", "vllm: skipped outside CI: *",
                              "*tier 'vllm' skipped outside CI: AFFINITY_VLLM_PYTHON is not set*"])


def test_under_ci_a_missing_tier_fails(tiers: pytest.Pytester,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    run = tiers.runpytest_subprocess()
    run.assert_outcomes(passed=2, errors=1)  # failed in setup, before any fixture
    run.stdout.fnmatch_lines(["*tier 'vllm' is missing under CI=true*AFFINITY_OPT_OUT=vllm*",
                              "*tiers not run*", "vllm: FAILED under CI: *"])


@pytest.mark.parametrize("opt_out", [("AFFINITY_OPT_OUT", "peers, vllm"),
                                     ("AFFINITY_ALLOW_NO_VLLM", "1")])
def test_under_ci_an_opted_out_tier_skips_and_is_listed(
        tiers: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, opt_out: tuple[str, str]) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv(*opt_out)
    run = tiers.runpytest_subprocess()
    run.assert_outcomes(passed=2, skipped=1)
    run.stdout.fnmatch_lines(["*tiers not run*", "vllm: opted out by AFFINITY_OPT_OUT: *"])


def test_a_present_tier_runs_under_ci(tiers: pytest.Pytester,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("AFFINITY_VLLM_PYTHON", sys.executable)
    run = tiers.runpytest_subprocess()
    run.assert_outcomes(passed=3)
    assert "tiers not run" not in run.stdout.str()


def test_an_unknown_opt_out_is_a_usage_error(tiers: pytest.Pytester,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AFFINITY_OPT_OUT", "vllm,gpu")
    run = tiers.runpytest_subprocess()
    assert run.ret == pytest.ExitCode.USAGE_ERROR
    assert "'gpu' is not a tier" in run.stderr.str() and "peers" in run.stderr.str()


def test_tests_on_the_ray_cluster_carry_the_ray_marker(tiers: pytest.Pytester) -> None:
    run = tiers.runpytest_subprocess("-m", "not ray and not vllm")
    run.assert_outcomes(passed=1, deselected=2)
