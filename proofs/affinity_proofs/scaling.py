"""Measured scaling: the largest N each Z3 lemma proves within a time budget, and the BFS
checker's states per second.

Theory of operation
-------------------
``python -m affinity_proofs.scaling [--budget 60] [--max-n 512] [--lemma NAME ...]
[--bfs-scope default] [--json FILE]``

For each lemma of :data:`~affinity_proofs.z3_lemmas.LEMMAS` the server count grows
through 1, 2, 4, 8, 16 and then by factors of 1.5 (24, 36, 54, 81, ...), each solver call
limited to the budget. The first N that takes longer than the budget, or that Z3 answers "unknown",
stops the lemma; the answer is the largest N before it, with its time. Only a proved N
(or, for a fact lemma, a witnessed one) counts: a counterexample stops the lemma and is
reported as a failure. Then every BFS run of the chosen scope is explored once, with all
its checks, and its CPU time and states per second are printed.

The output is a Markdown table, ready for the proofs audit record (docs/records/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .bfs_tasks import run_spec
from .scopes import scope_named
from .z3_band_lemmas import BAND_LEMMAS
from .z3_lemmas import LEMMAS, lemma_by_name, run_lemma
from .z3_param_kit import run as run_param
from .z3_param_lemmas import PARAM_LEMMAS

__all__ = ["all_n_times", "bfs_rates", "largest_n", "main"]


def _ns(max_n: int) -> Iterator[int]:
    n = 1
    while n <= max_n:
        yield n
        n = n + 1 if n < 2 else (n + n // 2 if n >= 16 else n * 2)


def largest_n(name: str, budget: float, max_n: int) -> dict[str, Any]:
    lemma = lemma_by_name(name)
    best: tuple[int, float] | None = None
    stop = f"reached --max-n {max_n}"
    for n in _ns(max_n):
        if n < lemma.min_n:
            continue
        result = run_lemma(lemma, n, timeout_s=budget)
        if result.verdict == "unknown" or result.seconds > budget:
            stop = f"N={n} took {result.seconds:.1f}s ({result.verdict})"
            break
        if not result.holds:
            stop = f"N={n}: {result.verdict} (FAILURE)"
            break
        best = (n, result.seconds)
        print(f"  {name}: N={n} {result.verdict} in {result.seconds:.2f}s", file=sys.stderr)
    return {"lemma": name, "obligation": lemma.obligation,
            "largest_n": best[0] if best else None,
            "seconds_at_largest": round(best[1], 2) if best else None, "stopped": stop}


def all_n_times() -> list[dict[str, Any]]:
    """CPU time of each all-N lemma (z3_param_lemmas) and of refuting its mutants."""
    out = []
    for lemma in (*PARAM_LEMMAS, *BAND_LEMMAS):
        start = time.process_time()
        proof = run_param(lemma)
        proof_cpu = time.process_time() - start
        verdicts = [run_param(lemma, v).verdict for v in lemma.mutants]
        out.append({"lemma": lemma.name, "obligation": lemma.obligation,
                    "verdict": proof.verdict, "cpu_seconds": round(proof_cpu, 3),
                    "mutants_cpu_seconds": round(time.process_time() - start - proof_cpu, 3),
                    "mutants_refuted": sum(v == "counterexample" for v in verdicts),
                    "mutants": len(verdicts)})
    return out


def bfs_rates(scope: str) -> list[dict[str, Any]]:
    out = []
    for run in scope_named(scope).bfs_runs:
        start = time.process_time()
        result = run_spec(run)
        cpu = time.process_time() - start
        out.append({"run": run.label, "scope": run.describe(), "states": result.states,
                    "edges": result.edges, "cpu_seconds": round(cpu, 2),
                    "states_per_cpu_second": round(result.states / cpu) if cpu else None,
                    "expects_violation": run.expects_violation})
        print(f"  BFS {run.label}: {result.states} states in {cpu:.2f}s CPU", file=sys.stderr)
    return out


def _markdown(lemmas: list[dict[str, Any]], bfs: list[dict[str, Any]], budget: float,
              all_n: list[dict[str, Any]]) -> str:
    lines = ["| Z3 lemma, all N | obligation | verdict | CPU s | mutants refuted (CPU s) |",
             "|---|---|---|---|---|"]
    for r in all_n:
        lines.append(f"| `{r['lemma']}` | {r['obligation']} | {r['verdict']} | "
                     f"{r['cpu_seconds']} | {r['mutants_refuted']}/{r['mutants']} "
                     f"({r['mutants_cpu_seconds']}) |")
    lines += ["", f"| Z3 lemma | obligation | largest N within {budget:g} s | time at that N | "
             "next step |", "|---|---|---|---|---|"]
    for r in lemmas:
        lines.append(f"| `{r['lemma']}` | {r['obligation']} | {r['largest_n']} | "
                     f"{r['seconds_at_largest']} s | {r['stopped']} |")
    lines += ["", "| BFS run | scope | states | CPU s | states/s |", "|---|---|---|---|---|"]
    for r in bfs:
        if r["expects_violation"]:
            continue
        lines.append(f"| {r['run']} | {r['scope']} | {r['states']} | {r['cpu_seconds']} | "
                     f"{r['states_per_cpu_second']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m affinity_proofs.scaling")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per solver call")
    parser.add_argument("--max-n", type=int, default=512)
    parser.add_argument("--lemma", action="append", default=None,
                        help="only this lemma (repeatable)")
    parser.add_argument("--bfs-scope", default="default", help="small, default or deep")
    parser.add_argument("--skip-bfs", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    names = args.lemma or [x.name for x in LEMMAS]
    all_n = all_n_times()
    lemmas = [largest_n(name, args.budget, args.max_n) for name in names]
    bfs = [] if args.skip_bfs else bfs_rates(args.bfs_scope)
    print(_markdown(lemmas, bfs, args.budget, all_n))
    if args.json is not None:
        args.json.write_text(json.dumps({"all_n": all_n, "lemmas": lemmas, "bfs": bfs},
                                        indent=2) + "\n", encoding="utf-8")
    failed = any(r["verdict"] != "proved" or r["mutants_refuted"] != r["mutants"]
                 for r in all_n)
    return 1 if failed or any("FAILURE" in r["stopped"] for r in lemmas) else 0


if __name__ == "__main__":
    sys.exit(main())
