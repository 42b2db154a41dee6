"""The jobs of ``affinity verify`` that reach beyond the small world.

Theory of operation
-------------------
Three kinds of job, each returning finished :class:`~affinity_proofs.report.Row` objects
and each refuting its own mutants with the same checker in the same run:

* :func:`z3_param_job` -- one lemma of :mod:`.z3_param_lemmas`, proved for **all N >= 1**
  (symbolic pool size), and every encoded mutant listed with it refuted;
* :func:`structure_job` -- ``LoadTable`` or ``StickyLru`` against plain definitions at
  sizes across every structural boundary (:mod:`.structures`), with the structure
  mutants of :mod:`.mutants_beyond` applied to the real core;
* :func:`conformance_wide_job` -- the all-N encoding against the real core on the
  Hypothesis-drawn points of :mod:`.conformance_wide`, with the mutants that only bite
  there;
* :func:`merge_job` -- the load table's node merge proved for every fan-out and subtree
  size (:mod:`.z3_structures`), each lemma with its encoded mutant.

The rows carry ``all_n=True`` only for the Z3 proofs over a symbolic size (the lemmas
and the node merge); the others are checks at stated sizes and say so in their scope.
"""

from __future__ import annotations

import time

from . import conformance_wide, structures
from .mutants_band import BAND_WIDE_MUTANTS
from .mutants_beyond import beyond_by_name
from .report import MutantVerdict, Row
from .scopes import Scope
from .z3_all_n import param_lemma
from .z3_group_lemmas import GROUP_MUTANTS
from .z3_param_kit import ParamResult
from .z3_param_kit import run as run_param
from .z3_prefix_lemmas import PREFIX_MUTANTS
from .z3_structures import MERGE_LEMMAS, run_merge

__all__ = ["ALL_N_SCOPE", "BAND_SCOPE", "GROUP_SCOPE", "PREFIX_SCOPE", "STRUCTURE_MUTANTS",
           "WIDE_MUTANTS", "conformance_wide_job", "merge_job", "prefix_sweep_job",
           "structure_job", "z3_param_job"]

ALL_N_SCOPE = "N >= 1, loads >= 0, margins >= 0, every integer hash"
BAND_SCOPE = "N >= 1, loads >= 0, m >= 0, T >= 1, cap >= max(m, 1), context >= 0"
GROUP_SCOPE = ("N >= 1, loads >= 0, m >= 0 or either other policy, group_break_margin >= 0 "
               "or null, every integer hash, fallback and only, every own and group lookup")
PREFIX_SCOPE = ("N >= 1, loads >= 0, m >= 0 or either other policy, placement_margin >= 0 "
                "or null, every integer hash, every cached-prefix estimate >= 0")

_ENCODED = {  # encoded-only mutants of the all-N lemmas (no monkeypatch of the core)
    "tie_rank_counts_down": "tie rank decreases past a server above the minimum (encoded)",
    "tie_rank_double_step": "tie rank counts each minimum twice (encoded)",
    "hash_abs_mod": "deterministic index abs(h) % n instead of Python's h % n (encoded)",
    "hash_truncated_mod": "deterministic index by C's remainder: negative for h < 0 "
                          "(encoded)",
    "keep_band_plus_two": "keep rule off by two: load[pin] <= min + m + 2 (encoded)",
    "band_min_ignores_idle": "context band: the floor is the minimum over busy servers "
                             "(encoded)",
    "band_keep_strict_lt": "context band: load[pin] < min + band (encoded)",
    "band_break_keeps_old_server": "context band: a break returns the old server (encoded)",
    "segments_leave_gaps": "load table: a gap between consecutive children (encoded)",
    "boundaries_unordered": "load table: children's boundaries not increasing (encoded)",
    "count_at_least": "load table: a leaf counts loads >= v, not == v (encoded)",
    "count_sums_all": "load table: the merged count sums every child's (encoded)",
    "min_of_first_child": "load table: the merged min is the first child's (encoded)",
    "max_of_last_child": "load table: the merged max is the last child's (encoded)",
}


def _describe(name: str) -> str:
    if name in _ENCODED:
        return _ENCODED[name]
    if name in GROUP_MUTANTS:
        return GROUP_MUTANTS[name][1]
    if name in PREFIX_MUTANTS:
        return PREFIX_MUTANTS[name][1]
    try:
        return beyond_by_name(name).description
    except KeyError:
        return name


def _model_text(r: ParamResult) -> str:
    if not r.model:
        return "(no model)"
    keys = ("n", "loads", "other_loads", "hit", "pin", "margin_on", "margin", "m1", "m2",
            "band_on", "tokens", "tokens2", "cap", "ctx", "ctx2", "quot",
            "gate_on", "gate_abs", "rel_num", "rel_den", "det", "hash", "other_hash",
            "least", "tie", "legacy_choice", "i", "j", "t0", "idle",
            "grouped", "only", "own_removed", "ghit", "gpin", "gm_on", "gm",
            "mp_on", "mp", "placed", "repinned", "tied", "other")
    return " ".join(f"{k}={r.model[k]}" for k in keys if k in r.model)


def z3_param_job(name: str, timeout_s: float = 30.0) -> list[Row]:
    """One all-N lemma: the proof, then each encoded mutant refuted by the same formula."""
    lemma = param_lemma(name)
    start = time.perf_counter()
    result = run_param(lemma, timeout_s=timeout_s)
    verdicts = []
    results = [result]
    for variant in lemma.mutants:
        r = run_param(lemma, variant, timeout_s=timeout_s)
        results.append(r)
        refuted = r.verdict == "counterexample"
        verdicts.append(MutantVerdict(variant.name, _describe(variant.name), refuted,
                                      _model_text(r) if refuted else f"verdict {r.verdict}"))
    holds = result.verdict == "proved"
    detail = f"{lemma.name}: {lemma.statement}"
    if not holds:
        detail += f"; FAILED: {result.verdict} {_model_text(result)}"
    kind = "Z3 induction step, all N" if "spread" in name or name.startswith("tie_") \
        else "Z3 lemma, all N"
    scope = {"band": BAND_SCOPE, "group": GROUP_SCOPE, "prefix": PREFIX_SCOPE}.get(
        lemma.name.split("_")[0], ALL_N_SCOPE)
    return [Row(lemma.obligation, kind, scope, holds, time.perf_counter() - start,
                tuple(verdicts), detail, lemma.requirements,
                {"lemma": lemma.name, "all_n": True,
                 "results": [{"variant": r.variant, "verdict": r.verdict,
                              "seconds": round(r.seconds, 4), "model": r.model}
                             for r in results]},
                all_n=holds)]


STRUCTURE_MUTANTS = {
    "load_table": ("tie_count_sums_children", "load_summary_not_refreshed"),
    "sticky_lru": ("lru_touch_keeps_oldest", "lru_put_refreshes_in_place",
                   "hit_does_not_refresh_lru", "lru_evicts_one_late",
                   "lru_old_version_reuses_store", "lru_rederive_ignores_deletions"),
}
_STRUCTURE_ROWS = {  # structure -> (obligation, requirement ids, sizes)
    "load_table": (1, ("R-TIE-1", "R-POOL-1", "R-ST-1"),
                   f"N = {', '.join(map(str, structures.LOAD_SIZES))}"),
    "sticky_lru": (10, ("R-LRU-1", "R-LRU-2", "R-LRU-3", "R-LRU-4", "R-LRU-5"),
                   f"capacity {', '.join(map(str, structures.LRU_CAPACITIES))}"),
}


def refinement_job(scope: Scope) -> list[Row]:
    """Obligation 21 beyond the small world: wide traces, old states and every vector,
    with the engine mutants refuted by the same comparison."""
    import affinity_engine

    from .refinement import ENGINE_MUTANTS, refinement_run

    start = time.perf_counter()
    steps = scope.refinement_steps
    result = refinement_run(21, steps)
    verdicts = []
    for mutant in ENGINE_MUTANTS:
        with mutant.patch():
            r = refinement_run(21, steps, families=mutant.families)
        verdicts.append(MutantVerdict(mutant.name, mutant.description, r.failure is not None,
                                      r.failure or f"no disagreement in {r.steps} steps"))
    detail = result.failure or (
        f"affinity_engine ({affinity_engine.BUILD} build) == affinity_core on "
        f"{result.steps} steps of {result.traces} traces: outcome, abstracted state, status "
        "and allowed set at every step")
    return [Row(21, "engine vs reference (wide traces, vectors, old states)",
                f"N 1..2000, caches 1..1025, every vector, {steps} steps per small trace",
                result.failure is None, time.perf_counter() - start, tuple(verdicts), detail,
                ("R-REF-1",), {"steps": result.steps, "traces": result.traces,
                               "package": "affinity_engine", "build": affinity_engine.BUILD})]


def structure_job(structure: str, scope: Scope) -> list[Row]:
    start = time.perf_counter()
    ops = scope.structure_operations
    result = structures.run(structure, ops)
    verdicts = []
    for name in STRUCTURE_MUTANTS[structure]:
        with beyond_by_name(name).applied():
            r = structures.run(structure, ops)
        verdicts.append(MutantVerdict(name, _describe(name), r.failure is not None,
                                      r.failure or f"no disagreement in {r.operations} "
                                      "operations"))
    obligation, requirements, sizes = _STRUCTURE_ROWS[structure]
    what = "LoadTable summaries == min/count/max/k-th tie over the plain list" \
        if structure == "load_table" else "StickyLru recency == the LRU list of R-LRU-1..5"
    detail = result.failure or f"{what}: {result.operations} operations, each checked"
    return [Row(obligation, f"{'LoadTable' if structure == 'load_table' else 'StickyLru'} "
                "vs plain definition", f"{sizes}, {ops} ops each (every boundary)",
                result.failure is None, time.perf_counter() - start, tuple(verdicts),
                detail, requirements, {"operations": result.operations})]


WIDE_MUTANTS = ("tie_count_sums_children", "gate_relative_inverted", "caller_hash_abs_mod",
                "hashed_unkeyed_takes_first", "ties_last_in_order", *BAND_WIDE_MUTANTS)


def conformance_wide_job(scope: Scope) -> list[Row]:
    start = time.perf_counter()
    general = conformance_wide.points(scope.wide_conformance_points)
    banded = conformance_wide.points(scope.wide_conformance_points // 2, band=True)
    sample = general + banded
    result = conformance_wide.run(0, sample=sample)
    verdicts = []
    for name in WIDE_MUTANTS:
        # the same points; a band control meets the band's first (it stops at its first
        # disagreement)
        order = banded + general if name in BAND_WIDE_MUTANTS else sample
        with beyond_by_name(name).applied():
            r = conformance_wide.run(0, max_failures=1, sample=order)
        verdicts.append(MutantVerdict(name, _describe(name), bool(r.failures),
                                      r.failures[0] if r.failures else
                                      f"no disagreement in {r.points} points"))
    detail = (f"{result.points} Hypothesis points (derandomized): the all-N encoding agrees "
              f"with affinity_engine.step; N <= {result.max_n}, loads <= {result.max_load}, "
              f"{result.negative_hashes} negative caller hashes, {result.gate_min_ge_4} gate "
              f"points with min >= 4, {result.band_points} context-band points "
              f"({result.band_hits_at_edge} hits at the band's edge)")
    if result.failures:
        detail = "; ".join(result.failures)
    return [Row(0, "Z3 all-N encoding == real core (wide)",
                f"{result.points} points, N <= {result.max_n}, loads <= {result.max_load}, "
                "hashes +-2^70", not result.failures, time.perf_counter() - start,
                tuple(verdicts), detail, ("R-KEEP-1", "R-TIE-1", "R-TIE-4", "R-DET-2",
                                          "R-GATE-1", "R-REL-1", "R-BAND-1", "R-BAND-3"),
                {"points": result.points, "max_n": result.max_n,
                 "max_load": result.max_load, "negative_hashes": result.negative_hashes,
                 "gate_min_ge_4": result.gate_min_ge_4, "band_points": result.band_points,
                 "band_hits_at_edge": result.band_hits_at_edge})]


def prefix_sweep_job(scope: Scope) -> list[Row]:
    """Prefix-aware placement's encoding against the reference at concrete points, with a
    control on each side (a drifted reference, a drifted encoding) refuted by the sweep."""
    from .conformance_prefix import SWEEP_MUTANTS, run_with
    from .conformance_prefix import run as sweep

    start = time.perf_counter()
    count = scope.prefix_sweep_points
    result = sweep(count)
    verdicts = []
    for mutant in SWEEP_MUTANTS:
        r = run_with(mutant, count)
        verdicts.append(MutantVerdict(mutant.name, mutant.description, r.failure is not None,
                                      r.failure or f"no disagreement in {r.points} points"))
    detail = result.failure or (
        f"{result.points} points: at each, the positions the all-N prefix encoding permits "
        "are exactly affinity_core.allowed's (N <= 6, loads <= 4, placement_margin null or "
        "0..3, margins null or 0..2, misses, hits, removed pins, full_determinism)")
    return [Row(0, "Z3 prefix encoding == reference (points)",
                f"{count} points, N <= 6, loads <= 4", result.failure is None,
                time.perf_counter() - start, tuple(verdicts), detail,
                ("R-PFX-2", "R-PFX-3", "R-PFX-5"), {"points": result.points})]


MERGE_SCOPE = "every fan-out k >= 1, every subtree size; with the leaves, every height"


def merge_job() -> list[Row]:
    """LoadTable's node merge for every size: each lemma proved, each mutant refuted."""
    start = time.perf_counter()
    failed: list[str] = []
    verdicts = []
    results = []
    for lemma in MERGE_LEMMAS:
        verdict, seconds = run_merge(lemma)
        results.append({"lemma": lemma.name, "verdict": verdict, "seconds": round(seconds, 4)})
        if verdict != "proved":
            failed.append(f"{lemma.name}: {verdict}")
        for mutant in lemma.mutants:
            m_verdict, _ = run_merge(lemma, mutant)
            verdicts.append(MutantVerdict(mutant, _describe(mutant),
                                          m_verdict == "counterexample",
                                          f"{lemma.name}: {m_verdict}"))
    detail = ("node merge: min(mins), the count over children at the minimum and "
              "max(maxes) equal the definitions over the subtree (" +
              ", ".join(lemma.name for lemma in MERGE_LEMMAS) + ")")
    if failed:
        detail = "FAILED: " + "; ".join(failed)
    return [Row(1, "Z3 LoadTable merge, induction", MERGE_SCOPE, not failed,
                time.perf_counter() - start, tuple(verdicts), detail,
                ("R-TIE-1", "R-ST-1"), {"lemmas": results}, all_n=not failed)]
