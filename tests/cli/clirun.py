"""Run ``affinity`` in-process and check its one-line errors (shared by tests/cli)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from affinity_cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``affinity ARGS`` (argparse's exits included)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def one_clean_line(code: int, err: str, *needles: str, status: int = 2) -> str:
    """The last stderr line: the one message (argparse prints the usage above it)."""
    assert code == status, (code, err)
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    for needle in needles:
        assert needle in line, (needle, line)
    return line
