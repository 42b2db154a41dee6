"""The inner loop (docs/inner-loop.md): ``make check`` runs what the page says, and the
pre-commit configuration fetches nothing beyond PyPI."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_check_runs_lint_types_then_fast_tests_and_small_proofs_side_by_side() -> None:
    dry = subprocess.run(["make", "-n", "check", "VENV=/v"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert dry[0] == "/v/bin/python -m ruff check ."
    assert dry[1].startswith("/v/bin/python -m mypy affinity_core ")
    # then one make with two jobs, whose two recipes may print in either order
    assert dry[2].split() == ["make", "--no-print-directory", "-j2", "--output-sync=target",
                              "test-fast", "proofs-small"]
    verify = "/v/bin/python -m affinity_cli.main verify --scope small"
    side_by_side = set(dry[3:])
    assert len(dry) == 5 and verify in side_by_side, dry
    (tests,) = side_by_side - {verify}
    assert tests.startswith("/v/bin/python -m pytest ")
    assert tests.endswith(" tests/core tests/conformance")
    assert '-m "not slow and not ray and not vllm and not peers and not compiled"' in tests


def test_the_recorded_timing_is_of_the_steps_make_check_runs() -> None:
    """docs/inner-loop.json (rendered into docs/inner-loop.md) times what `make check` runs,
    and says it is under the two minutes the page promises."""
    record = json.loads((ROOT / "docs" / "inner-loop.json").read_text(encoding="utf-8"))
    steps = record["make_check"]["steps"]
    assert [s["step"] for s in steps] == ["lint", "typecheck",
                                          "test-fast and proofs-small, side by side"]
    total = record["make_check"]["seconds"]
    assert abs(total - sum(s["seconds"] for s in steps)) < 0.2
    assert total <= 120, f"make check was recorded at {total} s, over two minutes"


def test_pre_commit_uses_local_hooks_only() -> None:
    # Read as text: pyyaml is not in the tests extra.
    lines = [ln.strip() for ln in (ROOT / ".pre-commit-config.yaml").read_text(
        encoding="utf-8").splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert [ln for ln in lines if ln.startswith("- repo:")] == ["- repo: local"]
    assert [ln for ln in lines if ln.startswith("- id:")] == ["- id: ruff", "- id: mypy"]
    assert "entry: make typecheck" in lines
    docs = (ROOT / "docs" / "inner-loop.md").read_text(encoding="utf-8")
    assert "make check" in docs and "AFFINITY_OPT_OUT" in docs
