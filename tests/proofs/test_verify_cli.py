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
