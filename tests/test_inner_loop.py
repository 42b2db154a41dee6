"""The inner loop (docs/inner-loop.md): ``make check`` runs what the page says, and the
pre-commit configuration fetches nothing beyond PyPI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_check_runs_lint_types_fast_tests_and_small_proofs() -> None:
    dry = subprocess.run(["make", "-n", "check", "VENV=/v"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert dry[0] == "/v/bin/python -m ruff check ."
    assert dry[1].startswith("/v/bin/python -m mypy affinity_core ")
    assert "tests/core tests/conformance" in dry[2]
    assert '-m "not slow and not ray and not vllm and not peers and not compiled"' in dry[2]
    assert dry[3] == "/v/bin/python -m affinity_cli.main verify --scope small"


def test_pre_commit_uses_local_hooks_only() -> None:
    # Read as text: pyyaml is not in the tests extra.
    lines = [ln.strip() for ln in (ROOT / ".pre-commit-config.yaml").read_text(
        encoding="utf-8").splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert [ln for ln in lines if ln.startswith("- repo:")] == ["- repo: local"]
    assert [ln for ln in lines if ln.startswith("- id:")] == ["- id: ruff", "- id: mypy"]
    assert "entry: make typecheck" in lines
    docs = (ROOT / "docs" / "inner-loop.md").read_text(encoding="utf-8")
    assert "make check" in docs and "AFFINITY_OPT_OUT" in docs
