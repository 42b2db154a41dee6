"""Conformance levels in ``affinity check``: one verdict per level, exit status by claim.

verl 0.9.1's real class claims core and full_determinism (what its constructor accepts)
and passes them with its random ties; strict-config (the spec's construction refusals,
SPEC §18) is reported as six deviations and claimed only with ``--level strict-config``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from affinity_conformance.check import CheckReport, run_check
from affinity_conformance.shipped import shipped_vectors
from affinity_conformance.vector_format import LEVELS, levels_of, load_case, vector_files

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "tests" / "conformance" / "broken_balancers.py"
VERL = "verl.workers.rollout.router:GlobalRequestLoadBalancer"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "affinity_cli.main", "check", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def verl(tmp_path_factory: pytest.TempPathFactory) -> CheckReport:
    return run_check(VERL, budget=60, out_dir=tmp_path_factory.mktemp("verl"))


def test_every_vector_declares_its_levels() -> None:
    files = vector_files(shipped_vectors())
    assert len(files) > 200
    seen: set[str] = set()
    for path in files:
        case = load_case(path)
        assert list(case.levels) == levels_of(case.data), path
        seen |= set(case.levels)
    assert {"core", "strict-config", "margin", "full_determinism"} <= seen <= set(LEVELS)


def test_verl_levels(verl: CheckReport) -> None:
    assert verl.claimed == ["core", "full_determinism"]
    core = verl.level("core")
    assert core.verdict == "pass" and core.passed >= 70 and core.traces_passed > 0
    assert core.random_ties > 0  # verl's random.choice took other allowed servers
    strict = verl.level("strict-config")
    assert strict.verdict == "fail" and strict.failed == 6 and strict.passed > 0
    assert verl.level("margin").verdict == "unsupported"
    assert verl.verdict == "pass"


def test_verl_cli_exit_status_follows_the_claims(tmp_path: Path) -> None:
    default = _cli(VERL, "--budget", "20", cwd=tmp_path)
    assert default.returncode == 0, default.stdout + default.stderr
    assert re.search(r"core\s+yes\s+\d+/0/0\s+\S+\s+pass \(random ties\)", default.stdout)
    assert "strict-config (not claimed): 6 deviations (SPEC §18)" in default.stdout
    assert "verdict: pass -- core: pass (random ties); full_determinism: pass" in default.stdout
    strict = _cli(VERL, "--budget", "0", "--level", "core", "--level", "strict-config",
                  cwd=tmp_path)
    assert strict.returncode == 1
    assert "; strict-config: 6 deviations (SPEC §18)" in strict.stdout
    assert strict.stdout.count("verdict: FAIL -- core: pass") == 1
    margin = _cli(VERL, "--budget", "0", "--level", "margin", "--json", cwd=tmp_path)
    assert margin.returncode == 1  # a claimed level that cannot run does not pass
    data = json.loads(margin.stdout)
    assert data["claimed_levels"] == ["margin"] and data["verdict"] == "fail"
    assert data["levels"]["margin"]["verdict"] == "unsupported"
    bad = _cli(VERL, "--level", "gold", cwd=tmp_path)
    assert bad.returncode == 2 and "gold" in bad.stderr and "strict-config" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_failures_go_to_a_fresh_temporary_folder_by_default(tmp_path: Path) -> None:
    run = _cli(f"{BROKEN}:NoRefreshLruBalancer", "--tie-break", "first", "--budget", "0",
               "--suite", "eviction", cwd=tmp_path)
    assert run.returncode == 1
    found = re.search(r"traces written as vectors to (\S+) \(a fresh temporary folder", run.stdout)
    assert found, run.stdout
    folder = Path(found.group(1))
    assert folder.is_dir() and any(folder.glob("check_eviction_*.json"))
    assert not (tmp_path / "affinity-check-failures").exists()  # nothing in the cwd
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
