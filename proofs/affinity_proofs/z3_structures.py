"""The load table's node merge, proved in Z3 for every fan-out and every subtree size.

Theory of operation
-------------------
``affinity_engine.loads`` keeps, in every node of its tree, the minimum, the count at the
minimum and the maximum of the loads below it. A leaf computes them with ``min``,
``tuple.count`` and ``max`` over its own loads -- the definitions themselves. An internal
node merges its children's summaries (``_summarise``):

    low = min(mins);  count = sum(counts[i] for i if mins[i] == low);  high = max(maxes)

If the merge is correct whenever the children are, every node of every height is correct
by induction on the height, with the leaves as the base case. This module proves the
merge for **every number of children k >= 1 and every child size**, over a symbolic array
of loads split into ``k`` consecutive non-empty segments ``[B(i), B(i+1))``:

* ``cover`` (induction on k): every position below ``B(k)`` lies in some segment;
* ``count_flat`` (induction on b): a segment with no load equal to ``v`` adds nothing to
  ``C(v, x)``, the number of positions before ``x`` holding ``v``;
* ``count_sum`` (induction on i): the code's running sum over the first ``i`` children
  equals ``C(low, B(i))`` -- so the merged count is the count at the minimum over the
  whole subtree (uses ``count_flat``);
* ``min_merge`` / ``max_merge``: ``min(mins)`` is the minimum of the subtree (uses
  ``cover``), and likewise the maximum.

The hypotheses are the children's correctness (their minimum is a load of their segment
and below none of it; their count is ``C(min_i, B(i+1)) - C(min_i, B(i))``). Each lemma has
an encoded mutant the same formula refutes: a merged count that sums every child (the
multi-leaf bug), a minimum taken from the first child, a maximum from the last one, a
segment list with gaps, a count that counts loads ``>= v``. The link to the Python
code is the structure check of :mod:`.structures`, which runs ``_summarise`` itself at
every structural boundary (and refutes the same multi-leaf count bug on the real core).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import attrs
import z3

__all__ = ["MERGE_LEMMAS", "MergeLemma", "run_merge"]

Term = Any
Formula = tuple[Term, Term]  # (hypotheses, negated goal)
_INT = z3.IntSort()
_FRESH = itertools.count()  # recursive functions cannot be redefined in one context


class _Tree:
    """Loads ``L``, ``k`` children with boundaries ``B`` and summaries, one merge."""

    def __init__(self, mutant: str = "") -> None:
        self.mutant = mutant
        self.L = z3.Array("loads", _INT, _INT)
        self.k = z3.Int("k")
        self.B = z3.Function("boundary", _INT, _INT)
        self.cmin = z3.Function("child_min", _INT, _INT)
        self.cmax = z3.Function("child_max", _INT, _INT)
        self.ccount = z3.Function("child_count", _INT, _INT)
        self.wmin = z3.Function("child_min_at", _INT, _INT)
        self.wmax = z3.Function("child_max_at", _INT, _INT)
        self.low, self.high = z3.Int("low"), z3.Int("high")
        self.j_low, self.j_high = z3.Int("low_child"), z3.Int("high_child")
        # Recursive definitions (define-fun-rec): Z3 unfolds them, so both proofs and
        # models stay within reach. Names are per variant: one definition per context.
        tag = f"{mutant or 'spec'}_{next(_FRESH)}"
        v, x, i = z3.Ints("rv rx ri")
        self.C = z3.RecFunction(f"count_before_{tag}", _INT, _INT, _INT)  # C(v, x)
        counted = z3.If(self.L[x - 1] >= v, 1, 0) if mutant == "count_at_least" else \
            z3.If(self.L[x - 1] == v, 1, 0)
        z3.RecAddDefinition(self.C, [v, x], z3.If(x <= 0, 0, self.C(v, x - 1) + counted))
        self.S = z3.RecFunction(f"running_count_{tag}", _INT, _INT)
        add = self.ccount(i - 1) if mutant == "count_sums_all" else \
            z3.If(self.cmin(i - 1) == self.low, self.ccount(i - 1), 0)
        z3.RecAddDefinition(self.S, [i], z3.If(i <= 0, 0, self.S(i - 1) + add))

    def in_seg(self, i: Term, x: Term) -> Term:
        end = self.B(i + 1) - 1 if self.mutant == "segments_leave_gaps" else self.B(i + 1)
        return z3.And(self.B(i) <= x, x < end)

    def structure(self) -> Term:
        i = z3.Int("i")
        return z3.And(
            self.k >= 1, self.B(0) == 0,
            z3.ForAll([i], z3.Implies(z3.And(i >= 0, i < self.k), self.B(i) != self.B(i + 1)
                                      if self.mutant == "boundaries_unordered"
                                      else self.B(i) < self.B(i + 1)),
                      patterns=[self.B(i + 1)]),
        )

    def child_bounds(self, i: Term, x: Term) -> Term:
        """Child ``i`` is right about position ``x``: inside its segment, min <= L[x] <= max.
        (An instance of the induction hypothesis on the height.)"""
        return z3.Implies(z3.And(i >= 0, i < self.k, self.in_seg(i, x)),
                          z3.And(self.L[x] >= self.cmin(i), self.L[x] <= self.cmax(i)))

    def child_summary(self, i: Term) -> Term:
        """Child ``i``'s min and max are loads of its segment and its count is the count
        of its min there. (An instance of the induction hypothesis on the height.)"""
        lo, hi = self.B(i), self.B(i + 1)
        return z3.Implies(z3.And(i >= 0, i < self.k), z3.And(
            self.in_seg(i, self.wmin(i)), self.L[self.wmin(i)] == self.cmin(i),
            self.in_seg(i, self.wmax(i)), self.L[self.wmax(i)] == self.cmax(i),
            self.ccount(i) == self.C(self.cmin(i), hi) - self.C(self.cmin(i), lo)))

    def monotone(self) -> Term:
        """B never decreases on [0, k] (:func:`_boundaries_monotone`, by induction)."""
        i, j = z3.Ints("mi mj")
        return z3.ForAll([i, j], z3.Implies(z3.And(i >= 0, i <= j, j <= self.k),
                                            self.B(i) <= self.B(j)),
                         patterns=[z3.MultiPattern(self.B(i), self.B(j))])

    def merged(self) -> Term:
        """``_summarise``: low = min(mins), the running count S, high = max(maxes)."""
        i = z3.Int("mi")
        j_low = 0 if self.mutant == "min_of_first_child" else self.j_low
        j_high = self.k - 1 if self.mutant == "max_of_last_child" else self.j_high
        return z3.And(
            self.j_low >= 0, self.j_low < self.k, self.j_high >= 0, self.j_high < self.k,
            self.low == self.cmin(j_low), self.high == self.cmax(j_high),
            z3.ForAll([i], z3.Implies(z3.And(i >= 0, i < self.k), z3.And(
                self.cmin(i) >= self.cmin(self.j_low), self.cmax(i) <= self.cmax(self.j_high))),
                      patterns=[self.cmin(i)]),
        )


def _cover(mutant: str) -> Formula:
    """Induction on n <= k: if every x < B(n) lies in a segment below n (witness seg),
    every x < B(n + 1) lies in one below n + 1 (seg extended by n); base B(0) = 0."""
    t = _Tree(mutant)
    n, x, y = z3.Int("n"), z3.Int("x"), z3.Int("y")
    seg = z3.Function("segment_of", _INT, _INT)
    hypothesis = z3.ForAll([y], z3.Implies(z3.And(y >= 0, y < t.B(n)), z3.And(
        seg(y) >= 0, seg(y) < n, t.in_seg(seg(y), y))), patterns=[seg(y)])
    extended = z3.If(x < t.B(n), seg(x), n)
    x0 = z3.Int("x0")
    base_fails = z3.And(x0 >= 0, x0 < t.B(0))  # P(0): no position lies below B(0)
    return (z3.And(t.structure(), n >= 0, n < t.k, hypothesis, x >= 0, x < t.B(n + 1)),
            z3.Or(base_fails,
                  z3.Not(z3.And(extended >= 0, extended < n + 1, t.in_seg(extended, x)))))


def _count_flat(mutant: str) -> Formula:
    """Induction on b: no load equal to v in [a, b) => C(v, b) = C(v, a)."""
    t = _Tree(mutant)
    a, b, v, y = z3.Ints("a b v y")
    none_equal = z3.ForAll([y], z3.Implies(z3.And(a <= y, y < b + 1), t.L[y] != v),
                           patterns=[t.L[y]])
    return (z3.And(t.structure(), a >= 0, a <= b, t.C(v, b) == t.C(v, a), none_equal),
            t.C(v, b + 1) != t.C(v, a))


def _count_sum(mutant: str) -> Formula:
    """Induction on i: S(i) = C(low, B(i)) implies S(i + 1) = C(low, B(i + 1)); base
    S(0) = C(low, B(0)) = 0. So the merged count S(k) is the count of the minimum over
    the whole subtree."""
    t = _Tree(mutant)
    i = z3.Int("i")
    lo, hi = t.B(i), t.B(i + 1)
    # count_flat (proved above) at child i's segment and the merged low: a child whose
    # minimum is above low holds no load equal to low (child_bounds), so adds nothing.
    flat = z3.Implies(t.cmin(i) > t.low, t.C(t.low, hi) == t.C(t.low, lo))
    return (z3.And(t.structure(), t.merged(), t.child_summary(i), flat,
                   i >= 0, i < t.k, t.S(i) == t.C(t.low, lo)),
            z3.Or(t.S(i + 1) != t.C(t.low, hi), t.S(0) != t.C(t.low, t.B(0))))


def _cover_hypothesis(t: _Tree, seg: Term) -> Term:
    y = z3.Int("y")
    return z3.ForAll([y], z3.Implies(z3.And(y >= 0, y < t.B(t.k)), z3.And(
        seg(y) >= 0, seg(y) < t.k, t.in_seg(seg(y), y))), patterns=[seg(y)])


def _boundaries_monotone(mutant: str) -> Formula:
    """Induction on j < k: B(i) <= B(j) implies B(i) <= B(j + 1)."""
    t = _Tree(mutant)
    i, j = z3.Ints("i j")
    return (z3.And(t.structure(), i >= 0, i <= j, j < t.k, t.B(i) <= t.B(j)),
            t.B(i) > t.B(j + 1))


def _min_merge(mutant: str) -> Formula:
    """low = min(child mins) is a load of the subtree and no load of it is below low."""
    t = _Tree(mutant)
    x = z3.Int("x")
    seg = z3.Function("segment_of", _INT, _INT)
    w = t.wmin(t.j_low)
    return (z3.And(t.structure(), t.merged(), _cover_hypothesis(t, seg), t.monotone(),
                   t.child_bounds(seg(x), x), t.child_summary(t.j_low)),
            z3.Or(z3.And(x >= 0, x < t.B(t.k), t.L[x] < t.low),
                  z3.Not(z3.And(w >= 0, w < t.B(t.k), t.L[w] == t.low))))


def _max_merge(mutant: str) -> Formula:
    """high = max(child maxes) is a load of the subtree and no load of it is above."""
    t = _Tree(mutant)
    x = z3.Int("x")
    seg = z3.Function("segment_of", _INT, _INT)
    w = t.wmax(t.j_high)
    return (z3.And(t.structure(), t.merged(), _cover_hypothesis(t, seg), t.monotone(),
                   t.child_bounds(seg(x), x), t.child_summary(t.j_high)),
            z3.Or(z3.And(x >= 0, x < t.B(t.k), t.L[x] > t.high),
                  z3.Not(z3.And(w >= 0, w < t.B(t.k), t.L[w] == t.high))))


@attrs.frozen
class MergeLemma:
    name: str
    statement: str
    build: Callable[[str], Formula]
    mutants: tuple[str, ...]


MERGE_LEMMAS: tuple[MergeLemma, ...] = (
    MergeLemma("cover", "k consecutive non-empty segments from 0 cover [0, B(k))",
               _cover, ("segments_leave_gaps",)),
    MergeLemma("boundaries_monotone", "segment boundaries never decrease",
               _boundaries_monotone, ("boundaries_unordered",)),
    MergeLemma("count_flat", "a segment without v adds nothing to the count of v",
               _count_flat, ("count_at_least",)),
    MergeLemma("count_sum", "merged count = count at the minimum over the whole subtree",
               _count_sum, ("count_sums_all",)),
    MergeLemma("min_merge", "min(child mins) = minimum over the subtree",
               _min_merge, ("min_of_first_child",)),
    MergeLemma("max_merge", "max(child maxes) = maximum over the subtree",
               _max_merge, ("max_of_last_child",)),
)


def _check(formula: Term, hint: Term | None, timeout_s: float) -> Any:
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(formula)
    if hint is not None:
        solver.add(hint)
    return solver.check()


def run_merge(lemma: MergeLemma, mutant: str = "", timeout_s: float = 20.0
              ) -> tuple[str, float]:
    """("proved" | "vacuous" | "counterexample" | "no counterexample" | "unknown", s)."""
    start = time.perf_counter()
    hypotheses, negated = lemma.build(mutant)
    formula = z3.And(hypotheses, negated)
    boundary = z3.Function("boundary", _INT, _INT)
    small = z3.And(z3.Int("k") == 2, boundary(1) == 1, boundary(2) == 3)
    if mutant:  # a model under a size hint is a model of the formula
        for hint in (small, None):
            if _check(formula, hint, min(timeout_s, 8.0)) == z3.sat:
                return "counterexample", time.perf_counter() - start
        return "no counterexample", time.perf_counter() - start
    answer = _check(formula, None, timeout_s)
    if answer != z3.unsat:
        return ("counterexample" if answer == z3.sat else "unknown"), \
            time.perf_counter() - start
    consistent = any(_check(hypotheses, hint, 5.0) == z3.sat for hint in (small, None))
    return ("proved" if consistent else "vacuous"), time.perf_counter() - start
