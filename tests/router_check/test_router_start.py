"""Starting the router under test: a router that exits before it answers.

A port the harness picked free can be taken by another connection before the router binds
it, and the router then exits at once. check-router starts it again on new ports, at most
3 times in all, and says so in the report; a router that always exits is still an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affinity_cli.main import main

SERVE = ("-m affinity_cli.main serve --host 127.0.0.1 --port {port} --backend={backend} "
         "--margin {margin} --log-level WARNING")


def _command(tmp_path: Path, exits: int) -> str:
    """A router command whose first ``exits`` starts exit at once, then ``affinity serve``;
    every start appends a line to starts.txt."""
    script = tmp_path / "router.py"
    script.write_text(
        "import os, sys\n"
        f"log = {str(tmp_path / 'starts.txt')!r}\n"
        "with open(log, 'a') as f:\n"
        "    f.write('start\\n')\n"
        f"if len(open(log).read().split()) <= {exits}:\n"
        "    sys.exit(3)\n"
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n", encoding="utf-8")
    return f"{{python}} {script} {SERVE}"


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], exits: int) -> tuple[int, str,
                                                                                    str]:
    code = main(["check-router", "--router-cmd", _command(tmp_path, exits), "--policy",
                 "margin=2", "--budget", "1", "--length", "6", "--json",
                 "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_router_that_exits_at_its_first_start_is_started_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _check(tmp_path, capsys, exits=1)
    assert out.strip(), err
    report = json.loads(out)
    assert code == 0 and report["verdict"] == "pass", report
    assert any("exited before it answered 1 time(s)" in n for n in report["notes"]), report
    starts = (tmp_path / "starts.txt").read_text().split().count("start")
    assert starts == report["router_starts"] + 1  # every fresh router, and the one that exited


def test_negative_control_a_router_that_always_exits_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _check(tmp_path, capsys, exits=99)
    assert code == 2 and not out.strip()
    assert "router exited with status 3" in err
    assert (tmp_path / "starts.txt").read_text().split().count("start") == 3
