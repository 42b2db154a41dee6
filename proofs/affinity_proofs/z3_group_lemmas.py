"""Group pins' lemmas (SPEC section 7.6), proved for every pool size N >= 1.

Theory of operation
-------------------
Same method as :mod:`.z3_param_lemmas`: ``hypotheses and not goal`` over the symbolic
pool of :mod:`.z3_param` (``n`` unknown, loads an array). UNSAT proves a lemma for every
``n >= 1``, every integer load >= 0, every margin ``m >= 0`` (or none), either policy,
every ``group_break_margin >= 0`` (or none), every integer hash, both group modes
(``fallback`` and ``only``) and every way an acquire meets the two maps.

:class:`GroupPool` adds to a margin pool (``band=False``) what SPEC section 10's
classification reads beyond one pin: whether the acquire is grouped (R-GRP-2), whether the
mode is ``only``, whether its own entry is on a removed server (``own_removed``; ``hit`` is
an own entry on an active server, as in the margin's lemmas), the group's pin ``gpin`` and
whether it is an active hit (``ghit``; a group miss and a group hit on a removed server
both place, R-GRP-4), and ``group_break_margin`` (``gm_on``, ``gm``).

:func:`group_decide` is the classification of R-GRP-2 and the effects of R-GRP-4 composed
from named pieces (:class:`GroupParts`); an encoded mutant replaces one piece. The own
decision is :func:`~affinity_proofs.z3_param.decide` unchanged, so a lemma comparing the
two (``group_default_equivalence``) compares formulas from the same builders.

What is *not* proved here: that this encoding is the core's ``classify`` (the group BFS of
:mod:`.bfs_groups` checks the reference's transitions against the same bounds, at small
scopes), and anything about the group map's recency, eviction or counters (the BFS does).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import attrs
import z3

from .z3_model import at_most
from .z3_param import Pool, PoolParts, decide, in_pool, keep_rule
from .z3_param_kit import MUTANT_HINT_N, Formula, ParamLemma, Variant

__all__ = ["GROUP_LEMMAS", "GROUP_MUTANTS", "GROUP_SPEC_PARTS", "GroupDecision", "GroupParts",
           "GroupPool", "group_decide"]

Term = Any


class GroupPool:
    """A margin pool plus the group map's inputs of one acquire."""

    def __init__(self) -> None:
        self.p = Pool(band=False)
        self.grouped, self.only = z3.Bool("grouped"), z3.Bool("only")
        self.own_removed = z3.Bool("own_removed")
        self.gpin, self.ghit = z3.Int("gpin"), z3.Bool("ghit")
        self.gm_on, self.gm = z3.Bool("gm_on"), z3.Int("gm")

    def domain(self) -> Term:
        p = self.p
        return z3.And(p.domain(), in_pool(self.gpin, p.n), self.gm >= 0,
                      z3.Not(z3.And(p.hit, self.own_removed)))

    def own_entry(self) -> Term:
        """``rid in C``: an own entry, on an active or a removed server."""
        return z3.Or(self.p.hit, self.own_removed)


# ------------------------------------------------------------------ the spec's pieces
def own_entry_first(g: GroupPool) -> Term:
    """R-GRP-2 step 1: with ``fallback`` an own entry is decided by section 10 alone."""
    return g.own_entry()


def group_to_least(g: GroupPool, least: Term) -> Term:
    """R-GRP-4: a broken group pin re-pins the group to a least-loaded server."""
    return least


def group_det_keeps(g: GroupPool, rule: Term) -> Term:
    """R-GRP-6: under ``full_determinism`` a group hit is always kept."""
    return z3.Or(g.p.det, rule)


@attrs.frozen
class GroupParts(PoolParts):
    """:class:`~affinity_proofs.z3_param.PoolParts` plus the group map's pieces."""

    group_within: Callable[[Term, Term], Term] = at_most  # R-GRP-3: L[g] <= min + gm
    own_first: Callable[[GroupPool], Term] = own_entry_first  # R-GRP-2
    group_on_break: Callable[[GroupPool, Term], Term] = group_to_least  # R-GRP-4
    group_under_det: Callable[[GroupPool, Term], Term] = group_det_keeps  # R-GRP-6


GROUP_SPEC_PARTS = GroupParts()


def _parts(v: Variant) -> GroupParts:
    return v.parts if isinstance(v.parts, GroupParts) else GROUP_SPEC_PARTS


def keep_group(g: GroupPool, parts: GroupParts) -> Term:
    """KEEP_G(gpin), R-GRP-3: the conversation's rule read at the group's pin, or
    ``L[gpin] <= min + gm`` when ``group_break_margin`` is set; always under
    ``full_determinism``."""
    p = g.p
    at_group = copy.copy(p)
    at_group.own = p.loads[g.gpin]
    own_rule = keep_rule(at_group, parts)
    margin_rule = parts.group_within(p.loads[g.gpin], p.low + g.gm)
    return parts.group_under_det(g, z3.If(g.gm_on, margin_rule, own_rule))


@attrs.frozen
class GroupDecision:
    choice: Term  # position of the chosen server
    reads_group: Term  # the group map decided the acquire
    group_kept: Term
    group_broken: Term
    ungrouped: Term  # the choice the same acquire gets without groups


def group_decide(g: GroupPool, parts: GroupParts = GROUP_SPEC_PARTS) -> GroupDecision:
    """The core's decision for a keyed acquire with group stickiness (R-GRP-2, R-GRP-4)."""
    p = g.p
    own = decide(p, parts)
    reads_group = z3.And(g.grouped, z3.Or(g.only, z3.Not(parts.own_first(g))))
    kept_rule = keep_group(g, parts)
    kept = z3.And(reads_group, g.ghit, kept_rule)
    broken = z3.And(reads_group, g.ghit, z3.Not(kept_rule))
    place = z3.If(p.det, parts.det_index(p.hash, p.n), p.least)
    via_group = z3.If(kept, g.gpin, z3.If(broken, parts.group_on_break(g, p.least), place))
    return GroupDecision(z3.If(reads_group, via_group, own.choice), reads_group, kept, broken,
                         own.choice)


# ------------------------------------------------------------------ the lemmas
def _keep_bound(v: Variant) -> Formula:
    g = GroupPool()
    p, d = g.p, group_decide(g, _parts(v))
    load = p.loads[d.choice]
    return (z3.And(g.domain(), z3.Not(p.det), g.gm_on, d.reads_group),
            z3.Not(z3.If(d.group_kept, load <= p.low + g.gm, load == p.low)))


def _applicable(g: GroupPool, d: GroupDecision) -> Term:
    """The margin that bounds the acquire: ``gm`` when the group map decided it and
    ``group_break_margin`` is set, else ``m``."""
    return z3.If(z3.And(d.reads_group, g.gm_on), g.gm, g.p.margin)


def _skew(v: Variant) -> Formula:
    g = GroupPool()
    p, d = g.p, group_decide(g, _parts(v))
    gm = z3.If(g.gm_on, g.gm, p.margin)
    widest = z3.If(gm > p.margin, gm, p.margin)
    return (z3.And(g.domain(), z3.Not(p.det), p.margin_on, g.grouped),
            z3.Or(p.loads[d.choice] > p.low + widest,
                  p.loads[d.choice] > p.low + _applicable(g, d)))


def _no_starvation(v: Variant) -> Formula:
    g = GroupPool()
    p, d = g.p, group_decide(g, _parts(v))
    idle = z3.Int("idle")
    return (z3.And(g.domain(), z3.Not(p.det), p.margin_on, g.grouped, in_pool(idle, p.n),
                   p.loads[idle] == 0),
            p.loads[d.choice] > _applicable(g, d))


def _default_equivalence(v: Variant) -> Formula:
    g = GroupPool()
    d = group_decide(g, _parts(v))
    inert = z3.Or(z3.Not(g.grouped), z3.And(z3.Not(g.only), g.own_entry()))
    return z3.And(g.domain(), inert), d.choice != d.ungrouped


def _determinism(v: Variant) -> Formula:
    g = GroupPool()
    p, d = g.p, group_decide(g, _parts(v))
    placed = z3.If(g.ghit, g.gpin, p.hash % p.n)
    return z3.And(g.domain(), p.det, d.reads_group), d.choice != placed


# ------------------------------------------------------------------ the mutants
def _plus_one(own: Term, bound: Term) -> Term:
    return own <= bound + 1


def _group_first(g: GroupPool) -> Term:
    """The group map is read even when the conversation has its own entry."""
    return z3.BoolVal(False)


def _break_stays(g: GroupPool, least: Term) -> Term:
    return g.gpin


def _margin_under_det(g: GroupPool, rule: Term) -> Term:
    return rule


def _mutant(name: str, **pieces: Any) -> Variant:
    return Variant(name, attrs.evolve(GROUP_SPEC_PARTS, **pieces), hint_n=MUTANT_HINT_N)


GROUP_MUTANTS: dict[str, tuple[Variant, str]] = {
    "group_keep_plus_one": (_mutant("group_keep_plus_one", group_within=_plus_one),
                            "group keep rule off by one: L[g] <= min + gm + 1 (encoded)"),
    "group_read_on_own_hit": (_mutant("group_read_on_own_hit", own_first=_group_first),
                              "fallback reads the group map on an own hit (encoded)"),
    "group_break_stays": (_mutant("group_break_stays", group_on_break=_break_stays),
                          "a broken group pin returns the group's server (encoded)"),
    "group_margin_under_det": (_mutant("group_margin_under_det",
                                       group_under_det=_margin_under_det),
                               "group_break_margin applied under full_determinism "
                               "(encoded)"),
}


def _lemma(name: str, obligation: int, requirements: tuple[str, ...], statement: str,
           build: Callable[[Variant], Formula], mutants: tuple[str, ...]) -> ParamLemma:
    return ParamLemma(name, obligation, requirements, statement, build,
                      tuple(GROUP_MUTANTS[m][0] for m in mutants))


GROUP_LEMMAS: tuple[ParamLemma, ...] = (
    _lemma("group_keep_bound", 3, ("R-GRP-3", "R-GRP-4", "R-PLACE-1"),
           "group_break_margin gm set, not full_determinism, the group map decides (fallback "
           "without an own entry, or only): a group-kept acquire's server has "
           "L <= min + gm before it; a group-broken or group-placed one has L = min",
           _keep_bound, ("group_keep_plus_one", "group_break_stays")),
    _lemma("group_skew", 3, ("R-GRP-3", "R-SKEW-1"),
           "margin m set (so not the gate), not full_determinism, any grouped acquire in "
           "either mode: the chosen server's L <= min + (gm if the group map decided and gm "
           "is set, else m) <= min + max(m, gm)",
           _skew, ("group_keep_plus_one",)),
    _lemma("group_no_starvation", 12, ("R-GRP-3", "R-KEEP-3"),
           "margin m set, not full_determinism, any grouped acquire, some server idle: the "
           "chosen server's L <= gm if the group map decided and gm is set, else <= m",
           _no_starvation, ("group_keep_plus_one",)),
    _lemma("group_default_equivalence", 1, ("R-GRP-7", "R-GRP-1", "R-GRP-2"),
           "an acquire that is not grouped (off, no group id), or a fallback acquire with "
           "an own entry (active or removed): the chosen server is the one without groups, "
           "whatever the group map, gm, policy, loads or hash",
           _default_equivalence, ("group_read_on_own_hit",)),
    _lemma("group_determinism", 2, ("R-GRP-6", "R-DET-4"),
           "full_determinism, the group map decides: a group hit on an active server keeps "
           "it whatever gm and loads; a group miss or a hit on a removed server places at "
           "pool[h mod n] (h the hash of the placement key)",
           _determinism, ("group_margin_under_det",)),
)
