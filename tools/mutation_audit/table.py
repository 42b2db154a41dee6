"""Render an audit result (``run.py --out FILE``) as the markdown table of the proofs audit record.

Usage: ``python -m tools.mutation_audit.table audit.json``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "render"]


def _killer(result: dict[str, Any]) -> str:
    """The first FAIL line verify printed (the row or job that refuted the mutant)."""
    for line in result.get("fails", []):
        text = str(line).removeprefix("FAIL ").split(":")[0]
        if "--fail-fast" not in text:
            return text.replace("|", "/")
    return "-"


def render(summary: dict[str, Any]) -> str:
    lines = [f"Commit `{summary.get('commit', '?')}`, `affinity verify --scope "
             f"{summary['scope']} --workers {summary['workers']} --fail-fast`; "
             f"killed **{summary['killed']} of {summary['non_equivalent']}** non-equivalent "
             f"mutants ({100 * (summary['kill_rate'] or 0):.1f} %); load average at the end "
             f"{', '.join(f'{x:.1f}' for x in summary['load_average'])}.", "",
             "| mutant | file | one-line bug | verdict | first failing row | s |",
             "|---|---|---|---|---|---|"]
    for r in summary["results"]:
        lines.append(f"| `{r['id']}` | {r['path'].removeprefix('affinity_engine/')} | "
                     f"{r['description']} | {r['verdict']} | {_killer(r)} | {r['seconds']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(render(json.loads(Path(args[0]).read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
