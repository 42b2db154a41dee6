"""The ``pytest11`` plugin: ``pytest --affinity-impl module:Class`` runs the vectors and
generated traces as tests, with ``affinity check``'s diagnosis on failure, and collects
nothing without ``--affinity-impl`` (it is loaded into every pytest run, ours included).
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "tests" / "conformance" / "broken_balancers.py"


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_entry_point_is_registered() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("affinity") == "affinity_conformance.pytest_plugin"


def test_without_impl_it_collects_nothing(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "-q")
    assert run.returncode == 5, run.stdout  # pytest's "no tests collected"
    assert "affinity" not in run.stdout
    helped = _pytest(tmp_path, "--help")
    assert "--affinity-impl=MODULE:CLASS" in helped.stdout and "--affinity-level" in helped.stdout


def test_a_conforming_class_passes_one_test_per_vector_and_trace(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "--affinity-impl", f"{BROKEN}:MiniBalancer",
                  "--affinity-tie-break", "first", "--affinity-traces", "12", "-v")
    assert run.returncode == 0, run.stdout[-3000:]
    assert re.search(r"^margin/boundary_is_inclusive PASSED", run.stdout, re.M)
    traces = re.findall(r"^trace/\w+/seed-(\d+) PASSED", run.stdout, re.M)
    assert sorted(map(int, traces)) == list(range(1, 13))  # seeded: seeds 1..12
    assert "affinity: " in run.stdout and "tie-break first" in run.stdout  # the header
    assert re.search(r"\d{3} passed", run.stdout)


def test_a_broken_class_fails_with_the_shrunk_diagnosis(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "--affinity-impl", f"{BROKEN}:StrictMarginBalancer",
                  "--affinity-tie-break", "first", "--affinity-level", "margin",
                  "--affinity-traces", "0", "--affinity-out", str(tmp_path / "out"), "-q")
    assert run.returncode == 1
    assert "FAILED margin/boundary_is_inclusive" in run.stdout
    assert "first divergence: step" in run.stdout and "[R-KEEP-1" in run.stdout
    assert "minimal trace (" in run.stdout and "Traceback" not in run.stdout
    assert any((tmp_path / "out").glob("check_margin_*.json"))
    legacy = _pytest(tmp_path, "--affinity-impl", f"{BROKEN}:StrictMarginBalancer",
                     "--affinity-tie-break", "first", "--affinity-level", "core",
                     "--affinity-traces", "5", "-q")
    assert legacy.returncode == 0, legacy.stdout[-2000:]  # its core level is fine


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "--affinity-impl", "no_such_module_xyz:Balancer")
    assert run.returncode == 4 and "no_such_module_xyz" in run.stderr
    level = _pytest(tmp_path, "--affinity-impl", f"{BROKEN}:MiniBalancer",
                    "--affinity-level", "gold")
    assert level.returncode == 4 and "'gold'" in level.stderr and "strict-config" in level.stderr
