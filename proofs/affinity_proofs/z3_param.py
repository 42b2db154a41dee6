"""The acquire decision over a *symbolic* pool size: Z3 proofs for every N >= 1.

Theory of operation
-------------------
:mod:`.z3_model` unrolls one variable per server, so a proof there holds for the N it was
run at. Here the pool size ``n`` is an integer variable and the loads are an array
``Int -> Int`` read at positions ``0 .. n-1``; an UNSAT answer therefore covers every
``n >= 1``, every integer load >= 0, every margin >= 0, every gate threshold and every
integer caller hash, negative ones included.

Quantifiers only where Z3 decides them. The minimum, the maximum and the tie rank are
*defined* in the hypotheses:

* ``low = loads[w_min]`` for a witness position ``w_min`` (a Skolem constant), and
  ``forall i in [0, n): loads[i] >= low`` -- the universal sits in the hypothesis, so the
  negated goal stays existential and E-matching instantiates it on the few positions the
  goal reads (the pin, the choice, the goal's own witnesses). ``high`` likewise.
* "max - min after the acquire <= b" is a universal goal; its negation is two Skolem
  positions ``i, j`` with ``post[i] - post[j] > b``, so no post-minimum needs defining.
* The tie rank (how many servers at the minimum precede position ``i``, pool order) is an
  uninterpreted function ``rank`` fixed by ``rank(0) = 0`` and
  ``rank(i+1) = rank(i) + [loads[i] = low]``. Its monotonicity is itself proved for all N
  by induction (:data:`RANK_MONOTONE`) and then assumed where the default-null
  equivalence needs the tie-th tie to be unique.

The placement of a miss is *any* position at the minimum (the ``allowed`` relation of
R-REL-1), so a lemma about it holds for every tie-break mode. The caller hash ``h`` is any
integer and the deterministic index is ``h mod n`` -- Z3's ``mod`` by a positive divisor
is Euclidean, which for ``n > 0`` is exactly Python's floored ``%`` (R-DET-2).

A pool built with ``band=True`` also carries the context band (R-BAND-1): ``T``, ``cap``,
the context ``c`` and ``c = q*T + r`` with ``0 <= r < T`` (:meth:`Pool.band_domain`), and
the keep rule compares with :func:`band_width` instead of the margin; a pool without it
builds exactly the margin's formulas. The band's lemmas are :mod:`.z3_band_lemmas`.

The keep and break rules are :mod:`.z3_model`'s pieces, composed over this pool
(:func:`~affinity_proofs.z3_model.keep_rule`, :func:`~affinity_proofs.z3_model.outcome`);
this module adds the pieces only the all-N lemmas read: the hash rule (:func:`det_index`),
the band's quotient, cap and null-``T`` width (:func:`band_quotient`, :func:`capped_band`,
:func:`margin_only`), the tie rank (:func:`rank_defs`, :func:`tie_at`) and the adapters'
reuse-scaled context (:func:`reuse_context`). :data:`SPEC_POOL_PARTS` holds them all.
The concrete link between this encoding and the real core is :mod:`.conformance_wide`,
which evaluates :func:`decide` at concrete ``n``, loads and hashes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import z3

from . import z3_model
from .z3_model import Parts

__all__ = ["SPEC_POOL_PARTS", "Pool", "PoolDecision", "PoolParts", "band_quotient", "band_width",
           "capped_band", "decide", "det_index", "in_pool", "keep_rule", "legacy_decide",
           "margin_only", "post_loads", "rank_defs", "reuse_context", "tie_at"]


Term = Any  # z3 expressions are untyped for mypy


def in_pool(i: Term, n: Term) -> Term:
    return z3.And(i >= 0, i < n)


def det_index(h: Term, n: Term) -> Term:
    """The pool position of R-DET-2 for caller hash ``h``: Python's ``h % n``."""
    return h % n


class Pool:
    """The symbolic inputs of one acquire over a pool of ``n`` servers, ``n`` unknown."""

    def __init__(self, prefix: str = "", n: Term | None = None,
                 loads: Term | None = None, band: bool = False) -> None:
        def i(name: str) -> Term:
            return z3.Int(f"{prefix}{name}")

        def b(name: str) -> Term:
            return z3.Bool(f"{prefix}{name}")

        self.n = i("n") if n is None else n
        self.loads = z3.Array(f"{prefix}loads", z3.IntSort(), z3.IntSort()) \
            if loads is None else loads
        self.w_min, self.w_max = i("w_min"), i("w_max")
        self.low, self.high = self.loads[self.w_min], self.loads[self.w_max]
        self.pin, self.hit = i("pin"), b("hit")
        self.own = self.loads[self.pin]
        self.least = i("least")  # any position at the minimum
        self.margin_on, self.margin = b("margin_on"), i("margin")
        self.gate_on, self.gate_abs = b("gate_on"), i("gate_abs")
        self.rel_num, self.rel_den = i("rel_num"), i("rel_den")
        self.det, self.hash = b("det"), i("hash")
        self._k = z3.Int(f"{prefix}k")
        # The context band (R-BAND-1), only in ``band=True`` pools, so the margin's
        # formulas stay exactly as they were: T, cap, the context c and c = q*T + r with
        # 0 <= r < T -- floor division, stated without a division operator.
        self.band = band
        self.band_on, self.tokens, self.cap = b("band_on"), i("tokens"), i("cap")
        self.ctx, self.quot, self.rem = i("ctx"), i("quot"), i("rem")

    def forall(self, body: Any) -> Term:
        """``forall k in [0, n): body(k)``, triggered on ``loads[k]``."""
        k = self._k
        return z3.ForAll([k], z3.Implies(in_pool(k, self.n), body(k)),
                         patterns=[self.loads[k]])

    def domain(self) -> Term:
        """Well-formed inputs: a non-empty pool, loads >= 0, min/max/pin/placement in range."""
        return z3.And(
            self.n >= 1,
            in_pool(self.w_min, self.n), in_pool(self.w_max, self.n), in_pool(self.pin, self.n),
            in_pool(self.least, self.n), self.loads[self.least] == self.low,
            self.low >= 0,
            self.forall(lambda k: z3.And(self.loads[k] >= self.low,
                                         self.loads[k] <= self.high)),
            self.margin >= 0, z3.Not(z3.And(self.margin_on, self.gate_on)),
            self.rel_den >= 1, self.rel_num >= self.rel_den,
            *([self.band_domain()] if self.band else []),
        )

    def band_domain(self) -> Term:
        """R-CFG-6 and R-BAND-1: T >= 1 and max(m, 1) <= cap, only with a margin; c >= 0
        split as ``c = q*T + r``, ``0 <= r < T``. True in a pool without the band."""
        if not self.band:
            return z3.BoolVal(True)
        return z3.And(
            self.ctx >= 0,
            z3.Implies(self.band_on, z3.And(
                self.margin_on, self.tokens >= 1, self.cap >= 1, self.cap >= self.margin,
                self.ctx == self.quot * self.tokens + self.rem,
                self.rem >= 0, self.rem < self.tokens)))


def rank_defs(p: Pool, rank: Term) -> Term:
    """R-TIE-1: ``rank(i)`` counts the servers at the minimum before position ``i`` in
    pool order."""
    k = z3.Int("rank_k")
    at_min = z3.If(p.loads[k] == p.low, 1, 0)
    return z3.And(rank(0) == 0, z3.ForAll(
        [k], z3.Implies(in_pool(k, p.n), rank(k + 1) == rank(k) + at_min),
        patterns=[rank(k + 1)]))


def tie_at(p: Pool, q: Term, tie: Term, rank: Term) -> Term:
    """R-TIE-1: position ``q`` is the ``tie``-th (0-based, pool order) server at the
    minimum, for ``rank`` defined by :func:`rank_defs`."""
    return z3.And(p.loads[q] == p.low, rank(q) == tie)


def band_quotient(p: Pool) -> Term:
    """R-BAND-1: ``c // T``, the quotient of the pool's split ``c = q*T + r``."""
    return p.quot


def capped_band(p: Pool, quotient: Term) -> Term:
    """R-BAND-1/2: the band ``min(m + c // T, cap)``."""
    wide = p.margin + quotient
    return z3.If(wide < p.cap, wide, p.cap)


def margin_only(p: Pool) -> Term:
    """R-BAND-3: with ``T`` null the width is the margin; the context is not read."""
    return p.margin


def reuse_context(prompt: Term, hits: Term, lookups: Term, c: Term) -> Term:
    """R-BAND-6: ``c`` is what an adapter sends for a ``prompt`` on a server whose kept
    turns had ``hits`` of ``lookups`` prompt tokens cached, without a division operator:
    ``c*Q <= P*H < (c+1)*Q`` pins ``c = (P*H) // Q`` for ``Q >= 1``; ``Q = 0`` sends P."""
    scaled = z3.And(c * lookups <= prompt * hits, prompt * hits < (c + 1) * lookups)
    return z3.If(lookups == 0, c == prompt, scaled)


@attrs.frozen
class PoolParts(Parts):
    """:class:`~affinity_proofs.z3_model.Parts` plus the pieces of this module; the lemma
    builders read them from here, :data:`SPEC_POOL_PARTS` holds the spec's."""

    pool: Callable[..., Pool] = Pool  # the symbolic inputs every lemma builds
    det_index: Callable[[Term, Term], Term] = det_index  # R-DET-2
    quotient: Callable[[Pool], Term] = band_quotient  # R-BAND-1
    band: Callable[[Pool, Term], Term] = capped_band  # R-BAND-1/2
    unbanded: Callable[[Pool], Term] = margin_only  # R-BAND-3
    rank_defs: Callable[[Pool, Term], Term] = rank_defs  # R-TIE-1
    tie_at: Callable[[Pool, Term, Term, Term], Term] = tie_at  # R-TIE-1
    reuse: Callable[[Term, Term, Term, Term], Term] = reuse_context  # R-BAND-6


SPEC_POOL_PARTS = PoolParts()


@attrs.frozen
class PoolDecision:
    choice: Term  # position of the chosen server
    kept: Term
    broken: Term
    pin_after: Term


def band_width(p: Pool, parts: PoolParts = SPEC_POOL_PARTS) -> Term:
    """The skew a hit tolerates: ``min(m + c // T, cap)`` with the band on (R-BAND-1),
    else the margin ``m`` -- the context is not read (R-BAND-3)."""
    if not p.band:
        return p.margin
    return z3.If(p.band_on, parts.band(p, parts.quotient(p)), parts.unbanded(p))


def keep_rule(p: Pool, parts: PoolParts = SPEC_POOL_PARTS, margin: Term | None = None) -> Term:
    """Whether a sticky hit keeps its pin (R-KEEP-1, R-GATE-1, R-DET-4, R-BAND-1/5): the
    margin's rule with the band's width."""
    return z3_model.keep_rule(p, parts, band_width(p, parts) if margin is None else margin)


def decide(p: Pool, parts: PoolParts = SPEC_POOL_PARTS,
           placement: Term | None = None) -> PoolDecision:
    """The core's acquire decision for a keyed request (R-ACQ-1..7, R-BREAK-1)."""
    least = p.least if placement is None else placement
    place = z3.If(p.det, parts.det_index(p.hash, p.n), least)
    return PoolDecision(*z3_model.outcome(p, keep_rule(p, parts), least, place, parts))


def post_loads(p: Pool, d: PoolDecision) -> Term:
    """The loads after the acquire: the chosen server counts one more (R-ACQ-7)."""
    return z3.Store(p.loads, d.choice, p.loads[d.choice] + 1)


def legacy_decide(p: Pool, rank: Term, tie: Term) -> tuple[Term, Term]:
    """verl's legacy balancer (upstream-verl.md section 3), relationally: a hit on an
    active server returns it; else ``full_determinism`` takes ``pool[hash % n]``; else the
    ``tie``-th server at the minimum in pool order -- the position where the running count
    of minima steps from ``tie`` to ``tie + 1``."""
    c = z3.Int("legacy_choice")
    placed = z3.And(in_pool(c, p.n), rank(c) == tie, rank(c + 1) == tie + 1)
    constraint = z3.If(p.hit, c == p.pin,
                       z3.If(p.det, c == p.hash % p.n, placed))
    return constraint, c
