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

:func:`decide` returns the chosen index, whether the pin was kept or broken, and the pin
afterwards. :class:`Rules` selects an *encoded mutant* (the default is the spec); the
lemmas must refute each mutant they are paired with. :func:`legacy_decide` is written
separately and relationally (a fresh choice variable constrained by upstream-verl.md
section 3), not by reusing :func:`decide`, so the default-null equivalence lemma compares
two different formulations.

The encoding is kept honest by :mod:`.conformance`, which evaluates these terms on
concrete inputs (``substitute`` + ``simplify``) and compares them with the real core and
the real legacy model, inside ``affinity verify`` and in a Hypothesis test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import z3

__all__ = ["SPEC", "AcquireVars", "Decision", "Rules", "decide", "extreme", "keep_rule",
           "kth_minimum", "legacy_decide", "select", "tie_count", "zmax", "zmin"]

Term = Any  # z3 expressions are untyped for mypy


@attrs.frozen
class Rules:
    """Which keep/break rule to encode. The defaults are the spec (and the core)."""

    keep_cmp: str = "le"  # "le": load <= min + m + slack; "lt": <; "ge": >=
    keep_slack: int = 0
    margin_zero_off: bool = False  # `if margin:` -- 0 behaves like no margin
    margin_ignored: bool = False  # the margin is parsed but never applied
    none_as_zero: bool = False  # margin None evaluated as 0
    floor_over_busy: bool = False  # band floor = min over loads > 0
    margin_under_det: bool = False
    gate_inverted: bool = False  # abs > 0 disables the gate instead of abs <= 0
    break_stays: bool = False  # a "break" returns the old server
    break_repins: bool = True
    ties_from_end: bool = False  # least-loaded ties counted from the last server
    # The context band (R-BAND-1), encoded only by z3_param.Pool(band=True):
    band_div: str = "floor"  # c // T; "ceil", "times" (c * T), "mod" (c % T)
    band_no_cap: bool = False  # min(..., cap) forgotten
    band_forgets_margin: bool = False  # min(c // T, cap): the band can be below m
    band_under_det: bool = False  # the band evaluated under full_determinism
    context_without_tokens: bool = False  # T null, yet the context widens the margin


SPEC = Rules()  # the rules as specified (and as the core implements them)


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


def kth_minimum(loads: Sequence[Term], k: Term, from_end: bool = False) -> Term:
    """The index of the k-th (0-based, pool order) server at the minimum load."""
    low = zmin(loads)
    order = list(range(len(loads)))
    if from_end:
        order.reverse()
    chosen: Term = z3.IntVal(order[-1])
    before: list[Term] = []
    ranks = []
    for i in order:
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


def keep_rule(a: AcquireVars, rules: Rules, margin: Term | None = None) -> Term:
    """Whether a sticky hit keeps its pin (R-KEEP-1, R-GATE-1, R-DET-4)."""
    m = a.margin if margin is None else margin
    loads, low, high, own = a.loads, a.low, a.high, a.own
    true_min = low
    if rules.floor_over_busy:  # idle servers count as the maximum; all idle gives 0
        low = zmin([z3.If(x > 0, x, high) for x in loads])
    bound = low + m + rules.keep_slack
    band = {"le": own <= bound, "lt": own < bound, "ge": own >= bound}[rules.keep_cmp]
    margin_active = a.margin_on
    if rules.margin_zero_off:
        margin_active = z3.And(a.margin_on, m != 0)
    if rules.margin_ignored:
        margin_active = z3.BoolVal(False)
    imbalanced = z3.And(a.gate_abs > 0, high - true_min > a.gate_abs,
                        high * a.rel_den > true_min * a.rel_num)
    gate_disabled = a.gate_abs > 0 if rules.gate_inverted else a.gate_abs <= 0
    gate_keep = z3.Or(own == true_min, gate_disabled, z3.Not(imbalanced))
    legacy = z3.And(z3.Not(a.margin_on), z3.Not(a.gate_on))
    if rules.none_as_zero:
        policy = z3.If(legacy, own <= true_min, z3.If(a.gate_on, gate_keep,
                                                         z3.If(margin_active, band, True)))
    else:
        policy = z3.If(a.gate_on, gate_keep, z3.If(margin_active, band, True))
    return policy if rules.margin_under_det else z3.Or(a.det, policy)


def decide(a: AcquireVars, rules: Rules = SPEC) -> Decision:
    """The core's acquire decision for a keyed request (R-ACQ-1..7, R-BREAK-1)."""
    least = a.least if a.relational else kth_minimum(a.loads, a.tie, rules.ties_from_end)
    place = z3.If(a.det, a.det_index, least)
    keep = keep_rule(a, rules)
    kept = z3.And(a.hit, keep)
    broken = z3.And(a.hit, z3.Not(keep))
    repin = a.pin if rules.break_stays else least
    choice = z3.If(kept, a.pin, z3.If(broken, repin, place))
    pin_after = z3.If(z3.Or(kept, z3.And(broken, not rules.break_repins)), a.pin, choice)
    return Decision(choice, kept, broken, pin_after)


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
