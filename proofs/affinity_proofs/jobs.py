"""The work units of ``affinity verify``; each returns finished report rows or a summary.

Theory of operation
-------------------
Every job is a module-level function with picklable arguments (names, numbers, scope
records), so :mod:`.verify` can run it in a worker process, where mutants are applied
to that process's copy of the core. Jobs that drive subprocesses (CrossHair, the
``PYTHONHASHSEED`` traces) run on threads of the main process instead.

Each job checks the property on the real core (or the cross-checked encoding) *and*
refutes its mutants with the same checker, and packs both into
:class:`~affinity_proofs.report.Row` objects. BFS jobs return summaries instead, because
one exploration of a configuration serves every obligation; :mod:`.verify` assembles
those rows.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs

from . import conformance, counterexamples, crosshair_run, det_trace
from .bfs import BfsResult
from .bfs_tasks import describe_trace, run_mutant, run_spec, symmetry_sound
from .mutants import MUTANTS
from .report import MutantVerdict, Row
from .scopes import BfsRun, Scope
from .z3_bmc import shortest_trace
from .z3_lemmas import Lemma, LemmaResult, lemma_by_name, run_lemma
from .z3_mutants import by_name as encoded_mutant

__all__ = ["bfs_mutant_job", "bfs_spec_job", "bmc_job", "conformance_job",
           "counterexample_job", "crosshair_jobs", "describe", "determinism_job",
           "symmetry_job", "z3_lemma_job"]

_DESCRIPTIONS = {m.name: m.description for m in MUTANTS}
_DESCRIPTIONS.update({  # encoded-only variants (Z3): no monkeypatch of the core needed
    "keep_band_plus_two": "keep rule off by two: load[pin] <= min + m + 2 (encoded)",
})


def describe(name: str) -> str:
    return _DESCRIPTIONS.get(name, name)


def compact_ns(ns: tuple[int, ...]) -> str:
    """(1, 2, 3, 4, 8) -> '1..4, 8'."""
    parts: list[str] = []
    run: list[int] = []
    for n in sorted(ns):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            parts.append(f"{run[0]}..{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
        run = [n]
    if run:
        parts.append(f"{run[0]}..{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
    return ", ".join(parts)


def model_summary(model: dict[str, int | bool] | None) -> str:
    if not model:
        return "(no model)"
    loads = [model[k] for k in sorted((k for k in model if k.startswith("load")),
                                      key=lambda k: int(k[4:]))]
    keys = ["hit", "pin", "margin_on", "margin", "m1", "m2", "gate_on", "gate_abs",
            "rel_num", "rel_den", "det", "det_index", "tie", "least", "legacy_choice"]
    shown = [f"{k}={model[k]}" for k in keys if k in model]
    others = sorted(k for k in model if k.startswith("other_load"))
    if others:
        shown.append("other_loads=" + str([model[k] for k in others]))
    return f"loads={loads} " + " ".join(shown)


# ------------------------------------------------------------------------------ Z3
def _lemma_ns(scope: Scope, lemma: Lemma) -> tuple[int, ...]:
    return tuple(n for n in scope.fact_ns if n >= lemma.min_n)


def z3_lemma_job(name: str, scope: Scope) -> list[Row]:
    lemma = lemma_by_name(name)
    start = time.perf_counter()
    ns = _lemma_ns(scope, lemma)
    results: list[LemmaResult] = [run_lemma(lemma, n) for n in ns]
    bad = [r for r in results if not r.holds]
    verdicts = []
    for mutant, rules in lemma.mutants:
        r = run_lemma(lemma, scope.mutant_n, rules, mutant)
        refuted = r.verdict == "counterexample"
        evidence = f"N={scope.mutant_n}: {model_summary(r.model)}" if refuted else \
            f"verdict {r.verdict} at N={scope.mutant_n}"
        verdicts.append(MutantVerdict(mutant, describe(mutant), refuted, evidence))
    name, statement, _ = lemma.control
    controls = [run_lemma(lemma, n, variant=name, control=True) for n in ns]
    told_apart = all(r.verdict == "proved" for r in controls)
    verdicts.append(MutantVerdict(
        name, statement, told_apart,
        f"no witness at N = {compact_ns(ns)}" if told_apart else
        f"{controls[0].verdict} at N={controls[0].n}: {model_summary(controls[0].model)}"))
    kind = "Z3 fact (witness)" if lemma.expect_sat else "Z3 bounded lemma"
    detail = f"{lemma.name}: {lemma.statement}"
    if bad:
        detail += f"; FAILED at N={bad[0].n}: {bad[0].verdict} {model_summary(bad[0].model)}"
    elif lemma.expect_sat and results:
        detail += f"; witness at N={results[0].n}: {model_summary(results[0].model)}"
    return [Row(lemma.obligation, kind, f"N = {compact_ns(ns)}", not bad,
                time.perf_counter() - start, tuple(verdicts), detail, lemma.requirements,
                {"lemma": lemma.name, "per_n": [{"n": r.n, "verdict": r.verdict,
                                                 "seconds": round(r.seconds, 4),
                                                 "model": r.model} for r in results]})]


def bmc_job(scope: Scope) -> list[Row]:
    """R-SKEW-1 by BMC: no trace (arrivals and adversarial releases) of <= depth steps
    puts an acquire above min + m, for m = 0, 1, 2; the off-by-one mutant has one."""
    start = time.perf_counter()
    depth = scope.bmc_depth
    found = [(m, shortest_trace(3, 3, depth, margin=m, bad="decision_skew", bound=m))
             for m in (0, 1, 2)]
    holds = not any(r.found for _, r in found)
    mutant = shortest_trace(3, 3, depth, margin=1, bad="decision_skew", bound=1,
                            parts=encoded_mutant("keep_band_plus_one").parts)
    evidence = "; ".join(f"{s.op} {s.index}->{s.server} {s.path} {list(s.loads_before)}"
                         for s in mutant.steps)
    verdict = MutantVerdict("keep_band_plus_one", describe("keep_band_plus_one"),
                            mutant.found, f"trace of {mutant.depth}: {evidence}"
                            if mutant.found else f"no trace up to depth {depth}")
    return [Row(3, "Z3 BMC (releases adversarial)", f"N=3, 3 ids, depth <= {depth}, m=0,1,2",
                holds, time.perf_counter() - start, (verdict,),
                "no trace reaches an acquire above min + m" if holds else
                "a trace violates per-decision skew", ("R-SKEW-1",),
                {"depth": depth, "margins": [0, 1, 2]})]


def counterexample_job(write: Path | None) -> list[Row]:
    """R-SKEW-4's witnesses, replayed through the real core, compared with the files.

    With ``write`` the regenerated witnesses are also written to that directory.
    """
    start = time.perf_counter()
    problems: list[str] = []
    notes: list[str] = []
    docs = []
    for spec in counterexamples.COUNTEREXAMPLES:
        doc = counterexamples.generate(spec)
        if doc is None:
            problems.append(f"{spec.name}: no witness within depth {spec.max_depth}")
            continue
        try:
            seen = counterexamples.violation(doc)
        except ValueError as exc:  # the core does not take the decisions Z3 derived
            problems.append(f"{spec.name}: Z3 witness does not replay on the core: {exc}")
            continue
        if seen is None:
            problems.append(f"{spec.name}: the core's replay does not violate the property")
            continue
        path = counterexamples.DIRECTORY / f"{spec.name}.json"
        text = counterexamples.dumps(doc)
        if write is not None:
            write.mkdir(parents=True, exist_ok=True)
            (write / path.name).write_text(text, encoding="utf-8")
        if not path.exists():
            problems.append(f"{path.name} missing (in a checkout: affinity verify "
                            "--write-counterexamples proofs/counterexamples)")
        else:
            stored = counterexamples.load(path)
            try:
                still = counterexamples.violation(stored)
            except ValueError as exc:
                still, why = None, f"does not replay: {exc}"
            else:
                why = "no longer violates the property"
            if still is None:
                problems.append(f"{path.name}: the checked-in trace {why}")
            elif json.loads(text) != stored:  # witnesses are canonical: a diff is drift
                problems.append(f"{path.name} differs from the regenerated witness (rewrite "
                                "with affinity verify --write-counterexamples "
                                "proofs/counterexamples if intended)")
        docs.append({"name": spec.name, "steps": len(doc["steps"]), "violation": seen})
    detail = "; ".join(f"{d['name']}: {d['violation']}" for d in docs)
    if problems:
        detail = "; ".join(problems)
    return [Row(3, "Z3 BMC witnesses -> proofs/counterexamples",
                "N=2..3, shortest traces", not problems, time.perf_counter() - start, (),
                detail + ("; " + "; ".join(notes) if notes else ""), ("R-SKEW-4",),
                {"counterexamples": docs, "notes": notes})]


# -------------------------------------------------------------------- conformance
CONFORMANCE_MUTANTS = ("keep_strict_lt", "keep_band_plus_one", "margin_zero_means_off",
                       "margin_null_as_zero", "ties_last_in_order", "break_does_not_repin",
                       "break_keeps_old_server", "margin_under_determinism",
                       "gate_disable_inverted", "min_ignores_idle")


def conformance_job(scope: Scope) -> list[Row]:
    from .mutants import by_name

    start = time.perf_counter()
    result = conformance.run(scope.conformance_sample)
    verdicts = []
    for name in CONFORMANCE_MUTANTS:
        with by_name(name).applied():
            r = conformance.run(scope.conformance_sample, max_failures=1)
        verdicts.append(MutantVerdict(name, describe(name), bool(r.failures),
                                      r.failures[0] if r.failures else
                                      f"no disagreement in {r.points} points"))
    detail = f"{result.points} concrete acquires: functional, relational and legacy " \
             "encodings agree with affinity_engine.step / legacy_acquire"
    if result.failures:
        detail = "; ".join(result.failures)
    return [Row(0, "Z3 encoding == real core (concrete)",
                f"N<=2 exhaustive + {scope.conformance_sample} at N=3,4", not result.failures,
                time.perf_counter() - start, tuple(verdicts), detail,
                ("R-KEEP-1", "R-TIE-1", "R-REL-1", "R-LEG-1"), {"points": result.points})]


# ---------------------------------------------------------------------------- BFS
def _summary(run: BfsRun, result: BfsResult) -> dict[str, Any]:
    from affinity_engine.codec import config_to_json

    from .bfs_tasks import env_of

    _, env_checks = env_of(run)
    from .bfs_checks import CHECKS

    active = sorted({c.obligation for c in (*CHECKS, *env_checks) if c.applies(run.config)})
    return {
        "label": run.label, "env": run.env, "scope": run.describe(),
        "config": config_to_json(run.config), "expects_violation": run.expects_violation,
        "obligations": active if not run.expects_violation else
        sorted({c.obligation for c in env_checks}),
        "states": result.states, "edges": result.edges,
        "seconds": round(result.seconds, 3),
        "states_per_second": round(result.states_per_second),
        "truncated": result.truncated,
        "violations": [{"check": v.check, "obligation": v.obligation, "message": v.message,
                        "trace": describe_trace(v), "length": len(v.trace)}
                       for v in result.violations],
    }


def bfs_spec_job(run: BfsRun) -> dict[str, Any]:
    return _summary(run, run_spec(run))


def bfs_mutant_job(mutant: str, obligation: int, runs: tuple[BfsRun, ...],
                   env_only: bool) -> dict[str, Any]:
    found = run_mutant(mutant, obligation, runs, env_only=env_only)
    v = found.violation
    return {"mutant": mutant, "obligation": obligation, "env_only": env_only,
            "refuted": v is not None, "run": found.run_label, "states": found.states,
            "seconds": round(found.seconds, 3),
            "evidence": describe_trace(v) if v is not None else
            f"no violation in {found.states} states"}


def symmetry_job(scope: Scope) -> list[Row]:
    """The reduction is sound where used: reduced states == orbits of the full space.
    Control: on the stable hash mode (decisions read server names) it must not be."""
    start = time.perf_counter()
    ok, reduced, orbits, _ = symmetry_sound(scope.symmetry_check)
    control = attrs.evolve(scope.symmetry_check, label="stable hash (name-dependent)",
                           config=attrs.evolve(scope.symmetry_check.config,
                                               full_determinism=True, hash_mode="stable",
                                               tie_break="first"))
    c_ok, c_reduced, c_orbits, _ = symmetry_sound(control)
    verdict = MutantVerdict(
        "symmetry_on_stable_hash", "symmetry reduction applied where decisions read names",
        not c_ok, f"reduced {c_reduced} states vs {c_orbits} orbits of the full space")
    return [Row(0, "BFS symmetry reduction sound", scope.symmetry_check.describe(), ok,
                time.perf_counter() - start, (verdict,),
                f"{scope.symmetry_check.label}: {reduced} reduced states == {orbits} orbits",
                ("R-TIE-3", "R-REL-1"), {"reduced": reduced, "orbits": orbits})]


# ------------------------------------------------------------- subprocess methods
CROSSHAIR_SPEC = {  # wrapper -> (obligation, mutant wrapper, mutant name)
    "keep_pin_3": (6, "keep_pin_3_mutant", "keep_strict_lt"),
    "decide_3": (3, "decide_3_mutant", "keep_band_plus_one"),
    "decide_3#starvation": (12, "decide_3_idle_mutant", "min_ignores_idle"),
    "decide_margin_zero_3": (4, "decide_margin_zero_3_mutant", "margin_zero_means_off"),
    "keep_at_two_margins_3": (5, "keep_at_two_margins_3_mutant", "keep_comparison_flipped"),
    "decide_deterministic_3": (2, "decide_deterministic_3_mutant",
                               "margin_under_determinism"),
}


MUTANT_CONDITION_TIMEOUT = 4.0
# CrossHair's budget is wall-clock time, so on a loaded machine (CI runs Ray and vLLM beside
# it) a mutant that is refuted in 0.7 s alone can run out of budget. A survivor is rerun
# alone with this much larger budget before it is called a survivor; a refuted mutant stops
# at its first counterexample, so neither budget costs time unless the mutant truly survives.
MUTANT_RETRY_CONDITION_TIMEOUT = 30.0


def _refute_mutants(names: list[str], timeout: float) -> dict[str, crosshair_run.FunctionVerdict]:
    """Each mutant wrapper's verdict, survivors of the shared run rerun one by one."""
    first = crosshair_run.run_check(names, timeout)
    verdicts = {name: first.verdict(name) for name in names}
    for name in names:
        if not verdicts[name].refuted:
            verdicts[name] = crosshair_run.run_check(
                [name], MUTANT_RETRY_CONDITION_TIMEOUT).verdict(name)
    return verdicts


def crosshair_jobs(scope: Scope) -> list[Row]:
    start = time.perf_counter()
    specs = sorted({k.split("#")[0] for k in CROSSHAIR_SPEC})
    mutants = [v[1] for v in CROSSHAIR_SPEC.values()]
    timeout = scope.crosshair_condition_timeout
    spec_run = crosshair_run.run_check(specs, timeout)
    # A mutant's search stops at its first counterexample, so a larger budget only costs
    # time when a mutant survives (which fails the run anyway).
    mutant_start = time.perf_counter()
    mutant_verdicts = _refute_mutants(mutants, max(timeout, MUTANT_CONDITION_TIMEOUT))
    mutant_seconds = time.perf_counter() - mutant_start
    rows = []
    scope_text = f"3 servers, {timeout}s/condition"
    for key, (obligation, mutant_fn, mutant_name) in CROSSHAIR_SPEC.items():
        name = key.split("#")[0]
        spec = spec_run.verdict(name)
        mut = mutant_verdicts[mutant_fn]
        holds = spec.confirmed_or_open and not spec_run.stray
        detail = f"{name}: " + (", ".join(spec.verdicts) or "no verdicts")
        if spec.errors or spec_run.stray:
            detail += "; " + "; ".join((*spec.errors, *spec_run.stray))
        rows.append(Row(obligation, "CrossHair contracts", scope_text, holds,
                        spec_run.seconds + mutant_seconds,
                        (MutantVerdict(mutant_name, describe(mutant_name), mut.refuted,
                                       "; ".join(mut.errors) or "no counterexample"),),
                        detail, evidence={"wrapper": name, "verdicts": list(spec.verdicts)}))
    diff_timeout = scope.crosshair_diff_timeout
    same = crosshair_run.run_diff("legacy_decide_3", "core_decide_null_3", diff_timeout)
    other = crosshair_run.run_diff("legacy_decide_3", "core_decide_null_3_mutant",
                                   min(diff_timeout, 1.5))
    if not other.differs:  # same wall-clock caveat as _refute_mutants
        other = crosshair_run.run_diff("legacy_decide_3", "core_decide_null_3_mutant",
                                       MUTANT_RETRY_CONDITION_TIMEOUT)
    rows.append(Row(1, "CrossHair diffbehavior", f"3 servers, {diff_timeout}s/condition",
                    same.equivalent, time.perf_counter() - start - spec_run.seconds
                    - mutant_seconds,
                    (MutantVerdict("margin_null_as_zero", describe("margin_null_as_zero"),
                                   other.differs, other.output.replace("\n", " ")),),
                    "legacy_decide_3 vs core_decide_null_3: " + same.output.splitlines()[0]
                    if same.output else "no output", ("R-LEG-1", "R-TIE-3")))
    return rows


def determinism_job() -> list[Row]:
    start = time.perf_counter()
    result = det_trace.run_processes()
    # The mutant reads pool order: one seed in both server orders is enough to refute it.
    mutant = det_trace.run_processes(seeds=("0",), mutant="stable_hash_uses_pool_order",
                                     control=False)
    holds = result.stable_identical and result.builtin_differs
    verdict = MutantVerdict(
        "stable_hash_uses_pool_order", describe("stable_hash_uses_pool_order"),
        not mutant.stable_identical,
        "traces differ between processes: " + mutant.detail if not mutant.stable_identical
        else "traces identical: " + mutant.detail)
    detail = result.detail + ("" if result.builtin_differs else
                              "; NEGATIVE CONTROL FAILED: builtin hash traces identical")
    return [Row(2, "subprocesses x PYTHONHASHSEED", "0, 12345, random; reversed pool order",
                holds, time.perf_counter() - start, (verdict,), detail,
                ("R-DET-3", "R-HASH-1", "R-PURE-1"))]
