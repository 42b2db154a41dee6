"""Prefix-aware placement's lemmas (SPEC section 8.1), proved for every pool size N >= 1.

Theory of operation
-------------------
Same method as :mod:`.z3_param_lemmas`: ``hypotheses and not goal`` over the symbolic
pool of :mod:`.z3_param` (``n`` unknown, loads an array). UNSAT proves a lemma for every
``n >= 1``, every integer load >= 0, every margin ``m >= 0`` (or the gate, or none), every
placement margin ``m_place >= 0``, every integer hash and -- the point of the extension --
**every cache estimate**: the acquire's ``cached_prefix`` is an unconstrained array
``H`` of integers >= 0.

:class:`PrefixPool` adds to a margin pool (``band=False``) the placement margin
(``mp_on``, ``mp``), the estimate ``H`` and two chosen positions: ``placed``, a
candidate of R-PFX-3 for a placement (nothing excluded), and ``repinned``, a candidate for
the re-pin of a break (the pin excluded, R-PFX-2). A candidate is stated relationally
(:func:`candidate`): it is admissible (``L <= min + m_place``, not the excluded
position), and no admissible position is strictly better (more cached, or as much cached
and less loaded). The relation holds for *every* tie-break among the candidates, so a
lemma about it holds for ``first``, ``draw`` and ``hashed`` alike.

:func:`prefix_decide` composes the decision from named pieces (:class:`PrefixParts`): the
margin's keep rule and :func:`~affinity_proofs.z3_model.outcome`, with the candidates in
place of the least-loaded position when ``m_place`` is set and ``full_determinism`` is
off; an encoded mutant replaces one piece. The decision without the placement margin is
:func:`~affinity_proofs.z3_param.decide` unchanged, so ``prefix_default_equivalence``
compares formulas from the same builders.

What is *not* proved here: that a best admissible position exists (the admissible set is
non-empty for every input, ``prefix_admissible_nonempty``, and a finite non-empty set has
a best element), and that this encoding is the reference's ``candidates`` -- the
encoding-conformance sweep of :mod:`.conformance_prefix` checks the reference's choice
against :func:`candidate` at concrete points, with its own mutants of the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import z3

from . import z3_model
from .z3_model import at_most
from .z3_param import Pool, PoolParts, decide, in_pool, keep_rule
from .z3_param_kit import MUTANT_HINT_N, Formula, ParamLemma, Variant

__all__ = ["PREFIX_LEMMAS", "PREFIX_MUTANTS", "PREFIX_SPEC_PARTS", "PrefixDecision",
           "PrefixParts", "PrefixPool", "candidate", "prefix_decide"]

Term = Any
NOWHERE = -1  # the excluded position of a placement: none


class PrefixPool:
    """A margin pool plus the placement margin, the estimate and the chosen candidates."""

    def __init__(self) -> None:
        self.p = Pool(band=False)
        self.mp_on, self.mp = z3.Bool("mp_on"), z3.Int("mp")
        self.cached = z3.Array("cached", z3.IntSort(), z3.IntSort())
        self.placed, self.repinned = z3.Int("placed"), z3.Int("repinned")

    def domain(self) -> Term:
        p = self.p
        return z3.And(p.domain(), self.mp >= 0,
                      p.forall(lambda k: self.cached[k] >= 0))


# ------------------------------------------------------------------ the spec's pieces
def excluded_pin(pp: PrefixPool) -> Term:
    """R-PFX-2: a re-pin never lands on the pin it moves off."""
    return pp.p.pin


def prefers(pp: PrefixPool, c: Term, k: Term) -> Term:
    """R-PFX-3: ``c`` is at least as good as ``k``: more cached prefix, or as much and no
    more load."""
    cached, loads = pp.cached, pp.p.loads
    return z3.Or(cached[c] > cached[k], z3.And(cached[c] == cached[k], loads[c] <= loads[k]))


def placement_active(pp: PrefixPool) -> Term:
    """R-PFX-1, R-PFX-5: the estimate is read only with ``m_place`` set, never under
    ``full_determinism``."""
    return z3.And(pp.mp_on, z3.Not(pp.p.det))


@attrs.frozen
class PrefixParts(PoolParts):
    """:class:`~affinity_proofs.z3_param.PoolParts` plus the placement's pieces."""

    place_within: Callable[[Term, Term], Term] = at_most  # R-PFX-2: L[s] <= min + m_place
    moved_off: Callable[[PrefixPool], Term] = excluded_pin  # R-PFX-2
    better: Callable[[PrefixPool, Term, Term], Term] = prefers  # R-PFX-3
    active: Callable[[PrefixPool], Term] = placement_active  # R-PFX-1, R-PFX-5


PREFIX_SPEC_PARTS = PrefixParts()


def _parts(v: Variant) -> PrefixParts:
    return v.parts if isinstance(v.parts, PrefixParts) else PREFIX_SPEC_PARTS


def admissible(pp: PrefixPool, k: Term, excluded: Term, parts: PrefixParts) -> Term:
    """R-PFX-2: position ``k`` is in the pool, within ``min + m_place``, and not
    ``excluded``."""
    p = pp.p
    return z3.And(in_pool(k, p.n), parts.place_within(p.loads[k], p.low + pp.mp),
                  k != excluded)


def candidate(pp: PrefixPool, c: Term, excluded: Term,
              parts: PrefixParts = PREFIX_SPEC_PARTS) -> Term:
    """R-PFX-3, relationally: ``c`` is admissible and at least as good as every admissible
    position (the universal sits in the hypotheses, triggered on ``loads[k]``)."""
    return z3.And(admissible(pp, c, excluded, parts), pp.p.forall(
        lambda k: z3.Implies(admissible(pp, k, excluded, parts), parts.better(pp, c, k))))


@attrs.frozen
class PrefixDecision:
    choice: Term  # position of the chosen server
    kept: Term
    broken: Term
    plain: Term  # the choice the same acquire gets without the placement margin
    constraints: Term  # what makes ``placed`` and ``repinned`` candidates


def prefix_decide(pp: PrefixPool, parts: PrefixParts = PREFIX_SPEC_PARTS) -> PrefixDecision:
    """The reference's decision for a keyed acquire with prefix-aware placement
    (R-PFX-2..5, section 10 step 4)."""
    p = pp.p
    keep = keep_rule(p, parts)
    broken = z3.And(p.hit, z3.Not(keep))
    on = parts.active(pp)
    least = z3.If(on, pp.repinned, p.least)
    # The load-blind placement of full_determinism unless the estimate is read (R-PFX-5
    # says it never is; the ``prefix_under_det`` mutant reads it).
    place = z3.If(on, pp.placed, z3.If(p.det, parts.det_index(p.hash, p.n), p.least))
    choice, kept, broken_term, _ = z3_model.outcome(p, keep, least, place, parts)
    constraints = z3.And(
        candidate(pp, pp.placed, z3.IntVal(NOWHERE), parts),
        z3.Implies(broken, candidate(pp, pp.repinned, parts.moved_off(pp), parts)))
    return PrefixDecision(choice, kept, broken_term, decide(p, parts).choice, constraints)


# ------------------------------------------------------------------ the lemmas
def _setting(pp: PrefixPool, d: PrefixDecision) -> Term:
    return z3.And(pp.domain(), d.constraints)


def _admissible_nonempty(v: Variant) -> Formula:
    pp = PrefixPool()
    parts = _parts(v)
    p, d = pp.p, prefix_decide(pp, parts)
    return (z3.And(pp.domain(), z3.Not(p.det), d.broken),
            z3.Not(admissible(pp, p.least, parts.moved_off(pp), parts)))


def _confinement(v: Variant) -> Formula:
    pp = PrefixPool()
    p, d = pp.p, prefix_decide(pp, _parts(v))
    chosen = p.loads[d.choice]
    return (z3.And(_setting(pp, d), pp.mp_on, z3.Not(p.det), z3.Not(d.kept)),
            z3.Or(chosen > p.low + pp.mp, z3.And(d.broken, d.choice == p.pin)))


def _widest(pp: PrefixPool) -> Term:
    return z3.If(pp.mp > pp.p.margin, pp.mp, pp.p.margin)


def _skew(v: Variant) -> Formula:
    pp = PrefixPool()
    p, d = pp.p, prefix_decide(pp, _parts(v))
    return (z3.And(_setting(pp, d), pp.mp_on, p.margin_on, z3.Not(p.det)),
            p.loads[d.choice] > p.low + _widest(pp))


def _no_starvation(v: Variant) -> Formula:
    pp = PrefixPool()
    p, d = pp.p, prefix_decide(pp, _parts(v))
    idle = z3.Int("idle")
    return (z3.And(_setting(pp, d), pp.mp_on, p.margin_on, z3.Not(p.det),
                   in_pool(idle, p.n), p.loads[idle] == 0),
            p.loads[d.choice] > _widest(pp))


def _default_equivalence(v: Variant) -> Formula:
    pp = PrefixPool()
    d = prefix_decide(pp, _parts(v))
    return z3.And(_setting(pp, d), z3.Not(pp.mp_on)), d.choice != d.plain


def _margin_zero(v: Variant) -> Formula:
    """m_place = 0: a load-aware choice is at the minimum; and with the estimate equal on
    the tie set, every server at the minimum is a candidate (so CAND = T)."""
    pp = PrefixPool()
    parts = _parts(v)
    p, d = pp.p, prefix_decide(pp, parts)
    q = z3.Int("tied")
    uniform = p.forall(lambda k: z3.Implies(p.loads[k] == p.low,
                                            pp.cached[k] == pp.cached[p.least]))
    off_minimum = z3.And(z3.Not(d.kept), p.loads[d.choice] != p.low)
    tied_left_out = z3.And(uniform, in_pool(q, p.n), p.loads[q] == p.low,
                           z3.Not(candidate(pp, q, z3.IntVal(NOWHERE), parts)))
    return (z3.And(_setting(pp, d), pp.mp_on, pp.mp == 0, z3.Not(p.det)),
            z3.Or(off_minimum, tied_left_out))


def _prefers_cache(v: Variant) -> Formula:
    """A load-aware choice holds at least as much of the prefix as any server it could
    have taken instead (R-PFX-3's order: the cache first, the load only among equals)."""
    pp = PrefixPool()
    parts = _parts(v)
    p, d = pp.p, prefix_decide(pp, parts)
    other = z3.Int("other")
    excluded = z3.If(d.broken, p.pin, z3.IntVal(NOWHERE))
    return (z3.And(_setting(pp, d), pp.mp_on, z3.Not(p.det), z3.Not(d.kept),
                   admissible(pp, other, excluded, PREFIX_SPEC_PARTS)),
            pp.cached[other] > pp.cached[d.choice])


def _determinism(v: Variant) -> Formula:
    pp = PrefixPool()
    d = prefix_decide(pp, _parts(v))
    return z3.And(_setting(pp, d), pp.p.det), d.choice != d.plain


# ------------------------------------------------------------------ the mutants
def _plus_one(load: Term, bound: Term) -> Term:
    return load <= bound + 1


def _strictly_within(load: Term, bound: Term) -> Term:
    return load < bound


def _nothing_excluded(pp: PrefixPool) -> Term:
    return z3.IntVal(NOWHERE)


def _load_first(pp: PrefixPool, c: Term, k: Term) -> Term:
    """Lower load first, then the cache: the preference of R-PFX-3 turned round."""
    cached, loads = pp.cached, pp.p.loads
    return z3.Or(loads[c] < loads[k], z3.And(loads[c] == loads[k], cached[c] >= cached[k]))


def _read_when_off(pp: PrefixPool) -> Term:
    return z3.Not(pp.p.det)


def _read_under_det(pp: PrefixPool) -> Term:
    return pp.mp_on


def _mutant(name: str, **pieces: Any) -> Variant:
    return Variant(name, attrs.evolve(PREFIX_SPEC_PARTS, **pieces), hint_n=MUTANT_HINT_N)


PREFIX_MUTANTS: dict[str, tuple[Variant, str]] = {
    "prefix_band_plus_one": (_mutant("prefix_band_plus_one", place_within=_plus_one),
                             "prefix placement admits L <= min + m_place + 1 (encoded)"),
    "prefix_band_strict": (_mutant("prefix_band_strict", place_within=_strictly_within),
                           "prefix placement admits only L < min + m_place (encoded)"),
    "prefix_pin_admissible": (_mutant("prefix_pin_admissible", moved_off=_nothing_excluded),
                              "a re-pin may land on the pin it moves off (encoded)"),
    "prefix_load_first": (_mutant("prefix_load_first", better=_load_first),
                          "the lower load preferred to the larger cached prefix (encoded)"),
    "prefix_read_when_off": (_mutant("prefix_read_when_off", active=_read_when_off),
                             "the estimate read with placement_margin null (encoded)"),
    "prefix_under_det": (_mutant("prefix_under_det", active=_read_under_det),
                         "the estimate read under full_determinism (encoded)"),
}


def _lemma(name: str, obligation: int, requirements: tuple[str, ...], statement: str,
           build: Callable[[Variant], Formula], mutants: tuple[str, ...]) -> ParamLemma:
    return ParamLemma(name, obligation, requirements, statement, build,
                      tuple(PREFIX_MUTANTS[m][0] for m in mutants))


PREFIX_LEMMAS: tuple[ParamLemma, ...] = (
    _lemma("prefix_admissible_nonempty", 7, ("R-PFX-2", "R-BREAK-1"),
           "not full_determinism, a broken hit under any policy and any m_place: a server "
           "at the minimum is admissible for the re-pin (within min + m_place and not the "
           "pin), so the candidates are never empty",
           _admissible_nonempty, ("prefix_band_strict",)),
    _lemma("prefix_confinement", 7, ("R-PFX-2", "R-PFX-4", "R-POOL-4"),
           "m_place set, not full_determinism, any policy, any estimate: a placement or "
           "re-pin lands on L <= min + m_place, and a re-pin never on the pin it moves off",
           _confinement, ("prefix_band_plus_one", "prefix_pin_admissible")),
    _lemma("prefix_skew", 3, ("R-PFX-4", "R-SKEW-1"),
           "margin m and m_place set, not full_determinism, any estimate: every keyed "
           "acquire's server has L <= min + max(m, m_place) before it",
           _skew, ("prefix_band_plus_one",)),
    _lemma("prefix_no_starvation", 12, ("R-PFX-4", "R-KEEP-3"),
           "margin m and m_place set, not full_determinism, any estimate, some server idle: "
           "the chosen server's L <= max(m, m_place)",
           _no_starvation, ("prefix_band_plus_one",)),
    _lemma("prefix_default_equivalence", 1, ("R-PFX-1", "R-PLACE-1"),
           "m_place null: the chosen server is the one without prefix-aware placement, "
           "whatever the estimate, policy, loads or hash",
           _default_equivalence, ("prefix_read_when_off",)),
    _lemma("prefix_margin_zero", 4, ("R-PFX-6", "R-SKEW-5"),
           "m_place = 0, not full_determinism, any estimate: a placement or re-pin lands on "
           "the minimum; with the estimate equal on the tie set, every server at the "
           "minimum is a candidate (CAND = T: least-loaded placement's choice exactly)",
           _margin_zero, ("prefix_band_plus_one",)),
    _lemma("prefix_prefers_cache", 7, ("R-PFX-3",),
           "m_place set, not full_determinism, any policy, any estimate: no server the "
           "placement or re-pin could have taken holds more of the prefix than the chosen one",
           _prefers_cache, ("prefix_load_first",)),
    _lemma("prefix_determinism", 2, ("R-PFX-5", "R-DET-4"),
           "full_determinism: the chosen server is the one without prefix-aware placement "
           "(pool[h mod n] or the kept pin), whatever m_place and the estimate",
           _determinism, ("prefix_under_det",)),
)
