"""The machinery of an all-N lemma: how one is stated, varied by a mutant, and checked.

Theory of operation
-------------------
A :class:`ParamLemma` builds ``hypotheses and not goal`` over the symbolic pool of
:mod:`.z3_param` (``n`` unknown, loads an array, any integer hash). UNSAT proves the lemma
for **all N >= 1**; a SAT model is a counterexample, read back as a concrete ``n`` and the
loads at positions ``0 .. n-1``. A :class:`Variant` is the pieces a formula is built with:
the spec's (:data:`SPEC_VARIANT`), or one encoded mutant's (:mod:`.z3_mutants`). :func:`run`
checks the spec and each mutant with the *same* formula builder and solver settings; a
mutant must be refuted (SAT).

The lemmas themselves live in :mod:`.z3_param_lemmas` (margin, gate, determinism, ties) and
:mod:`.z3_band_lemmas` (the context band); :mod:`.z3_all_n` lists them together. Both import
this module and neither imports the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import z3

from .z3_param import SPEC_POOL_PARTS, PoolParts

__all__ = ["MUTANT_HINT_N", "SPEC_VARIANT", "Formula", "ParamLemma", "ParamResult", "Variant",
           "run"]

Term = Any
Formula = tuple[Term, Term]  # (hypotheses, negated goal)


@attrs.frozen
class Variant:
    """The pieces a formula is built with: the spec's, or one encoded mutant's."""

    name: str = "spec"
    parts: PoolParts = SPEC_POOL_PARTS
    # A search hint for mutants: ``n <= hint_n`` is added to the formula (Z3's model finder
    # with quantifiers is otherwise erratic, and small counterexamples read better). A model
    # of the restricted formula is a model of the formula, so a refutation is just as
    # sound; the spec's proofs never carry a hint.
    hint_n: int | None = None


@attrs.frozen
class ParamLemma:
    name: str
    obligation: int
    requirements: tuple[str, ...]
    statement: str
    build: Callable[[Variant], Formula]  # (hypotheses, negated goal)
    mutants: tuple[Variant, ...]


@attrs.frozen
class ParamResult:
    lemma: str
    variant: str
    # "proved" (UNSAT, hypotheses satisfiable), "vacuous" (UNSAT, but so are the
    # hypotheses), "counterexample" (SAT), "no counterexample" (a mutant's formula is
    # UNSAT: the mutant is equivalent on this lemma), "unknown" (timeout)
    verdict: str
    seconds: float
    model: dict[str, Any] | None = None


SPEC_VARIANT = Variant()
MUTANT_HINT_N = 8


def _model(model: Any) -> dict[str, Any]:
    """The counterexample: ``n``, the scalar inputs and the loads -- all of them for
    ``n <= 16``, else at the positions the model names (pin, minimum, choice, ...)."""
    out: dict[str, Any] = {}
    arrays: dict[str, Any] = {}
    for decl in model.decls():
        if decl.arity() > 0:
            continue
        value = model[decl]
        if decl.range() == z3.ArraySort(z3.IntSort(), z3.IntSort()):
            arrays[decl.name()] = decl()
        elif z3.is_bool(value):
            out[decl.name()] = bool(z3.is_true(value))
        elif z3.is_int_value(value):
            out[decl.name()] = int(value.as_long())
    n = out.get("n")
    if isinstance(n, int) and n > 0:
        named = sorted({v for k, v in out.items() if isinstance(v, int)
                        and not isinstance(v, bool) and 0 <= v < n and k != "n"})
        positions = range(n) if n <= 16 else named
        for name, array in arrays.items():
            values = {i: int(model.eval(array[i], model_completion=True).as_long())
                      for i in positions}
            out[name] = list(values.values()) if n <= 16 else {
                "at_positions": values}
    return dict(sorted(out.items()))


def _check(formula: Term, hint_n: int | None, timeout_s: float) -> tuple[Any, Any]:
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(formula)
    if hint_n is not None:
        solver.add(z3.Int("n") <= hint_n)
    answer = solver.check()
    return answer, solver.model() if answer == z3.sat else None


def run(lemma: ParamLemma, variant: Variant = SPEC_VARIANT,
        timeout_s: float = 30.0) -> ParamResult:
    """Check ``lemma`` for all N with the spec's rules or one encoded mutant's.

    A proof (UNSAT) is accepted only if the hypotheses alone are satisfiable -- a lemma
    whose hypotheses contradict each other would hold vacuously ("vacuous"). A mutant is
    searched under the hints ``n <= 2, 4, hint_n`` in turn (a model under a hint is a
    model of the formula), then without one."""
    start = time.perf_counter()
    hypotheses, negated_goal = lemma.build(variant)
    formula = z3.And(hypotheses, negated_goal)
    hints: list[int | None] = [None]
    if variant.hint_n is not None:
        hints = [*(h for h in (2, 4) if h < variant.hint_n), variant.hint_n, None]
    answer: Any = z3.unknown
    for hint in hints:
        left = timeout_s - (time.perf_counter() - start)
        if left <= 0:
            break
        answer, model = _check(formula, hint, left if hint is None else min(left, 5.0))
        if answer == z3.sat:
            return ParamResult(lemma.name, variant.name, "counterexample",
                               time.perf_counter() - start, _model(model))
        if answer == z3.unsat and hint is None:
            break
    if answer == z3.unsat and variant.hint_n is None:
        left = max(timeout_s - (time.perf_counter() - start), 1.0)
        consistent = any(_check(hypotheses, hint, min(left, 5.0))[0] == z3.sat
                         for hint in (2, 4, None))
        verdict = "proved" if consistent else "vacuous"
    else:
        verdict = "no counterexample" if answer == z3.unsat else "unknown"
    return ParamResult(lemma.name, variant.name, verdict, time.perf_counter() - start)
