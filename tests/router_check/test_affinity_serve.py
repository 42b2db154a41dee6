"""Acceptance: ``affinity check-router`` against ``affinity serve`` on the stub fleet.

* ``--preset affinity --policy margin=2`` conforms;
* the same check against ``affinity serve --margin 0`` fails, with a shrunk trace whose
  first divergence names R-KEEP-1, written as a vector that the core replays;
* both verdicts are unchanged with every settle doubled (``--settle-factor 2``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from affinity_cli.main import main
from affinity_conformance.router_check.presets import free_port
from affinity_conformance.vector_format import EventStep, load_case

COMMON = ["--budget", "2", "--length", "16", "--shrink-runs", "12", "--max-failures", "1"]


def _check(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str],
           *argv: str) -> tuple[int, dict[str, object]]:
    code = main(["check-router", "--preset", "affinity", "--policy", "margin=2", *COMMON,
                 "--out", str(tmp_path / name), "--json", *argv])
    report = json.loads(capsys.readouterr().out)
    assert isinstance(report, dict)
    return code, report


@pytest.mark.parametrize("factor", ["1", "2"])
def test_affinity_serve_conforms_to_its_margin(tmp_path: Path, factor: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _check(tmp_path, "pass", capsys, "--settle-factor", factor)
    assert code == 0 and report["verdict"] == "pass", report
    assert report["traces"] == 2 and report["passed"] == 2
    settle = report["settle"]
    assert isinstance(settle, dict) and settle["mode"] == "status"
    assert settle["factor"] == float(factor) and settle["delay_s"] >= 0.05 * float(factor)


@pytest.mark.parametrize("factor", ["1", "2"])
def test_margin_0_claimed_as_margin_2_fails_naming_r_keep_1(
        tmp_path: Path, factor: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _check(tmp_path, "fail", capsys, "--router-extra", "--margin 0",
                          "--settle-factor", factor)
    assert code == 1 and report["verdict"] == "fail"
    failures = report["failures"]
    assert isinstance(failures, list) and len(failures) == 1
    failure = failures[0]
    assert "R-KEEP-1" in failure["requirements"]
    assert failure["confirmed_on_rerun"] is True
    # shrunk to the two-acquire core of the bug: a pin at load 1, min 0, kept by margin 2
    assert len(failure["minimal_trace"]) == 2, failure["minimal_trace"]
    assert "as a router with margin < 1 would" in failure["diagnosis"]
    case = load_case(Path(failure["vector"]))
    assert "R-KEEP-1" in case.requirements
    events = [s for s in case.steps if isinstance(s, EventStep)]
    assert [s.expect["path"] for s in events if s.expect] == ["new", "kept"]


def test_attach_to_a_running_router_with_url(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """--url: the router is started by someone else, in front of the fleet's fixed ports
    (which are still closed when it starts, as when a user starts the router first)."""
    ports = [free_port() for _ in range(3)]
    router_port = free_port()
    cmd = [sys.executable, "-m", "affinity_cli.main", "serve", "--port", str(router_port),
           "--margin", "2", "--log-level", "WARNING",
           *[f"--backend=http://127.0.0.1:{p}" for p in ports]]
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        code = main(["check-router", "--url", f"http://127.0.0.1:{router_port}",
                     "--fleet-ports", ",".join(map(str, ports)), "--policy", "margin=2",
                     "--budget", "1", "--length", "12", "--json", "--out", str(tmp_path / "o")])
        report = json.loads(capsys.readouterr().out)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    assert code == 0 and report["verdict"] == "pass", report
    assert any("attached with --url" in n for n in report["notes"])


def test_pool_changes_are_driven_through_the_admin_api(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The affinity preset starts ``affinity serve --admin-port`` and drives add, remove
    and drain through it; the traces still conform, and the report counts each kind."""
    code, report = _check(tmp_path, "pool", capsys, "--budget", "4", "--length", "24",
                          "--pool-percent", "30")
    assert code == 0 and report["verdict"] == "pass", report
    changes = report["pool_changes"]
    assert isinstance(changes, dict) and "--admin-port" in report["command"]  # type: ignore[operator]
    assert changes.get("add", 0) > 0 and changes.get("remove", 0) > 0, changes
    assert changes.get("drain", 0) > 0, changes


def test_without_out_a_pass_removes_its_temporary_folder_and_a_fail_keeps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without --out the run writes into a new temporary folder: removed after a pass
    (it holds only the log of a run that found nothing), kept after a failure (its
    vectors are the evidence) and named in the report either way."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    base = ["check-router", "--preset", "affinity", "--policy", "margin=2", *COMMON]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "output: none kept (the check passed; --out DIR keeps the router log)" in out
    assert list(tmp_path.iterdir()) == []
    assert main([*base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["out_dir"] is None
    assert list(tmp_path.iterdir()) == []

    assert main([*base, "--router-extra", "--margin 0"]) == 1
    out = capsys.readouterr().out
    (kept,) = tmp_path.iterdir()
    assert f"output: {kept}" in out
    assert list(kept.glob("*.json")), "the failing run's vectors were not kept"
