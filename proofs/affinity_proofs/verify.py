"""Orchestration of ``affinity verify``: schedule every job, assemble the rows.

Theory of operation
-------------------
:func:`plan` lists the jobs of a scope: one per Z3 lemma, the BMC, the counterexample
witnesses, the encoding-conformance sweep, the symmetry check, one BFS exploration per
configuration, one BFS mutant search per (mutant, obligation), and the subprocess
methods (CrossHair, cross-process determinism).

:func:`run` executes them on worker processes (``spawn``: mutants patch module globals,
so every worker has its own copy of the core) under :class:`~.budget.BudgetPool`: every
job has a CPU budget (the scope's ``job_budget`` times the job's factor) and a wall-clock
cap, and a job past either is killed and reported as a FAIL row that names it -- no
mutant of the core can make ``affinity verify`` run past its budgets. A job that crashes
is a FAIL row under every obligation it serves; a negative control whose own code crashes
(a monkeypatch that no longer fits the core) is *control inconclusive*, with its
traceback, and counts neither as a refutation nor as a failure of the core. The
subprocess methods have their own lane of two workers. Progress goes to a callback.

It then turns the BFS summaries into rows: per obligation, the explorations in which its
checks applied, their states and time, the violations (there must be none), and the
mutants its checks refuted. Hazard and limit runs must *find* their documented exception.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from . import bfs_groups, jobs, jobs_param, jobs_tables
from .bfs_checks import CHECKS
from .budget import BudgetPool, Crashed, Overrun, Task
from .mutants import MUTANTS
from .report import MutantVerdict, Row
from .scopes import BfsRun, Scope
from .z3_all_n import ALL_N_LEMMAS
from .z3_lemmas import LEMMAS

__all__ = ["Job", "plan", "run"]

Progress = Callable[[str, int, int], None]  # (finished job, done, total)


@attrs.frozen
class Job:
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    subprocess: bool = False  # runs on a thread; the work is in child processes
    # Rough CPU cost, in tenths of a second on a quiet machine: the pool starts the
    # costliest jobs first (longest processing time first), so that the workers finish
    # together instead of one running a long job alone at the end.
    weight: int = 10
    obligation: int = 0  # where a crash of this job is reported
    serves: frozenset[int] = frozenset()  # the obligations whose rows use its result
    budget_factor: float = 1.0  # times the scope's job budget (CPU seconds)


BFS_OBLIGATIONS = sorted({c.obligation for c in CHECKS})
# Mutants whose refutation belongs to an environment row (in-flight / lease ground truth).
ENV_MUTANTS = (("acquire_counts_wrong_server", 9), ("lease_ignores_epoch", 14))


CROSSHAIR_OBLIGATIONS = frozenset({1, *(v[0] for v in jobs.CROSSHAIR_SPEC.values())})


def _serves(run: BfsRun) -> frozenset[int]:
    from .bfs_tasks import env_of

    _, env_checks = env_of(run)
    return frozenset(c.obligation for c in (*CHECKS, *env_checks) if c.applies(run.config))


def _bfs_cost(run: BfsRun) -> int:
    """A BFS exploration's weight: its states grow about as ``servers ** 4 * (cap + 1)``
    (request ids grow with the servers in the scopes), symmetry divides them by the
    renamings of the servers; about a tenth of a second per unit, measured. Hazard and
    limit runs stop at the documented violation, within a few hundred edges."""
    if run.expects_violation:
        return 1
    n = len(run.universe.servers)
    cost = n ** 4 * (run.load_cap + 1)
    return cost // math.factorial(n) if run.symmetry else cost


def plan(scope: Scope, write_counterexamples: Path | None = None,
         only: frozenset[int] | None = None) -> list[Job]:
    """Every job of the scope; with ``only``, the jobs some selected obligation needs."""
    out = [Job("crosshair", jobs.crosshair_jobs, (scope,), subprocess=True, weight=50,
               serves=CROSSHAIR_OBLIGATIONS, budget_factor=2.0),
           Job("determinism subprocesses", jobs.determinism_job, (), subprocess=True,
               weight=5, obligation=2, serves=frozenset({2}))]
    for run in scope.bfs_runs:
        out.append(Job(f"BFS {run.label}", jobs.bfs_spec_job, (run,), weight=_bfs_cost(run),
                       serves=_serves(run)))
    for lemma in LEMMAS:
        out.append(Job(f"Z3 {lemma.name}", jobs.z3_lemma_job, (lemma.name, scope), weight=3,
                       obligation=lemma.obligation, serves=frozenset({lemma.obligation})))
    for param in ALL_N_LEMMAS:  # proved for every N (jobs_param.py)
        out.append(Job(f"Z3 all-N {param.name}", jobs_param.z3_param_job, (param.name,),
                       weight=2, obligation=param.obligation,
                       serves=frozenset({param.obligation})))
    out += [Job(f"structure {s}", jobs_param.structure_job, (s, scope), weight=8,
                obligation=o, serves=frozenset({o}))
            for s, o in (("load_table", 1), ("sticky_lru", 10))]
    out.append(Job("Z3 load table merge", jobs_param.merge_job, (), weight=2, obligation=1,
                   serves=frozenset({1})))
    out.append(Job("engine refines reference (wide)", jobs_param.refinement_job, (scope,),
                   weight=110, obligation=21, serves=frozenset({21})))
    out.append(Job("encoding conformance (wide)", jobs_param.conformance_wide_job, (scope,),
                   weight=40, serves=frozenset({0})))
    out.append(Job("BFS group pins", bfs_groups.group_bfs_job, (), weight=15, obligation=3,
                   serves=frozenset({3, 8, 10})))
    out.append(Job("encoding conformance (prefix)", jobs_param.prefix_sweep_job, (scope,),
                   weight=20, serves=frozenset({0})))
    out += [Job("Z3 BMC", jobs.bmc_job, (scope,), weight=5, obligation=3,
                serves=frozenset({3})),
            Job("counterexamples", jobs.counterexample_job, (write_counterexamples,),
                weight=7, obligation=3, serves=frozenset({3})),
            Job("encoding conformance", jobs.conformance_job, (scope,), weight=40,
                serves=frozenset({0})),
            Job("symmetry", jobs.symmetry_job, (scope,), weight=35, serves=frozenset({0})),
            Job("configuration table", jobs_tables.config_job, (), weight=2, obligation=19,
                serves=frozenset({18, 19})),
            Job("decision table", jobs_tables.decision_table_job, (scope,), weight=170,
                obligation=15,
                serves=frozenset({0, 15}))]
    runs = scope.bfs_runs
    for mutant in MUTANTS:
        for obligation in mutant.obligations:
            if obligation in BFS_OBLIGATIONS:
                out.append(Job(f"BFS mutant {mutant.name} #{obligation}", jobs.bfs_mutant_job,
                               (mutant.name, obligation, runs, False), obligation=obligation,
                               serves=frozenset({obligation})))
    for name, obligation in ENV_MUTANTS:
        out.append(Job(f"BFS env mutant {name} #{obligation}", jobs.bfs_mutant_job,
                       (name, obligation, runs, True), obligation=obligation,
                       serves=frozenset({obligation})))
    if only is not None:
        out = [j for j in out if j.serves & only]
    out.sort(key=lambda j: -j.weight)
    return out


def _failed_job(job: Job, why: str) -> list[Row]:
    """FAIL rows naming the job, one per obligation it serves (never obligation 0 only)."""
    return [Row(obligation, f"{job.name} ({why.split(':')[0]})", "-", False, 0.0, (),
                f"job {job.name!r} {why}")
            for obligation in sorted(job.serves or {job.obligation})]


def _inconclusive_search(job: Job, text: str) -> dict[str, Any]:
    mutant, obligation, _, env_only = job.args
    return {"mutant": mutant, "obligation": obligation, "env_only": env_only,
            "refuted": False, "inconclusive": True, "run": None, "states": 0,
            "seconds": 0.0, "evidence": f"control inconclusive (not a failure of the core): "
                                        f"{text}"}


def _outcome(job: Job, value: Any) -> Any:
    """A job's result; a crash or a budget overrun becomes FAIL rows naming the job, and a
    crash of a negative control's own code becomes an inconclusive control."""
    if isinstance(value, Overrun):
        return _failed_job(job, f"overran: {value.limit} budget exceeded ({value.cpu} s CPU, "
                                f"{value.wall} s wall; budget {value.budget} s CPU)")
    if isinstance(value, Crashed):
        if job.fn is jobs.bfs_mutant_job:
            return _inconclusive_search(job, value.traceback.strip())
        return _failed_job(job, f"crashed: {value.last_line}")
    return value


def _job_failed(value: Any, known: frozenset[str] = frozenset()) -> bool:
    """Whether one job's result already fails the run (for ``fail_fast``); rows whose
    method is in ``known`` (failing already without the change under audit) do not."""
    if isinstance(value, list):
        return any(not r.passed and r.method not in known for r in value)
    if isinstance(value, dict) and "expects_violation" in value:  # a BFS exploration
        return bool(value["violations"]) != bool(value["expects_violation"])
    if isinstance(value, dict):  # a BFS mutant search
        return not value["refuted"] and not value.get("inconclusive")
    return False


def run(scope: Scope, *, workers: int = 2, write_counterexamples: Path | None = None,
        progress: Progress | None = None, only: frozenset[int] | None = None,
        fail_fast: bool = False, known_failures: frozenset[str] = frozenset()
        ) -> tuple[list[Row], dict[str, Any], float]:
    """Every job of the scope; with ``fail_fast`` the run stops at the first job whose
    result fails (the remaining jobs are killed and their obligations report no rows)."""
    start = time.perf_counter()
    todo = plan(scope, write_counterexamples, only)
    results: dict[str, Any] = {}
    by_name = {job.name: job for job in todo}
    # Jobs that drive subprocesses (CrossHair, PYTHONHASHSEED traces) mostly wait: their
    # own lane, so they overlap with the compute jobs as before.
    pool = BudgetPool({"cpu": workers, "sub": 2})
    tasks = [Task(job.name, job.fn, job.args, scope.job_budget * job.budget_factor,
                  "sub" if job.subprocess else "cpu") for job in todo]
    if fail_fast:  # checks that run the core first (cheapest first), then the Z3 proofs
        # of the encoding, then the controls, the subprocess methods last: a failure of
        # the core costs the least time
        tasks = sorted((attrs.evolve(t, lane="cpu") for t in tasks),
                       key=lambda t: (by_name[t.name].subprocess,
                                      by_name[t.name].fn is jobs.bfs_mutant_job,
                                      t.name.startswith("Z3"), by_name[t.name].weight))
    stopped_at = None
    running = pool.run(tasks)
    for done, (task, value) in enumerate(running, start=1):
        job = by_name[task.name]
        results[job.name] = _outcome(job, value)
        if progress is not None:
            progress(job.name, done, len(todo))
        if fail_fast and _job_failed(results[job.name], known_failures):
            stopped_at = job.name
            running.close()  # kills the workers still running
            break
    rows: list[Row] = []
    for job in todo:
        value = results.get(job.name)
        if isinstance(value, list):
            rows.extend(value)
    summaries = [v for r in scope.bfs_runs
                 if isinstance(v := results.get(f"BFS {r.label}"), dict)]
    searches = [v for k, v in results.items()
                if k.startswith(("BFS mutant", "BFS env mutant")) and isinstance(v, dict)]
    rows.extend(bfs_rows(scope, summaries, searches))
    if only is not None:
        rows = [r for r in rows if r.obligation in only]
    rows.sort(key=lambda r: (r.obligation, _METHOD_ORDER.get(r.method.split(" ")[0], 9)))
    extra = {"bfs_runs": summaries, "bfs_mutant_searches": searches,
             "stopped_at": stopped_at}
    return rows, extra, time.perf_counter() - start


_METHOD_ORDER = {"Z3": 0, "BFS": 1, "CrossHair": 2, "subprocesses": 3}


def _scope_text(summaries: list[dict[str, Any]]) -> str:
    servers = max(int(s["scope"].split(" servers")[0]) for s in summaries)
    caps = max(int(s["scope"].split("loads <= ")[1].split(",")[0]) for s in summaries)
    return f"{len(summaries)} configs, N<={servers}, loads<={caps}"


def bfs_rows(scope: Scope, summaries: list[dict[str, Any]],
             searches: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for obligation in BFS_OBLIGATIONS:
        mine = [s for s in summaries if obligation in s["obligations"]
                and s["env"] == "free"]
        rows.append(_row(obligation, "BFS all interleavings", mine, searches, env=False))
    for obligation, envs, method in ((9, ("in_flight",), "BFS in-flight ground truth"),
                                     (14, ("lease",), "BFS lease ground truth")):
        mine = [s for s in summaries if s["env"].split("+")[0] in envs]
        rows.append(_row(obligation, method, mine, searches, env=True))
    return rows


def _row(obligation: int, method: str, mine: list[dict[str, Any]],
         searches: list[dict[str, Any]], env: bool) -> Row:
    problems: list[str] = []
    notes: list[str] = []
    for s in mine:
        own = [v for v in s["violations"] if v["obligation"] == obligation]
        if s["expects_violation"]:
            if not own:
                problems.append(f"{s['label']}: the documented exception was NOT found")
            else:
                notes.append(f"{s['label']} (documented, found): {own[0]['trace']}")
        elif own:
            problems.append(f"{s['label']}: {own[0]['trace']}")
        if s["truncated"] and not s["expects_violation"] and not own:
            first = s["violations"][0] if s["violations"] else None
            problems.append(
                f"{s['label']}: stopped at the first violation ([{first['obligation']}] "
                f"{first['check']}); the rest of the run was not explored" if first else
                f"{s['label']}: exploration truncated (state limit)")
    states = sum(s["states"] for s in mine if not s["expects_violation"])
    seconds = sum(s["seconds"] for s in mine)
    rate = states / seconds if seconds else 0.0
    verdicts = tuple(
        MutantVerdict(m["mutant"], jobs.describe(m["mutant"]), m["refuted"],
                      (f"{m['run']}: " if m["run"] else "") + m["evidence"],
                      bool(m.get("inconclusive")))
        for m in searches if m["obligation"] == obligation and m["env_only"] == env)
    detail = "; ".join(problems) if problems else \
        f"{states} states, {rate:.0f} states/s; no violation"
    if notes:
        detail += "; " + "; ".join(notes)
    scope_text = _scope_text(mine) if mine else "no configuration"
    return Row(obligation, method, scope_text, bool(mine) and not problems, seconds, verdicts,
               detail, evidence={"runs": [s["label"] for s in mine], "states": states,
                                 "states_per_second": round(rate)})
