"""Run ``affinity verify`` alone against each mutant of the independent audit catalogues.

Theory of operation
-------------------
There are two catalogues (:mod:`.source_mutant`): ``engine`` (:mod:`.catalogue`, what the
adapters run) and ``core`` (:mod:`.catalogue_core`, the reference); ``--package`` selects
one or both. The live work tree is never edited. A committed tree (``git archive`` of
``--commit``, by default ``HEAD`` resolved once, or the work tree with ``--worktree``) is
unpacked into a scratch directory once, and each mutant's file is resolved again in it;
for each mutant the one file it names is rewritten there, ``affinity verify --scope S`` runs with
the scratch directory first on ``PYTHONPATH`` (its ``affinity_engine`` and
``affinity_proofs`` shadow the editable install; spawned workers, CrossHair and the
determinism subprocesses inherit the variable), and the file is restored. The mutant is
*killed* when verify fails because of it; it *survives* otherwise. An unmutated run
comes first: the rows and obligations that fail there already (another engineer's work
in progress) are the *baseline*, and a mutant is killed only when a row or obligation
that passes on the unmutated tree fails. Mutant runs use ``affinity verify --fail-fast``
with the baseline's failing rows as ``--known-failure`` (any other failure is the
mutant's, and a killed mutant costs only the jobs up to the first failure).
``--timeout`` bounds each run: a run killed by it is reported as ``hung`` (verify's own
job budgets should turn that into a FAIL long before).

Every result names its package and the commit it ran against; the summary counts each
package apart (``packages``). ``--update FILE`` runs the selected mutants and replaces
their results in an earlier summary (a rerun of a few mutants against a later commit),
then recounts.

Usage::

    python -m tools.mutation_audit.run --scope default --package core --out core.json
    python -m tools.mutation_audit.run --only keep_lt --only evicted_not_reported
    python -m tools.mutation_audit.run --only core_keep_lt --commit HEAD --update core.json
    python -m tools.mutation_audit.run --list [--package core]
    python -m tools.mutation_audit.run --check [--commit REV]  # apply only; no verify run
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from .catalogue import CATALOGUE
from .catalogue_core import CORE_CATALOGUE
from .source_mutant import SourceMutant, locate

__all__ = ["CATALOGUES", "apply", "by_id", "check", "main", "mutated", "run_verify",
           "selected", "summarise"]

ROOT = Path(__file__).resolve().parents[2]
CATALOGUES: dict[str, tuple[SourceMutant, ...]] = {"engine": CATALOGUE, "core": CORE_CATALOGUE}


def selected(package: str) -> list[SourceMutant]:
    """The mutants of one catalogue, or of both (``all``: the engine's first)."""
    names = list(CATALOGUES) if package == "all" else [package]
    return [m for name in names for m in CATALOGUES[name]]


def by_id(mutant_id: str) -> SourceMutant:
    for m in selected("all"):
        if m.id == mutant_id:
            return m
    raise KeyError(mutant_id)


def _snapshot(dest: Path, worktree: bool, commit: str) -> None:
    """The tree to mutate: the tracked files of the work tree, or ``commit``'s tree."""
    if worktree:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                               capture_output=True).stdout.decode().split("\0")
        for name in filter(None, files):
            src, out = ROOT / name, dest / name
            if src.is_symlink():  # tracked links (the package's vectors, counterexamples)
                out.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.readlink(src), out)
            elif src.is_file():
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(src.read_bytes())
        return
    data = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")


def mutated(text: str, mutant: SourceMutant) -> str:
    """``text`` with the mutant's edit; the snippet must occur exactly once."""
    found = text.count(mutant.old)
    if found != 1:
        raise ValueError(f"{mutant.id}: snippet occurs {found} times in {mutant.path}, "
                         "expected exactly once")
    return text.replace(mutant.old, mutant.new)


def apply(tree: Path, mutant: SourceMutant) -> str:
    """Rewrite the mutant's file in ``tree``; returns the original text."""
    path = tree / mutant.path
    text = path.read_text(encoding="utf-8")
    path.write_text(mutated(text, mutant), encoding="utf-8")
    return text


def check(tree: Path, mutants: list[SourceMutant]) -> list[str]:
    """Why each mutant would not apply to ``tree`` (nothing is written): a missing file, a
    snippet that does not occur exactly once, an edit that changes nothing, or a mutated
    module that no longer parses (verify would fail on the import, not on the bug)."""
    problems = []
    for m in mutants:
        path = tree / m.path
        if not path.is_file():
            problems.append(f"{m.id}: no file {m.path}")
            continue
        text = path.read_text(encoding="utf-8")
        try:
            new = mutated(text, m)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if new == text:
            problems.append(f"{m.id}: the edit leaves {m.path} unchanged")
            continue
        try:
            ast.parse(new, filename=m.path)
        except SyntaxError as exc:
            problems.append(f"{m.id}: {m.path} no longer parses: {exc.msg} "
                            f"(line {exc.lineno})")
    return problems


def _failing(report_path: Path) -> list[str]:
    """The failing rows (obligation, method) and obligations of a verify report."""
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ["(no report)"]
    rows = [f"[{r['obligation']}] {r['method']}" for r in report["rows"] if not r["passed"]]
    rows += [f"method:{r['method']}" for r in report["rows"] if not r["passed"]]
    obligations = [f"[{o['obligation']}] {o['why']}" for o in report["obligations"]
                   if not o["passed"]]
    return sorted({*rows, *obligations})


def run_verify(tree: Path, scope: str, workers: int, timeout: float,
               baseline: frozenset[str] = frozenset(), fail_fast: bool = False,
               known_rows: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run verify on ``tree``. Killed = a row or obligation fails that passes on the
    unmutated tree (``baseline`` lists the ones that already fail there)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "proofs"),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    report = tree / "audit-report.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "affinity_cli.main", "verify", "--scope", scope,
           "--workers", str(workers), "--json", str(report)] + (
               ["--fail-fast"] if fail_fast else [])
    for method in known_rows:
        cmd += ["--known-failure", method]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"verdict": "hung", "seconds": round(time.perf_counter() - start, 1),
                "fails": [], "new_failures": []}
    fails = [line.strip() for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    failing = _failing(report) if proc.returncode != 0 else []
    new = [f for f in failing if f not in baseline]
    verdict = "killed" if new else "survived"
    return {"verdict": verdict, "returncode": proc.returncode,
            "seconds": round(time.perf_counter() - start, 1), "fails": fails[:8],
            "failing": failing, "new_failures": new[:12],
            "stderr_tail": proc.stderr.strip().splitlines()[-6:]
            if proc.returncode not in (0, 1) or "(no report)" in failing else []}


def _resolve(rev: str) -> str:
    """``rev``'s full commit id, resolved once: the snapshot and the report name the same
    one even if HEAD moves while the audit runs."""
    return subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout.strip()


def _commit(head: str, worktree: bool) -> str:
    return head[:12] + (" + work tree" if worktree else "")


def _package_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    counted = [r for r in results if not r["equivalent"]]
    killed = sum(1 for r in counted if r["verdict"] == "killed")
    return {"mutants": len(results), "equivalent": len(results) - len(counted),
            "non_equivalent": len(counted), "killed": killed,
            "kill_rate": round(killed / len(counted), 4) if counted else None,
            "survivors": [str(r["id"]) for r in counted if r["verdict"] != "killed"]}


def summarise(results: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """The JSON summary: ``fields`` (scope, workers, ...), the totals over ``results``, the
    same per package, the commits the results ran against, and the results."""
    total = _package_summary(results)
    packages = {name: _package_summary([r for r in results if r["package"] == name])
                for name in CATALOGUES if any(r["package"] == name for r in results)}
    commits = sorted({str(r["commit"]) for r in results})
    return {**fields, "commit": commits[0] if len(commits) == 1 else commits,
            **{k: total[k] for k in ("mutants", "non_equivalent", "killed", "kill_rate",
                                     "survivors")},
            "packages": packages, "results": results}


def _merged(previous: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``previous``'s results with each of ``results`` in place of the one of its id."""
    fresh = {r["id"]: r for r in results}
    kept = [fresh.pop(r["id"], r) for r in previous["results"]]
    return kept + list(fresh.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scope", default="small")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--package", choices=("core", "engine", "all"), default="all",
                        help="which catalogue: the reference's, the engine's, or both")
    parser.add_argument("--only", action="append", help="mutant id (repeatable)")
    parser.add_argument("--commit", help="the commit to mutate (default: HEAD, resolved once)")
    parser.add_argument("--worktree", action="store_true",
                        help="copy the tracked files of the work tree instead of a commit")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    parser.add_argument("--update", type=Path,
                        help="replace the selected mutants' results in this earlier JSON")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--check", action="store_true",
                        help="check that each mutant applies to the work tree (or to "
                             "--commit); run nothing")
    parser.add_argument("--skip-baseline", action="store_true",
                        help="assume the unmutated tree passes (resuming an audit)")
    args = parser.parse_args(argv)
    mutants = [by_id(i) for i in args.only] if args.only else selected(args.package)
    if args.list:
        for m in mutants:
            print(f"{m.id:36} {m.package:6} {m.path:32} {m.description}"
                  + (f"  [equivalent: {m.equivalent}]" if m.equivalent else ""))
        return 0
    if args.check and args.commit is None:
        problems = check(ROOT, mutants)
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"{len(mutants) - len(problems)}/{len(mutants)} mutants apply")
        return 1 if problems else 0
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mutation-audit-") as scratch:
        tree = Path(scratch)
        head = _resolve(args.commit or "HEAD")
        _snapshot(tree, args.worktree, head)
        mutants = [locate(m, tree) for m in mutants]  # where the snapshot holds the snippet
        if args.check:
            problems = check(tree, mutants)
            for problem in problems:
                print(problem, file=sys.stderr)
            print(f"{len(mutants) - len(problems)}/{len(mutants)} mutants apply to "
                  f"{_commit(head, args.worktree)}")
            return 1 if problems else 0
        for m in mutants:  # every snippet must apply before any run starts
            (tree / m.path).write_text(apply(tree, m), encoding="utf-8")
        baseline: frozenset[str] = frozenset()
        if not args.skip_baseline:
            base = run_verify(tree, args.scope, args.workers, args.timeout)
            baseline = frozenset(base["failing"])
            print(f"baseline: exit {base.get('returncode')} in {base['seconds']} s; "
                  f"already failing: {sorted(baseline) or 'nothing'}", flush=True)
            if base["verdict"] == "hung" or "(no report)" in baseline:
                print("verify on the unmutated tree hangs or crashes: audit void",
                      base.get("stderr_tail"), file=sys.stderr)
                return 2
        for i, m in enumerate(mutants, 1):
            original = apply(tree, m)
            try:
                # --fail-fast, with the rows that fail on the unmutated tree named as
                # known failures: any other failing row is the mutant's.
                known = tuple(sorted(f.removeprefix("method:") for f in baseline
                                     if f.startswith("method:")))
                r = run_verify(tree, args.scope, args.workers, args.timeout, baseline,
                               fail_fast=True, known_rows=known)
            finally:
                (tree / m.path).write_text(original, encoding="utf-8")
            r.update(id=m.id, package=m.package, path=m.path, description=m.description,
                     equivalent=m.equivalent, commit=_commit(head, args.worktree))
            results.append(r)
            first = r["new_failures"][0] if r["new_failures"] else ""
            print(f"[{i}/{len(mutants)}] {m.id}: {r['verdict']} ({r['seconds']} s) "
                  f"{str(first)[:160]}", flush=True)
    fields: dict[str, Any] = {"scope": args.scope, "workers": args.workers,
                              "baseline_failing": sorted(baseline),
                              "load_average": [round(x, 2) for x in os.getloadavg()]}
    if args.update is not None:
        previous = json.loads(args.update.read_text(encoding="utf-8"))
        if previous["scope"] != args.scope:
            print(f"{args.update} is of scope {previous['scope']}, not {args.scope}",
                  file=sys.stderr)
            return 2
        fields = {**{k: previous[k] for k in ("scope", "workers", "baseline_failing",
                                              "load_average") if k in previous},
                  "updated_load_average": fields["load_average"]}
        results = _merged(previous, results)
    summary = summarise(results, **fields)
    for name, counts in summary["packages"].items():
        print(f"{name}: killed {counts['killed']}/{counts['non_equivalent']} non-equivalent "
              f"mutants; survivors: {', '.join(counts['survivors']) or 'none'}")
    out = args.out or args.update
    if out is not None:
        out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
