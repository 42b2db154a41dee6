"""Z3 encoding of one acquire decision, and of the independent legacy model.

Theory of operation
-------------------
Z3 cannot call Python, so this module encodes the acquire rules of ``affinity_engine``
symbolically over ``N`` servers in pool order. :class:`AcquireVars` holds the inputs of
one acquire:

* ``loads`` -- the pre-increment in-flight counts (R-KEEP-2), all >= 0;
* ``hit`` / ``pin`` -- the request has a sticky entry on active server ``pin``; a miss and
  a pin on a removed server both mean "place anew" (R-ACQ-1, R-ACQ-3);
* ``margin_on`` / ``margin`` -- PR #7435's margin, ``gate_on`` / ``gate_abs`` /
  ``rel_num`` / ``rel_den`` -- PR #6533's gate (mutually exclusive, R-POL-1);
* ``det`` / ``det_index`` -- ``full_determinism`` and its hash index (R-DET-1..3);
* ``tie`` -- which of the tied minima (pool order) a placement takes, symbolic in
  ``[0, ties)``: ``tie = 0`` is "first", any value is a draw or a hash.

Two forms. The *functional* form (``AcquireVars(n)``) computes min, max, the pinned load
and the ``tie``-th minimum with If-chains, exactly as the core picks; the default-null
equivalence and the BMC use it. The *relational* form (``relational=True``) introduces
fresh variables for the minimum, maximum, pinned load and placement, with defining
constraints in :meth:`AcquireVars.domain`; the placement is *any* server at the minimum,
so a lemma proved relationally holds for every tie-break mode (R-REL-1), and it scales
far better (induction at N = 32 in about a second).

The rules are written as small named pieces, each one clause of the spec: the floor a
pin is measured from (:func:`lowest`), the band test (:func:`at_most`), when the margin
applies (:func:`margin_set`), when the gate is off (:func:`gate_off`), how margin and gate
combine (:func:`one_policy`), what ``full_determinism`` overrides (:func:`det_keeps`) and
where a broken pin goes (:func:`to_least`). :func:`keep_rule` and :func:`decide` compose
them as :data:`SPEC_PARTS` lists them; :class:`Parts` is that list as a record, so the
all-N encoding of :mod:`.z3_param` composes the same pieces over its symbolic pool.

:func:`decide` returns the chosen index, whether the pin was kept or broken, and the pin
afterwards. :func:`legacy_decide` is written separately and relationally (a fresh choice
variable constrained by upstream-verl.md section 3), not by reusing :func:`decide`, so the
default-null equivalence lemma compares two different formulations.

The encoding is kept honest by :mod:`.conformance`, which evaluates these terms on
concrete inputs (``substitute`` + ``simplify``) and compares them with the real core and
the real legacy model, inside ``affinity verify`` and in a Hypothesis test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import z3

__all__ = ["SPEC_PARTS", "AcquireVars", "Decision", "Parts", "at_most", "decide", "det_keeps",
           "extreme", "gate_off", "imbalanced", "keep_rule", "kth_minimum", "legacy_decide",
           "lowest", "margin_set", "one_policy", "outcome", "select", "tie_count",
           "to_least", "zmax", "zmin"]

Term = Any  # z3 expressions are untyped for mypy


def zmin(xs: Sequence[Term]) -> Term:
    out = xs[0]
    for x in xs[1:]:
        out = z3.If(x < out, x, out)
    return out


def zmax(xs: Sequence[Term]) -> Term:
    out = xs[0]
    for x in xs[1:]:
        out = z3.If(x > out, x, out)
    return out


def select(xs: Sequence[Term], index: Term) -> Term:
    """``xs[index]`` for a symbolic index in range."""
    out = xs[0]
    for i in range(1, len(xs)):
        out = z3.If(index == i, xs[i], out)
    return out


def tie_count(loads: Sequence[Term]) -> Term:
    low = zmin(loads)
    return z3.Sum([z3.If(x == low, 1, 0) for x in loads])


def kth_minimum(loads: Sequence[Term], k: Term) -> Term:
    """The index of the k-th (0-based, pool order) server at the minimum load."""
    low = zmin(loads)
    chosen: Term = z3.IntVal(len(loads) - 1)
    before: list[Term] = []
    ranks = []
    for i in range(len(loads)):
        ranks.append((i, z3.Sum([z3.IntVal(0), *before])))
        before.append(z3.If(loads[i] == low, 1, 0))
    for i, rank in reversed(ranks):
        chosen = z3.If(z3.And(loads[i] == low, rank == k), i, chosen)
    return chosen


def extreme(xs: Sequence[Term], name: str, kind: str) -> tuple[Term, Term]:
    """A fresh variable and the constraint that makes it ``min(xs)`` or ``max(xs)``.

    The relational form scales much better than an If-chain (measured: induction at
    N = 32 in under a second instead of 15-30 s).
    """
    v = z3.Int(name)
    bound = [v <= x for x in xs] if kind == "min" else [v >= x for x in xs]
    return v, z3.And(*bound, z3.Or(*[v == x for x in xs]))


class AcquireVars:
    """The symbolic inputs of one acquire over ``n`` servers.

    With ``relational=True`` the minimum, maximum, pinned load and the least-loaded
    placement are fresh variables defined by constraints in :meth:`domain` (placement:
    *any* server at the minimum, the ``allowed`` relation of R-REL-1, so a lemma covers
    every tie-break mode). Otherwise they are If-chain terms and the placement is the
    ``tie``-th minimum in pool order, exactly as the core picks it.
    """

    def __init__(self, n: int, prefix: str = "", relational: bool = False) -> None:
        if n < 1:
            raise ValueError(f"need at least one server, got n={n}")
        self.n = n
        self.relational = relational
        self.loads = [z3.Int(f"{prefix}load{i}") for i in range(n)]
        self.pin = z3.Int(f"{prefix}pin")
        self.hit = z3.Bool(f"{prefix}hit")
        self.margin_on = z3.Bool(f"{prefix}margin_on")
        self.margin = z3.Int(f"{prefix}margin")
        self.gate_on = z3.Bool(f"{prefix}gate_on")
        self.gate_abs = z3.Int(f"{prefix}gate_abs")
        self.rel_num = z3.Int(f"{prefix}rel_num")
        self.rel_den = z3.Int(f"{prefix}rel_den")
        self.det = z3.Bool(f"{prefix}det")
        self.det_index = z3.Int(f"{prefix}det_index")
        self.tie = z3.Int(f"{prefix}tie")
        self._defs: list[Term] = []
        if relational:
            self.low, low_def = extreme(self.loads, f"{prefix}low", "min")
            self.high, high_def = extreme(self.loads, f"{prefix}high", "max")
            self.own = z3.Int(f"{prefix}own")
            self.least = z3.Int(f"{prefix}least")
            self._defs = [
                low_def, high_def,
                z3.Or(*[z3.And(self.pin == i, self.own == x) for i, x in enumerate(self.loads)]),
                z3.Or(*[z3.And(self.least == i, x == self.low)
                        for i, x in enumerate(self.loads)]),
            ]
        else:
            self.low, self.high = zmin(self.loads), zmax(self.loads)
            self.own = select(self.loads, self.pin)
            self.least = None

    def domain(self) -> Term:
        """Well-formed inputs: what ``Config``, ``State`` and ``Acquire`` can hold."""
        placement = z3.BoolVal(True) if self.relational else z3.And(
            self.tie >= 0, self.tie < tie_count(self.loads))
        return z3.And(
            *[x >= 0 for x in self.loads],
            self.pin >= 0, self.pin < self.n,
            self.margin >= 0,
            z3.Not(z3.And(self.margin_on, self.gate_on)),
            self.rel_den >= 1, self.rel_num >= self.rel_den,
            self.det_index >= 0, self.det_index < self.n,
            placement,
            *self._defs,
        )

    def load_of(self, index: Term) -> Term:
        return select(self.loads, index)


@attrs.frozen
class Decision:
    choice: Term  # index of the chosen server
    kept: Term  # Bool: sticky hit, pin kept
    broken: Term  # Bool: sticky hit, re-pinned
    pin_after: Term  # index the request is pinned to afterwards

    def post_loads(self, a: AcquireVars) -> list[Term]:
        return [x + z3.If(self.choice == i, 1, 0) for i, x in enumerate(a.loads)]


# ------------------------------------------------------------------ the rules' pieces
# Each piece reads only attributes that AcquireVars and z3_param.Pool both have (loads,
# low, high, own, pin, hit, margin_on, gate_on, gate_abs, rel_num, rel_den, det), so both
# encodings compose the same pieces.

def lowest(a: Any) -> Term:
    """R-KEEP-1: a pin is measured from the minimum over the whole active pool, the pin
    included."""
    return a.low


def at_most(own: Term, bound: Term) -> Term:
    """R-KEEP-1: the pin is kept while its load is at most the bound (inclusive)."""
    return own <= bound


def margin_set(a: Any, width: Term) -> Term:
    """R-POL-1: the margin's rule applies whenever a margin is set, 0 included (R-KEEP-1:
    margin 0 moves a pin that is not at the minimum)."""
    return a.margin_on


def gate_off(a: Any) -> Term:
    """R-GATE-1: PR #6533's gate is disabled by ``balance_abs_threshold <= 0``."""
    return a.gate_abs <= 0


def imbalanced(a: Any) -> Term:
    """R-GATE-1: both of the gate's thresholds are exceeded (``rel = num / den``)."""
    return z3.And(a.gate_abs > 0, a.high - a.low > a.gate_abs,
                  a.high * a.rel_den > a.low * a.rel_num)


def one_policy(a: Any, margin_keep: Term, gate_keep: Term) -> Term:
    """R-POL-1, SPEC's KEEP(p): the gate's condition under the gate policy, else the
    margin's (which is true under the legacy policy, where no margin is set)."""
    return z3.If(a.gate_on, gate_keep, margin_keep)


def det_keeps(a: Any, policy: Term) -> Term:
    """R-DET-4: under ``full_determinism`` every hit keeps its pin."""
    return z3.Or(a.det, policy)


def to_least(a: Any, least: Term) -> tuple[Term, Term]:
    """R-BREAK-1: a broken pin moves to the least-loaded placement and is re-pinned there
    (the server it is sent to, the server it is pinned to)."""
    return least, least


@attrs.frozen
class Parts:
    """The pieces :func:`keep_rule` and :func:`decide` compose; :data:`SPEC_PARTS` holds
    the spec's. Each field is one of the functions above (or one with its signature)."""

    floor: Callable[[Any], Term] = lowest
    within: Callable[[Term, Term], Term] = at_most
    margin_active: Callable[[Any, Term], Term] = margin_set
    gate_disabled: Callable[[Any], Term] = gate_off
    policy: Callable[[Any, Term, Term], Term] = one_policy
    under_det: Callable[[Any, Term], Term] = det_keeps
    on_break: Callable[[Any, Term], tuple[Term, Term]] = to_least


SPEC_PARTS = Parts()  # the rules as specified (and as the core implements them)


def keep_rule(a: Any, parts: Parts = SPEC_PARTS, margin: Term | None = None) -> Term:
    """Whether a sticky hit keeps its pin (R-KEEP-1, R-GATE-1, R-DET-4), with the skew
    the margin's rule tolerates ``margin`` (default: the margin ``m``)."""
    m = a.margin if margin is None else margin
    band_keep = parts.within(a.own, parts.floor(a) + m)
    margin_keep = z3.If(parts.margin_active(a, m), band_keep, True)
    gate_keep = z3.Or(a.own == a.low, parts.gate_disabled(a), z3.Not(imbalanced(a)))
    return parts.under_det(a, parts.policy(a, margin_keep, gate_keep))


def outcome(a: Any, keep: Term, least: Term, place: Term,
            parts: Parts = SPEC_PARTS) -> tuple[Term, Term, Term, Term]:
    """(choice, kept, broken, pin afterwards) of a keyed acquire (R-ACQ-1..7, R-BREAK-1):
    a hit whose pin is kept returns it, a broken one goes where :attr:`Parts.on_break`
    sends it, a miss goes to ``place``."""
    kept = z3.And(a.hit, keep)
    broken = z3.And(a.hit, z3.Not(keep))
    moved, repinned = parts.on_break(a, least)
    choice = z3.If(kept, a.pin, z3.If(broken, moved, place))
    pin_after = z3.If(kept, a.pin, z3.If(broken, repinned, place))
    return choice, kept, broken, pin_after


def decide(a: AcquireVars, parts: Parts = SPEC_PARTS) -> Decision:
    """The core's acquire decision for a keyed request (R-ACQ-1..7, R-BREAK-1)."""
    least = a.least if a.relational else kth_minimum(a.loads, a.tie)
    place = z3.If(a.det, a.det_index, least)
    return Decision(*outcome(a, keep_rule(a, parts), least, place, parts))


def legacy_decide(a: AcquireVars, name: str = "legacy_choice") -> tuple[Term, Term]:
    """The legacy balancer, relationally: (constraint on the fresh choice, choice).

    upstream-verl.md section 3: a sticky hit on an active server returns it; otherwise
    ``full_determinism`` takes the hash index, else the ``tie``-th of the servers whose
    count equals the minimum, in dict order.
    """
    c = z3.Int(name)
    low = zmin(a.loads)
    rank_ok = []
    for i in range(a.n):
        earlier_ties = z3.Sum([z3.IntVal(0), *[z3.If(a.loads[j] == low, 1, 0)
                                               for j in range(i)]])
        rank_ok.append(z3.And(c == i, a.loads[i] == low, earlier_ties == a.tie))
    constraint = z3.If(a.hit, c == a.pin,
                       z3.If(a.det, c == a.det_index, z3.Or(*rank_ok)))
    return constraint, c
