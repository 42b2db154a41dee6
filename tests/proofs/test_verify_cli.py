"""``affinity verify --scope small --json``: every obligation passes and each has at least
one refuted mutant (issues 3 and 10; obligations cite R-LEG-1 ... R-LEASE-6, R-CFG-1 ...)."""

from __future__ import annotations

import json
from pathlib import Path

from affinity_proofs.report import OBLIGATIONS

from affinity_cli.main import main


def test_small_scope_passes_with_refuted_mutants(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    code = main(["verify", "--scope", "small", "--json", str(report_path)])
    report = json.loads(report_path.read_text())
    failing = [o for o in report["obligations"] if not o["passed"]]
    assert code == 0, failing
    assert report["passed"] is True
    numbers = {o["obligation"] for o in report["obligations"]}
    assert numbers == {o.number for o in OBLIGATIONS} and set(range(1, 20)) <= numbers
    for o in report["obligations"]:
        assert o["mutants_refuted"], f"obligation {o['obligation']} has no refuted mutant"
    for row in report["rows"]:
        assert row["requirements"], row["method"]
        assert all(m["refuted"] for m in row["mutants"]), row
    assert report["bfs_runs"] and all(r["states"] > 0 for r in report["bfs_runs"])


def test_the_time_column_is_labelled_and_explained() -> None:
    """The column is the row's jobs' elapsed seconds summed, not wall time: its header,
    the note under the table and --help say so."""
    import contextlib
    import io

    from affinity_proofs.cli import TIME_COLUMN, _table
    from affinity_proofs.report import Row
    from rich.console import Console

    rows = [Row(1, "BFS all interleavings", "2 configs", True, 12.34)]
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(_table(rows, "small", 5.0))
    text = " ".join(console.export_text().split())
    assert "job time" in text and "12.3s" in text
    assert "--scope small (5.0 s wall)" in text
    assert " ".join(TIME_COLUMN.split()) in text
    assert "more than the wall-clock time" in TIME_COLUMN
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["verify", "--help"])
    help_text = " ".join(out.getvalue().split())
    assert " ".join(TIME_COLUMN.split()) in help_text
    assert "50-60 s wall on a quiet 2-core machine" in help_text
