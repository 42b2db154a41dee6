"""One-step lemmas and induction steps proved for every pool size N >= 1.

Theory of operation
-------------------
Each :class:`ParamLemma` builds ``hypotheses and not goal`` over the symbolic pool of
:mod:`.z3_param` (``n`` unknown, loads an array, any integer hash). UNSAT proves the
lemma for **all N >= 1**, all loads >= 0, all margins >= 0, all gate thresholds, all tie
choices and all integer hashes; a SAT model is a counterexample, read back as a concrete
``n`` and the loads at positions ``0 .. n-1``.

Two lemmas are about the tie rank itself (the count of minima before a position), by
induction on the position: it never decreases (:data:`RANK_MONOTONE`), and every rank
below the tie count is reached at some position (:data:`TIE_EXISTS`). The default-null
equivalence assumes exactly these two facts -- the ``tie``-th tie exists and is unique --
and nothing else about the rank.

Every lemma lists the encoded mutants it must refute (:func:`.z3_mutants.paired`: the spec's
pieces with a keep, break, hash or rank piece replaced); :mod:`.z3_param_kit` checks them
with the same formula builder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import z3

from .z3_mutants import paired
from .z3_param import Pool, decide, in_pool, keep_rule, legacy_decide, post_loads, rank_defs
from .z3_param_kit import Formula, ParamLemma, Variant

__all__ = ["PARAM_LEMMAS"]

Term = Any


def _margin_case(p: Pool) -> Term:
    return z3.And(p.domain(), p.margin_on, z3.Not(p.det))


def _spread_exceeds(p: Pool, post: Term, bound: Term) -> Term:
    """Not (max - min of ``post`` <= bound): two positions further apart than ``bound``."""
    i, j = z3.Int("spread_i"), z3.Int("spread_j")
    return z3.And(in_pool(i, p.n), in_pool(j, p.n), post[i] - post[j] > bound)


def _rank(v: Variant, p: Pool, name: str = "rank") -> Term:
    rank = z3.Function(name, z3.IntSort(), z3.IntSort())
    return rank, v.parts.rank_defs(p, rank)


def _rank_monotone(v: Variant) -> Formula:
    """Induction step on j: rank(i) <= rank(j) implies rank(i) <= rank(j + 1)."""
    p = v.parts.pool()
    rank, defs = _rank(v, p)
    i, j = z3.Int("i"), z3.Int("j")
    return (z3.And(p.domain(), defs, i >= 0, i <= j, j < p.n, rank(i) <= rank(j)),
            rank(i) > rank(j + 1))


def _tie_exists(v: Variant) -> Formula:
    """Induction step on j, constructively: if ``witness(t)`` (t < rank(j)) is a position
    q < j where the rank steps from t to t + 1, then ``witness(t)`` for t < rank(j) and
    ``j`` for t = rank(j) are such positions for every t < rank(j + 1). (Base j = 0:
    rank(0) = 0, nothing to show.) So the tie-th tie exists for every tie < rank(n)."""
    p = v.parts.pool()
    rank, defs = _rank(v, p)
    j, t = z3.Int("j"), z3.Int("t")
    witness = z3.Function("witness", z3.IntSort(), z3.IntSort())

    def steps_at(q: Term, t: Term, bound: Term) -> Term:
        return z3.And(q >= 0, q < bound, rank(q) == t, rank(q + 1) == t + 1)

    hypothesis = z3.ForAll([t], z3.Implies(z3.And(t >= 0, t < rank(j)),
                                           steps_at(witness(t), t, j)),
                           patterns=[witness(t)])
    t0 = z3.Int("t0")
    extended = z3.If(t0 < rank(j), witness(t0), j)
    return (z3.And(p.domain(), defs, j >= 0, j < p.n, hypothesis, t0 >= 0, t0 < rank(j + 1)),
            z3.Not(steps_at(extended, t0, j + 1)))


def _equivalence(v: Variant) -> Formula:
    p = v.parts.pool()
    rank = z3.Function("rank", z3.IntSort(), z3.IntSort())
    defs = rank_defs(p, rank)  # the legacy model's ties: the spec's rank, always
    tie, q, ii, jj = z3.Int("tie"), z3.Int("tie_position"), z3.Int("ri"), z3.Int("rj")
    monotone = z3.ForAll([ii, jj], z3.Implies(z3.And(ii >= 0, ii <= jj, jj <= p.n),
                                               rank(ii) <= rank(jj)))
    placed = v.parts.tie_at(p, q, tie, rank)
    d = decide(p, v.parts, placement=q)
    constraint, legacy = legacy_decide(p, rank, tie)
    differs = z3.Or(d.choice != legacy, d.pin_after != legacy)
    return (z3.And(p.domain(), defs, monotone, z3.Not(p.margin_on), z3.Not(p.gate_on),
                   tie >= 0, tie < rank(p.n), in_pool(q, p.n), placed, constraint), differs)


def _determinism(v: Variant) -> Formula:
    a = v.parts.pool()
    b = v.parts.pool("other_", n=a.n)
    d, e = decide(a, v.parts), decide(b, v.parts)
    same_request = z3.And(a.pin == b.pin, a.hit == b.hit, b.hash == a.hash + a.n,
                          a.det, b.det)
    return (z3.And(a.domain(), b.domain(), same_request),
            z3.Or(d.choice != e.choice, z3.Not(in_pool(d.choice, a.n))))


def _skew(v: Variant) -> Formula:
    p = v.parts.pool()
    d = decide(p, v.parts)
    return _margin_case(p), p.loads[d.choice] > p.low + p.margin


def _induction_bounded(v: Variant) -> Formula:
    p = v.parts.pool()
    post = post_loads(p, decide(p, v.parts))
    return (z3.And(_margin_case(p), p.high - p.low <= p.margin + 1),
            _spread_exceeds(p, post, p.margin + 1))


def _induction_nonincreasing(v: Variant) -> Formula:
    p = v.parts.pool()
    post = post_loads(p, decide(p, v.parts))
    return (z3.And(_margin_case(p), p.high - p.low > p.margin + 1),
            _spread_exceeds(p, post, p.high - p.low))


def _margin_zero(v: Variant) -> Formula:
    p = v.parts.pool()
    d = decide(p, v.parts)
    return z3.And(_margin_case(p), p.margin == 0), p.loads[d.choice] != p.low


def _monotone(v: Variant) -> Formula:
    p = v.parts.pool()
    m1, m2 = z3.Int("m1"), z3.Int("m2")
    return (z3.And(_margin_case(p), z3.Not(p.gate_on), m1 >= 0, m2 >= m1),
            z3.And(keep_rule(p, v.parts, m1), z3.Not(keep_rule(p, v.parts, m2))))


def _selectivity(v: Variant) -> Formula:
    p = v.parts.pool()
    d = decide(p, v.parts)
    return (z3.And(_margin_case(p), p.hit, p.own <= p.low + p.margin),
            z3.Not(z3.And(d.kept, d.choice == p.pin)))


def _break(v: Variant) -> Formula:
    p = v.parts.pool()
    d = decide(p, v.parts)
    correct = z3.And(d.choice != p.pin, p.loads[d.choice] == p.low, d.pin_after == d.choice)
    return z3.And(p.domain(), z3.Not(p.det), d.broken), z3.Not(correct)


def _no_starvation(v: Variant) -> Formula:
    p = v.parts.pool()
    d = decide(p, v.parts)
    idle = z3.Int("idle")
    return (z3.And(_margin_case(p), in_pool(idle, p.n), p.loads[idle] == 0),
            p.loads[d.choice] > p.margin)


def _gate_bound(v: Variant) -> Formula:
    p = v.parts.pool()
    d = decide(p, v.parts)
    load, low = p.loads[d.choice], p.low
    bound = z3.Or(load <= low + p.gate_abs, load * p.rel_den <= low * p.rel_num)
    return z3.And(p.domain(), p.gate_on, z3.Not(p.det), p.gate_abs > 0), z3.Not(bound)


def _lemma(name: str, obligation: int, requirements: tuple[str, ...], statement: str,
           build: Callable[[Variant], Formula]) -> ParamLemma:
    return ParamLemma(name, obligation, requirements, statement, build, paired(name))


PARAM_LEMMAS: tuple[ParamLemma, ...] = (
    _lemma("tie_rank_monotone", 1, ("R-TIE-1",),
           "induction: the count of minima before a position never decreases",
           _rank_monotone),
    _lemma("tie_exists", 1, ("R-TIE-1",),
           "induction: every tie index below the tie count names a position",
           _tie_exists),
    _lemma("default_null_equivalence", 1, ("R-LEG-1", "R-ACQ-4", "R-TIE-1"),
           "margin None, no gate: choice and pin equal the legacy model's",
           _equivalence),
    _lemma("determinism_ignores_load_margin_gate", 2, ("R-DET-1", "R-DET-2", "R-DET-4"),
           "full_determinism: same pin and hash (mod n) give the same server in [0, n) "
           "whatever loads, margin, gate; hashes of any sign",
           _determinism),
    _lemma("per_decision_skew", 3, ("R-SKEW-1", "R-KEEP-1", "R-PLACE-1"),
           "margin m: the chosen server's load <= min + m",
           _skew),
    _lemma("arrivals_spread_inductive", 3, ("R-SKEW-2",),
           "arrivals only: max - min <= m + 1 is preserved by every acquire",
           _induction_bounded),
    _lemma("spread_nonincreasing_above_band", 3, ("R-SKEW-3",),
           "max - min > m + 1: an acquire never increases max - min",
           _induction_nonincreasing),
    _lemma("margin_zero_least_loaded", 4, ("R-SKEW-5",),
           "margin 0: the chosen server is least-loaded",
           _margin_zero),
    _lemma("keep_monotone_in_margin", 5, ("R-KEEP-4",),
           "kept at m1 implies kept at every m2 >= m1",
           _monotone),
    _lemma("selectivity", 6, ("R-KEEP-1", "R-KEEP-4"),
           "a pin with load <= min + m is kept",
           _selectivity),
    _lemma("break_correct", 7, ("R-BREAK-1", "R-BREAK-2"),
           "a break (margin or gate) moves to a different least-loaded server and re-pins",
           _break),
    _lemma("no_starvation", 12, ("R-KEEP-3",),
           "margin m and an idle server: the chosen server's load <= m",
           _no_starvation),
    _lemma("gate_bound", 13, ("R-GATE-1", "R-GATE-2"),
           "gate abs > 0: chosen load <= min + abs or load <= min * rel",
           _gate_bound),
)
