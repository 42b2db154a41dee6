"""The ``pytest11`` plugin: ``pytest --affinity-impl module:Class`` runs the vectors and
generated traces as tests, with ``affinity check``'s diagnosis on failure, and collects
nothing without ``--affinity-impl`` (it is loaded into every pytest run, ours included).

The items are a real collection tree (``affinity::<suite>::<case>``,
``affinity::trace::<family>::seed-<n>``), so pytest's own machinery works on them: the
count after ``--co``, ids and prefixes on the command line, ``-m``/``--deselect``, JUnit
classnames, and failure artefacts under pytest's temporary directory. Runs are in-process
(``pytester.runpytest``) except where the entry point itself is the subject.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BROKEN = ROOT / "tests" / "conformance" / "broken_balancers.py"
MINI = ["--affinity-impl", f"{BROKEN}:MiniBalancer", "--affinity-tie-break", "first"]
STRICT_MARGIN = ["--affinity-impl", f"{BROKEN}:StrictMarginBalancer", "--affinity-tie-break",
                 "first", "--affinity-level", "margin", "--affinity-traces", "0"]


def _subprocess_pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_entry_point_is_registered() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("affinity") == "affinity_conformance.pytest_plugin"


def test_without_impl_it_collects_nothing(tmp_path: Path) -> None:
    run = _subprocess_pytest(tmp_path, "-q")
    assert run.returncode == 5, run.stdout  # pytest's "no tests collected"
    assert "affinity" not in run.stdout
    helped = _subprocess_pytest(tmp_path, "--help")
    assert "--affinity-impl=MODULE:CLASS" in helped.stdout and "--affinity-level" in helped.stdout
    # The marker is registered in every run, so a project may deselect it under
    # --strict-markers whether or not it passes --affinity-impl.
    marked = _subprocess_pytest(tmp_path, "-q", "--strict-markers", "-m", "not affinity")
    assert marked.returncode == 5, marked.stdout + marked.stderr


def test_a_conforming_class_passes_one_test_per_vector_and_trace(
        pytester: pytest.Pytester) -> None:
    run = pytester.runpytest(*MINI, "--affinity-traces", "12", "-v")
    assert run.ret == 0, run.stdout.str()[-3000:]
    out = run.stdout.str()
    assert re.search(r"^affinity::margin::boundary_is_inclusive PASSED", out, re.M)
    traces = re.findall(r"^affinity::trace::\w+::seed-(\d+) PASSED", out, re.M)
    assert sorted(map(int, traces)) == list(range(1, 13))  # seeded: seeds 1..12
    assert "affinity: " in out and "tie-break first" in out  # the header
    assert re.search(r"\d{3} passed", out)


def test_collect_only_counts_every_listed_id(pytester: pytest.Pytester) -> None:
    run = pytester.runpytest(*MINI, "--affinity-traces", "5", "--co", "-q")
    assert run.ret == 0, run.stdout.str()[-2000:]
    ids = [line for line in run.outlines if line.startswith("affinity::")]
    assert len(ids) > 200 and len(set(ids)) == len(ids)
    assert sum(line.startswith("affinity::trace::") for line in ids) == 5
    # Before, the items were appended after collection: --co listed them, then said
    # "1 test collected".
    assert re.search(rf"^{len(ids)} tests collected", run.stdout.str(), re.M)


def test_ids_and_prefixes_on_the_command_line_select(pytester: pytest.Pytester) -> None:
    one = pytester.runpytest(*MINI, "--affinity-traces", "6", "-v",
                             "affinity::margin::boundary_is_inclusive")
    one.assert_outcomes(passed=1)
    one.stdout.fnmatch_lines(["affinity::margin::boundary_is_inclusive PASSED*"])
    traces = pytester.runpytest(*MINI, "--affinity-traces", "6", "-q", "affinity::trace")
    traces.assert_outcomes(passed=6)
    family = pytester.runpytest(*MINI, "--affinity-traces", "6", "-v",
                                "affinity::trace::legacy_first::seed-1",
                                "affinity::legacy")
    assert family.ret == 0
    assert len(re.findall(r"^affinity::legacy::\w+ PASSED", family.stdout.str(), re.M)) > 30
    assert "affinity::trace::legacy_first::seed-1 PASSED" in family.stdout.str()
    assert "affinity::margin::" not in family.stdout.str()
    unknown = pytester.runpytest(*MINI, "affinity::margin::no_such_case")
    assert unknown.ret == pytest.ExitCode.USAGE_ERROR
    assert "no_such_case" in unknown.stderr.str()


def test_the_affinity_marker_and_deselect_work(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    only_own = pytester.runpytest(*MINI, "--affinity-traces", "3", "-q", "--strict-markers",
                                  "-m", "not affinity")
    only_own.assert_outcomes(passed=1)
    only_affinity = pytester.runpytest(*MINI, "--affinity-traces", "3", "-q", "-m",
                                       "affinity", "-k", "trace")
    only_affinity.assert_outcomes(passed=3)
    deselected = pytester.runpytest(*MINI, "--affinity-traces", "3", "-q", "-k", "trace",
                                    "--deselect", "affinity::trace::legacy_draw::seed-2")
    deselected.assert_outcomes(passed=2)


def test_junit_classnames_name_the_suite(pytester: pytest.Pytester) -> None:
    xml = pytester.path / "junit.xml"
    run = pytester.runpytest(*MINI, "--affinity-traces", "2", "-q", f"--junitxml={xml}")
    assert run.ret == 0
    cases = ET.parse(xml).getroot().iter("testcase")
    pairs = {(c.get("classname"), c.get("name")) for c in cases}
    assert ("affinity.margin", "boundary_is_inclusive") in pairs
    assert ("affinity.trace.legacy_first", "seed-1") in pairs
    assert all(classname and classname.startswith("affinity.") for classname, _ in pairs)


def test_a_broken_class_fails_with_the_shrunk_diagnosis(pytester: pytest.Pytester) -> None:
    out = pytester.path / "out"
    run = pytester.runpytest(*STRICT_MARGIN, "--affinity-out", str(out), "-q")
    assert run.ret == 1
    text = run.stdout.str()
    assert "FAILED affinity::margin::boundary_is_inclusive" in text
    assert "first divergence: step" in text and "[R-KEEP-1" in text
    assert "minimal trace (" in text and "Traceback" not in text
    assert any(out.glob("check_margin_*.json"))
    legacy = pytester.runpytest("--affinity-impl", f"{BROKEN}:StrictMarginBalancer",
                                "--affinity-tie-break", "first", "--affinity-level", "core",
                                "--affinity-traces", "5", "-q")
    assert legacy.ret == 0, legacy.stdout.str()[-2000:]  # its core level is fine


def test_failure_artefacts_go_under_pytests_basetemp(pytester: pytest.Pytester) -> None:
    system_tmp = Path(tempfile.gettempdir())
    before = set(system_tmp.glob("affinity-check-failures-*"))
    basetemp = pytester.path / "basetemp"
    run = pytester.runpytest(*STRICT_MARGIN, f"--basetemp={basetemp}", "-q")
    assert run.ret == 1
    written = sorted((basetemp / "affinity-failures").glob("check_margin_*.json"))
    assert written, run.stdout.str()[-2000:]
    assert f"as a vector: {written[0]}" in run.stdout.str()
    # The plugin used to leave a fresh folder in the system temp directory on every run.
    assert set(system_tmp.glob("affinity-check-failures-*")) == before


def test_bad_options_are_usage_errors(pytester: pytest.Pytester) -> None:
    run = pytester.runpytest_subprocess("--affinity-impl", "no_such_module_xyz:Balancer")
    assert run.ret == pytest.ExitCode.USAGE_ERROR and "no_such_module_xyz" in run.stderr.str()
    level = pytester.runpytest_subprocess(*MINI, "--affinity-level", "gold")
    assert level.ret == pytest.ExitCode.USAGE_ERROR
    assert "'gold'" in level.stderr.str() and "strict-config" in level.stderr.str()
