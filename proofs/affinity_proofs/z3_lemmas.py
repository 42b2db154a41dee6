"""One-step Z3 lemmas and induction steps over ``N`` symbolic servers.

Theory of operation
-------------------
Each :class:`Lemma` builds, for a server count ``n`` and a rule variant
(:class:`~affinity_proofs.z3_model.Rules`), the formula ``assumptions and not goal``.
UNSAT proves the lemma for that ``n`` over *all* loads, pins, margins, gate thresholds,
hash indices and tie choices; a SAT model is a counterexample. A lemma marked
``expect_sat`` states a *fact* (a property that does not hold, e.g. the legacy rule's
unbounded skew): there the model is the witness and UNSAT would be the failure.

Every lemma lists encoded mutants; :func:`run_lemma` on a mutant must return a
counterexample. The encoding itself is cross-checked against the real core by
:mod:`.conformance`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import z3

from .z3_model import SPEC, AcquireVars, Decision, Rules, decide, extreme, keep_rule, legacy_decide

__all__ = ["LEMMAS", "Lemma", "LemmaResult", "lemma_by_name", "run_lemma"]

Term = Any


@attrs.frozen
class Lemma:
    name: str
    obligation: int
    requirements: tuple[str, ...]
    statement: str
    build: Callable[[int, Rules], tuple[Term, list[AcquireVars]]]
    mutants: tuple[tuple[str, Rules], ...]
    expect_sat: bool = False
    min_n: int = 1  # facts need two servers: with one, the pin is always the minimum


@attrs.frozen
class LemmaResult:
    lemma: str
    n: int
    variant: str  # "spec" or the mutant's name
    # "proved" (UNSAT), "witness" (SAT, as a fact lemma expects), "counterexample" (SAT
    # where UNSAT was claimed), "no witness" (a fact lemma found UNSAT), "unknown".
    verdict: str
    seconds: float
    model: dict[str, int | bool] | None = None

    @property
    def holds(self) -> bool:
        return self.verdict in ("proved", "witness")


def _vars(n: int, prefix: str = "") -> AcquireVars:
    """Every lemma but the legacy equivalence quantifies over *all* tie choices."""
    return AcquireVars(n, prefix, relational=True)


def _margin_case(a: AcquireVars) -> Term:
    return z3.And(a.domain(), a.margin_on, z3.Not(a.det))


def _chosen_load(a: AcquireVars, choice: Term) -> Term:
    return a.load_of(choice)


def _spread_after(a: AcquireVars, d: Decision) -> tuple[Term, Term]:
    """max - min of the post-increment loads, and the constraints defining it."""
    post = d.post_loads(a)
    low, low_def = extreme(post, "post_low", "min")
    high, high_def = extreme(post, "post_high", "max")
    return high - low, z3.And(low_def, high_def)


def _equivalence(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = AcquireVars(n)  # functional: the tie index must mean the same in both models
    d = decide(a, rules)
    constraint, legacy_choice = legacy_decide(a)
    same = z3.And(d.choice == legacy_choice, d.pin_after == legacy_choice,
                  *[x == y for x, y in zip(d.post_loads(a), [
                      a.loads[i] + z3.If(legacy_choice == i, 1, 0) for i in range(n)],
                      strict=True)])
    return z3.And(a.domain(), z3.Not(a.margin_on), z3.Not(a.gate_on), constraint,
                  z3.Not(same)), [a]


def _determinism(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a, b = _vars(n), _vars(n, "other_")
    same_request = z3.And(a.pin == b.pin, a.hit == b.hit, a.det_index == b.det_index,
                          a.det, b.det)
    return z3.And(a.domain(), b.domain(), same_request,
                  decide(a, rules).choice != decide(b, rules).choice), [a, b]


def _skew(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    d = decide(a, rules)
    return z3.And(_margin_case(a), _chosen_load(a, d.choice) > a.low + a.margin), [a]


def _legacy_skew(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    d = decide(a, rules)
    legacy = z3.And(a.domain(), z3.Not(a.margin_on), z3.Not(a.gate_on), z3.Not(a.det))
    return z3.And(legacy, _chosen_load(a, d.choice) > a.low + a.margin), [a]


def _induction_bounded(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    spread_after, defs = _spread_after(a, decide(a, rules))
    return z3.And(_margin_case(a), defs, a.high - a.low <= a.margin + 1,
                  spread_after > a.margin + 1), [a]


def _induction_nonincreasing(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    spread_after, defs = _spread_after(a, decide(a, rules))
    return z3.And(_margin_case(a), defs, a.high - a.low > a.margin + 1,
                  spread_after > a.high - a.low), [a]


def _margin_zero(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    d = decide(a, rules)
    return z3.And(_margin_case(a), a.margin == 0,
                  _chosen_load(a, d.choice) != a.low), [a]


def _monotone(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    m1, m2 = z3.Int("m1"), z3.Int("m2")
    return z3.And(_margin_case(a), z3.Not(a.gate_on), m1 >= 0, m2 >= m1,
                  keep_rule(a, rules, m1), z3.Not(keep_rule(a, rules, m2))), [a]


def _selectivity(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    d = decide(a, rules)
    inside = a.own <= a.low + a.margin
    return z3.And(_margin_case(a), a.hit, inside,
                  z3.Not(z3.And(d.kept, d.choice == a.pin))), [a]


def _break(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    d = decide(a, rules)
    correct = z3.And(d.choice != a.pin, _chosen_load(a, d.choice) == a.low,
                     d.pin_after == d.choice)
    return z3.And(a.domain(), z3.Not(a.det), d.broken, z3.Not(correct)), [a]


def _no_starvation(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    d = decide(a, rules)
    idle = z3.Or(*[x == 0 for x in a.loads])
    return z3.And(_margin_case(a), idle, _chosen_load(a, d.choice) > a.margin), [a]


def _gate_bound(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    d = decide(a, rules)
    load, low = _chosen_load(a, d.choice), a.low
    bound = z3.Or(load <= low + a.gate_abs, load * a.rel_den <= low * a.rel_num)
    return z3.And(a.domain(), a.gate_on, z3.Not(a.det), a.gate_abs > 0, z3.Not(bound)), [a]


GATE_WITNESS_GAP = 100  # the witness shows a kept pin more than this far above the minimum


def _gate_unbounded(n: int, rules: Rules) -> tuple[Term, list[AcquireVars]]:
    a = _vars(n)
    d = decide(a, rules)
    pr_defaults = z3.And(a.gate_abs == 4, a.rel_num == 3, a.rel_den == 2)  # abs 4, rel 1.5
    return z3.And(a.domain(), a.gate_on, z3.Not(a.det), pr_defaults, d.kept,
                  a.own - a.low > GATE_WITNESS_GAP), [a]


LEMMAS: tuple[Lemma, ...] = (
    Lemma("default_null_equivalence", 1, ("R-LEG-1", "R-ACQ-4", "R-TIE-1"),
          "margin None, no gate: choice, pin and loads equal the legacy model's",
          _equivalence, (("margin_null_as_zero", Rules(none_as_zero=True)),
                         ("ties_last_in_order", Rules(ties_from_end=True)))),
    Lemma("determinism_ignores_load_margin_gate", 2, ("R-DET-1", "R-DET-4"),
          "full_determinism: same pin/hash gives the same server whatever loads, margin, gate",
          _determinism, (("margin_under_determinism", Rules(margin_under_det=True)),)),
    Lemma("per_decision_skew", 3, ("R-SKEW-1", "R-KEEP-1", "R-PLACE-1"),
          "margin m: the chosen server's load <= min + m",
          _skew, (("keep_band_plus_one", Rules(keep_slack=1)),)),
    Lemma("legacy_violates_skew", 3, ("R-SKEW-4",),
          "fact: the legacy rule can choose load > min + m (witness expected)",
          _legacy_skew, (), expect_sat=True, min_n=2),
    Lemma("arrivals_spread_inductive", 3, ("R-SKEW-2",),
          "arrivals only: max - min <= m + 1 is preserved by every acquire",
          _induction_bounded, (("keep_band_plus_one", Rules(keep_slack=1)),)),
    Lemma("spread_nonincreasing_above_band", 3, ("R-SKEW-3",),
          "max - min > m + 1: an acquire never increases max - min",
          _induction_nonincreasing, (("keep_band_plus_two", Rules(keep_slack=2)),)),
    Lemma("margin_zero_least_loaded", 4, ("R-SKEW-5",),
          "margin 0: the chosen server is least-loaded",
          _margin_zero, (("margin_zero_means_off", Rules(margin_zero_off=True)),)),
    Lemma("keep_monotone_in_margin", 5, ("R-KEEP-4",),
          "kept at m1 implies kept at every m2 >= m1",
          _monotone, (("keep_comparison_flipped", Rules(keep_cmp="ge")),)),
    Lemma("selectivity", 6, ("R-KEEP-1", "R-KEEP-4"),
          "a pin with load <= min + m is kept",
          _selectivity, (("keep_strict_lt", Rules(keep_cmp="lt")),)),
    Lemma("break_correct", 7, ("R-BREAK-1", "R-BREAK-2"),
          "a break (margin or gate) moves to a different least-loaded server and re-pins",
          _break, (("break_keeps_old_server", Rules(break_stays=True)),
                   ("break_does_not_repin", Rules(break_repins=False)))),
    Lemma("no_starvation", 12, ("R-KEEP-3",),
          "margin m and an idle server: the chosen server's load <= m",
          _no_starvation, (("min_ignores_idle", Rules(floor_over_busy=True)),)),
    Lemma("gate_bound", 13, ("R-GATE-1", "R-GATE-2"),
          "gate abs > 0: chosen load <= min + abs or load <= min * rel",
          _gate_bound, (("gate_disable_inverted", Rules(gate_inverted=True)),)),
    Lemma("gate_no_constant_bound", 13, ("R-GATE-2",),
          f"fact: at abs 4, rel 1.5 a kept pin can sit > {GATE_WITNESS_GAP} above the min",
          _gate_unbounded, (), expect_sat=True, min_n=2),
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


def run_lemma(lemma: Lemma, n: int, rules: Rules = SPEC, variant: str = "spec",
              timeout_s: float = 120.0) -> LemmaResult:
    """Check ``lemma`` (or one of its encoded mutants) at ``n`` servers."""
    start = time.perf_counter()
    formula, variables = lemma.build(n, rules)
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(formula)
    answer = solver.check()
    seconds = time.perf_counter() - start
    if answer == z3.unknown:
        return LemmaResult(lemma.name, n, variant, "unknown", seconds)
    if answer == z3.sat:
        model = _model_values(solver.model(), variables)
        verdict = "witness" if lemma.expect_sat else "counterexample"
        return LemmaResult(lemma.name, n, variant, verdict, seconds, model)
    return LemmaResult(lemma.name, n, variant,
                       "no witness" if lemma.expect_sat else "proved", seconds)
