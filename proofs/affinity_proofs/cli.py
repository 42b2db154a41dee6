"""``affinity verify``: run the proof suite, print the obligation table, exit non-zero on
any failure or surviving mutant.

Theory of operation
-------------------
:func:`register` adds the options to the subcommand parser; :func:`run` executes the
scope through :mod:`.verify` with a ``rich`` progress bar on stderr, prints the table
(obligation, requirement ids, method, scope, result, job time, mutants refuted; the job
time is explained by :data:`TIME_COLUMN`) and, for every
failure or surviving mutant, the evidence (a counterexample trace or model). ``--json
FILE`` writes the full report (:func:`affinity_proofs.report.to_json`). The exit code is
0 only if every obligation passed, each with at least one refuted mutant, 1 otherwise,
and 2 for bad options -- output paths included, checked before any proof runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import textwrap
from importlib import metadata
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from affinity_cli.paths import output_dir, output_file

from .mutants import MUTANTS
from .report import OBLIGATIONS, Row, obligation_passed, to_json
from .scopes import SCOPES, scope_named
from .verify import run as run_scope

__all__ = ["TIME_COLUMN", "register", "run"]

# What the table's "job time" column measures; printed under the table and in --help.
TIME_COLUMN = ("job time: the elapsed seconds of a row's jobs, each timed where it runs "
               "(a worker process) and summed over the row's jobs; jobs run in parallel "
               "(--workers), so the column adds up to more than the wall-clock time in the "
               "table's title.")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scope", choices=sorted(SCOPES), default="default",
                        help="bounds of every method: small (the tests' scope, quicker), "
                             "default (50-60 s wall on a quiet 2-core machine, longer "
                             "on a loaded one), deep (10-12 minutes) (default: "
                             "%(default)s)")
    parser.add_argument("--json", dest="json_path", metavar="FILE", type=output_file,
                        help="write the full report as JSON")
    parser.add_argument("--workers", type=_workers, default=2,
                        help="worker processes, 1..64 (default: %(default)s)")
    parser.add_argument("--write-counterexamples", type=output_dir, metavar="DIR",
                        help="also write the regenerated Z3 witnesses to DIR (in a checkout: "
                             "proofs/counterexamples); the check compares with the shipped ones")
    parser.add_argument("--fail-fast", action="store_true",
                        help="stop at the first failing job (the rest are not run)")
    parser.add_argument("--known-failure", action="append", default=[], metavar="METHOD",
                        help="with --fail-fast: a row (by its method) that fails already "
                             "does not stop the run (repeatable; for mutation audits)")
    parser.add_argument("--only", type=_obligation, action="append", metavar="N",
                        help=f"check only obligation N (0..{max(o.number for o in OBLIGATIONS)}"
                             ", repeatable)")
    # Pre-wrapped paragraphs: the plain formatter would run this note and the exit
    # status (appended by affinity_cli.main) together into one.
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = textwrap.fill(TIME_COLUMN, width=88)
    parser.set_defaults(run=run)


def _obligation(text: str) -> int:
    numbers = {o.number for o in OBLIGATIONS}
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value not in numbers:
        raise argparse.ArgumentTypeError(
            f"--only must be an obligation number {min(numbers)}..{max(numbers)}, got {text!r}")
    return value


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"--workers must be an integer 1..64, got {text!r}")
    return value


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("z3-solver", "crosshair-tool", "affinity-routing"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def _table(rows: list[Row], scope: str, seconds: float) -> Table:
    table = Table(title=f"affinity verify --scope {scope}  ({seconds:.1f} s wall)",
                  caption=TIME_COLUMN, show_lines=False, expand=False)
    for column, width in (("obligation", 24), ("requirement ids", 18), ("method", 22),
                          ("package", 16), ("scope", 26), ("result", 9), ("job time", 8),
                          ("mutants refuted", 8)):
        table.add_column(column, overflow="fold", max_width=width)
    titles = {o.number: o.title for o in OBLIGATIONS}
    previous = None
    for r in rows:
        first = r.obligation != previous
        previous = r.obligation
        style = "" if r.passed else "bold red"
        cells = (f"{r.obligation}. {titles[r.obligation]}" if first else "",
                 " ".join(r.requirement_ids), r.method, r.package, r.scope_text, r.result,
                 f"{r.seconds:.1f}s", r.mutant_score)
        table.add_row(*(escape(c) for c in cells), style=style)
    return table


def _problems(rows: list[Row], only: frozenset[int] | None) -> list[str]:
    out = []
    for r in rows:
        if not r.holds:
            out.append(f"[{r.obligation}] {r.method}: {r.detail}")
        for m in r.mutants:
            if m.inconclusive:
                continue  # reported by _inconclusive(), not a failure of the core
            if not m.refuted:
                out.append(f"[{r.obligation}] {r.method}: mutant {m.name} SURVIVED "
                           f"({m.description}): {m.evidence}")
    for o in OBLIGATIONS:
        if only is not None and o.number not in only:
            continue
        ok, why = obligation_passed(o.number, rows)
        if not ok and why in ("no rows", "no refuted mutant"):
            out.append(f"[{o.number}] {o.title}: {why}")
    return out


def run(args: argparse.Namespace) -> int:
    scope = scope_named(args.scope)
    only = frozenset(args.only) if args.only else None
    out = Console(soft_wrap=False, width=max(Console().width, 140))
    err = Console(stderr=True)
    with Progress(TextColumn("[bold]verify[/] {task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task(f"--scope {scope.name}", total=None)

        def progress(name: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=name)

        rows, extra, seconds = run_scope(scope, workers=args.workers,
                                         write_counterexamples=args.write_counterexamples,
                                         progress=progress, only=only,
                                         fail_fast=args.fail_fast,
                                         known_failures=frozenset(args.known_failure))
    out.print(_table(rows, scope.name, seconds))
    problems = _problems(rows, only)
    refuted = sorted({m.name for r in rows for m in r.mutants if m.refuted})
    out.print(f"mutants refuted: {len(refuted)} distinct ({', '.join(refuted)})",
              highlight=False)
    for r in rows:
        for m in r.mutants:
            if m.inconclusive:
                out.print(f"[yellow]CONTROL INCONCLUSIVE[/] [{r.obligation}] {r.method}: "
                          f"{escape(m.name)}: {escape(m.evidence)}", highlight=False)
    if extra.get("stopped_at"):
        problems.append(f"--fail-fast: stopped after the first failing job, "
                        f"{extra['stopped_at']!r}; later jobs were not run")
    for line in problems:
        out.print(f"[red]FAIL[/] {escape(line)}", highlight=False)
    report: dict[str, Any] = to_json(scope.name, rows, seconds,
                                     [{"name": m.name, "description": m.description,
                                       "obligations": list(m.obligations)} for m in MUTANTS],
                                     {**extra, "versions": _versions(),
                                      "only": sorted(only) if only else None}, only)
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(report, indent=2, default=str) + "\n",
                                  encoding="utf-8")
        out.print(f"report written to {args.json_path}")
    passed = bool(report["passed"]) and not problems
    out.print("[bold green]PASS[/]" if passed else "[bold red]FAILED[/]")
    return 0 if passed else 1
