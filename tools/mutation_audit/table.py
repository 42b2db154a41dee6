"""Render audit results (``run.py --out FILE``) as the markdown tables of the proofs audit record.

One table per package the results hold (``engine``, ``core``), each headed by its counts:
killed of non-equivalent, the rate, the commits its results ran against. Results written
before the runner named packages count as the engine's.

Usage: ``python -m tools.mutation_audit.table audit.json [more.json ...] [--package core]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["main", "package_counts", "render"]


def _killer(result: dict[str, Any]) -> str:
    """The first FAIL line verify printed (the row or job that refuted the mutant)."""
    for line in result.get("fails", []):
        text = str(line).removeprefix("FAIL ").split(":")[0]
        if "--fail-fast" not in text:
            return text.replace("|", "/")
    return "-"


def _package(result: dict[str, Any]) -> str:
    return str(result.get("package", "engine"))


def package_counts(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Killed, non-equivalent, rate, survivors and commits of one package's results."""
    counted = [r for r in results if not r.get("equivalent")]
    killed = sum(1 for r in counted if r["verdict"] == "killed")
    return {"mutants": len(results), "equivalent": len(results) - len(counted),
            "non_equivalent": len(counted), "killed": killed,
            "kill_rate": killed / len(counted) if counted else None,
            "survivors": [str(r["id"]) for r in counted if r["verdict"] != "killed"],
            "commits": sorted({str(r.get("commit", "?")) for r in results})}


def render(summary: dict[str, Any], package: str | None = None) -> str:
    """One table per package of ``summary`` (or only ``package``'s)."""
    names = sorted({_package(r) for r in summary["results"]}, key=("engine", "core").index)
    out: list[str] = []
    for name in names if package is None else [package]:
        results = [r for r in summary["results"] if _package(r) == name]
        c = package_counts(results)
        commits = ", ".join(f"`{x}`" for x in c["commits"])
        out += [f"**{name}**: commit {commits}, `affinity verify --scope {summary['scope']} "
                f"--workers {summary['workers']} --fail-fast`; killed **{c['killed']} of "
                f"{c['non_equivalent']}** non-equivalent mutants "
                f"({100 * (c['kill_rate'] or 0):.1f} %), {c['equivalent']} argued "
                f"equivalent; load average at the end "
                f"{', '.join(f'{x:.1f}' for x in summary['load_average'])}.", "",
                "| mutant | file | one-line bug | verdict | first failing row | s |",
                "|---|---|---|---|---|---|"]
        for r in results:
            verdict = r["verdict"] + (" (equivalent)" if r.get("equivalent") else "")
            out.append(f"| `{r['id']}` | {r['path']} | {r['description']} | {verdict} | "
                       f"{_killer(r)} | {r['seconds']} |")
        out.append("")
    return "\n".join(out).rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--package", choices=("engine", "core"))
    args = parser.parse_args(argv)
    for path in args.files:
        summary = json.loads(path.read_text(encoding="utf-8"))
        if args.package is None or any(_package(r) == args.package
                                       for r in summary["results"]):
            print(render(summary, args.package))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
