"""Bounded Z3 facts: witnesses of what the rules do *not* guarantee.

Theory of operation
-------------------
Every guarantee of the keep, break and gate rules is proved for **all N** by
:mod:`.z3_param_lemmas` and :mod:`.z3_band_lemmas`. What is left here are the two *facts*,
existential statements that need no quantifier over N: one witness at a small ``n`` shows
them, and a witness at ``n`` is a witness at every larger pool (pad it with busy servers).

* ``legacy_violates_skew`` (R-SKEW-4): verl's never-reconsidered pin can sit beyond
  ``min + m`` -- the skew the margin removes;
* ``gate_no_constant_bound`` (R-GATE-2): PR #6533's gate, at its defaults, keeps a pin more
  than :data:`GATE_WITNESS_GAP` above the minimum -- its bound grows with the load.

Each :class:`Lemma` builds, for a server count ``n``, the formula whose model is the
witness (:class:`~affinity_proofs.z3_model.AcquireVars`, relational, so any tie choice); an
UNSAT answer would be the failure. The encoding itself is cross-checked against the real
engine by :mod:`.conformance`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import z3

from .z3_model import SPEC_PARTS, AcquireVars, Parts, decide

__all__ = ["GATE_CONTROL_MIN", "GATE_WITNESS_GAP", "LEMMAS", "Lemma", "LemmaResult",
           "lemma_by_name", "run_lemma"]

Term = Any


@attrs.frozen
class Lemma:
    name: str
    obligation: int
    requirements: tuple[str, ...]
    statement: str
    build: Callable[[int, Parts], tuple[Term, list[AcquireVars]]]
    # The negative control: a neighbouring statement that has *no* witness, built the same
    # way and checked by the same solver in the same run (UNSAT expected). A checker that
    # found witnesses for everything would fail it.
    control: tuple[str, str, Callable[[int, Parts], tuple[Term, list[AcquireVars]]]]
    mutants: tuple[tuple[str, Parts], ...] = ()
    expect_sat: bool = True  # a fact: the model is the witness
    min_n: int = 2  # with one server, the pin is always the minimum


@attrs.frozen
class LemmaResult:
    lemma: str
    n: int
    variant: str  # "spec" or the mutant's name
    # "witness" (SAT, as a fact expects), "no witness" (UNSAT), "proved" (UNSAT where a
    # lemma claims UNSAT), "counterexample" (SAT there), "unknown".
    verdict: str
    seconds: float
    model: dict[str, int | bool] | None = None

    @property
    def holds(self) -> bool:
        return self.verdict in ("proved", "witness")


def _vars(n: int, prefix: str = "") -> AcquireVars:
    return AcquireVars(n, prefix, relational=True)


def _chosen_load(a: AcquireVars, choice: Term) -> Term:
    return a.load_of(choice)


def _legacy_skew(n: int, parts: Parts) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    d = decide(a, parts)
    legacy = z3.And(a.domain(), z3.Not(a.margin_on), z3.Not(a.gate_on), z3.Not(a.det))
    return z3.And(legacy, _chosen_load(a, d.choice) > a.low + a.margin), [a]


def _margin_skew(n: int, parts: Parts) -> tuple[Term, list[AcquireVars]]:
    """The control of ``legacy_violates_skew``: with a margin, no witness exists."""
    a = _vars(n)
    d = decide(a, parts)
    with_margin = z3.And(a.domain(), a.margin_on, z3.Not(a.gate_on), z3.Not(a.det))
    return z3.And(with_margin, _chosen_load(a, d.choice) > a.low + a.margin), [a]


GATE_WITNESS_GAP = 100  # the witness shows a kept pin more than this far above the minimum
GATE_CONTROL_MIN = 10  # below this minimum, the gate's bound is under the gap


def _gate_unbounded(n: int, parts: Parts) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    d = decide(a, parts)
    pr_defaults = z3.And(a.gate_abs == 4, a.rel_num == 3, a.rel_den == 2)  # abs 4, rel 1.5
    return z3.And(a.domain(), a.gate_on, z3.Not(a.det), pr_defaults, d.kept,
                  a.own - a.low > GATE_WITNESS_GAP), [a]


def _gate_small_minimum(n: int, parts: Parts) -> tuple[Term, list[AcquireVars]]:
    """The control of ``gate_no_constant_bound``: the gap needs a large minimum."""
    term, variables = _gate_unbounded(n, parts)
    return z3.And(term, variables[0].low <= GATE_CONTROL_MIN), variables


LEMMAS: tuple[Lemma, ...] = (
    Lemma("legacy_violates_skew", 3, ("R-SKEW-4",),
          "fact: the legacy rule can choose load > min + m (witness expected)",
          _legacy_skew, ("margin_has_no_skew_witness",
                         "control: with the margin on, no choice beyond min + m exists",
                         _margin_skew)),
    Lemma("gate_no_constant_bound", 13, ("R-GATE-2",),
          f"fact: at abs 4, rel 1.5 a kept pin can sit > {GATE_WITNESS_GAP} above the min",
          _gate_unbounded, ("gate_gap_needs_large_minimum",
                            f"control: with min <= {GATE_CONTROL_MIN}, no kept pin sits "
                            f"> {GATE_WITNESS_GAP} above it", _gate_small_minimum)),
)


def lemma_by_name(name: str) -> Lemma:
    for lemma in LEMMAS:
        if lemma.name == name:
            return lemma
    raise KeyError(f"unknown lemma {name!r}; known: {[x.name for x in LEMMAS]}")


def _model_values(model: Any, variables: list[AcquireVars]) -> dict[str, int | bool]:
    out: dict[str, int | bool] = {}
    for decl in sorted(model.decls(), key=lambda d: d.name()):
        value = model[decl]
        if decl.arity() > 0 or not (z3.is_bool(value) or z3.is_int_value(value)):
            continue  # Z3's auxiliary functions (e.g. for mod / div), not inputs
        out[decl.name()] = bool(z3.is_true(value)) if z3.is_bool(value) else int(
            value.as_long())
    return out


def run_lemma(lemma: Lemma, n: int, parts: Parts = SPEC_PARTS, variant: str = "spec",
              timeout_s: float = 120.0, control: bool = False) -> LemmaResult:
    """Check ``lemma`` at ``n`` servers, built with the spec's ``parts`` or an encoded
    mutant's, or with ``control`` its negative control, whose verdict is "proved" when no
    witness exists."""
    start = time.perf_counter()
    formula, variables = (lemma.control[2] if control else lemma.build)(n, parts)
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(formula)
    answer = solver.check()
    seconds = time.perf_counter() - start
    if answer == z3.unknown:
        return LemmaResult(lemma.name, n, variant, "unknown", seconds)
    if answer == z3.sat:
        model = _model_values(solver.model(), variables)
        verdict = "witness" if lemma.expect_sat and not control else "counterexample"
        return LemmaResult(lemma.name, n, variant, verdict, seconds, model)
    return LemmaResult(lemma.name, n, variant,
                       "no witness" if lemma.expect_sat and not control else "proved", seconds)
