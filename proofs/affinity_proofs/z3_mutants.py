"""The encoded mutants: the spec's Z3 encoding with one piece replaced.

Theory of operation
-------------------
:mod:`.z3_model` and :mod:`.z3_param` state the rules only, as small named pieces that
:class:`~affinity_proofs.z3_param.PoolParts` lists. A mutant here is that record with one
piece (rarely two that belong together) swapped for a wrong one -- a strict comparison, a
forgotten cap, C's remainder for Python's -- so its formulas come from the same builders
as the spec's and differ from them in that piece alone. The spec modules never import this
one.

:data:`ENCODED_MUTANTS` is the table: each mutant's :class:`~.z3_param_kit.Variant` (its
name, its pieces, the search hint) and the all-N lemmas that must refute it, in the order
the lemmas list them (:func:`paired`). The BMC of :mod:`.z3_bmc` reuses the same pieces
over the unrolled encoding (:func:`by_name`).
"""

from __future__ import annotations

from typing import Any

import attrs
import z3

from .z3_model import det_keeps, one_policy
from .z3_param import SPEC_POOL_PARTS, Pool, in_pool
from .z3_param_kit import MUTANT_HINT_N, Variant

__all__ = ["ENCODED_MUTANTS", "BusyFloorPool", "EncodedMutant", "by_name", "paired"]

Term = Any


@attrs.frozen
class EncodedMutant:
    variant: Variant
    lemmas: tuple[str, ...]  # the all-N lemmas that refute it (the BMC reads its own)

    @property
    def name(self) -> str:
        return self.variant.name


# ------------------------------------------------------------------ mutated pieces
# The keep rule's band test (spec: ``own <= bound``).
def _plus_one(own: Term, bound: Term) -> Term:
    return own <= bound + 1


def _plus_two(own: Term, bound: Term) -> Term:
    return own <= bound + 2


def _strict(own: Term, bound: Term) -> Term:
    return own < bound


def _flipped(own: Term, bound: Term) -> Term:
    return own >= bound


def _zero_is_off(a: Any, width: Term) -> Term:
    """``if margin:`` -- a margin of 0 behaves like no margin."""
    return z3.And(a.margin_on, width != 0)


def _gate_inverted(a: Any) -> Term:
    return a.gate_abs > 0


def _null_as_zero(a: Any, margin_keep: Term, gate_keep: Term) -> Term:
    """A margin of None evaluated as 0: with neither policy, a hit keeps only the minimum."""
    legacy = z3.And(z3.Not(a.margin_on), z3.Not(a.gate_on))
    return z3.If(legacy, a.own <= a.low, one_policy(a, margin_keep, gate_keep))


def _policy_under_det(a: Any, policy: Term) -> Term:
    """The rules are evaluated under ``full_determinism`` as well."""
    return policy


def _band_under_det(p: Pool, policy: Term) -> Term:
    """The band is evaluated under ``full_determinism`` (the margin alone is not)."""
    if not p.band:
        return det_keeps(p, policy)
    return z3.If(p.band_on, policy, det_keeps(p, policy))


def _stays(a: Any, least: Term) -> tuple[Term, Term]:
    """A break returns the old server (and keeps the pin there)."""
    return a.pin, a.pin


def _no_repin(a: Any, least: Term) -> tuple[Term, Term]:
    """A break moves the request but leaves the pin on the old server."""
    return least, a.pin


class BusyFloorPool(Pool):
    """A pool that also defines the *busy floor*: the minimum with idle servers read as
    the maximum (0 when every server is idle), by a witness as :class:`Pool` defines
    ``low``."""

    def __init__(self, prefix: str = "", n: Term | None = None, loads: Term | None = None,
                 band: bool = False) -> None:
        super().__init__(prefix, n, loads, band)
        self.w_busy = z3.Int(f"{prefix}w_busy")
        self.busy_floor = self._busy(self.w_busy)

    def _busy(self, k: Term) -> Term:
        return z3.If(self.loads[k] > 0, self.loads[k], self.high)

    def domain(self) -> Term:
        return z3.And(super().domain(), in_pool(self.w_busy, self.n),
                      self.forall(lambda k: self._busy(k) >= self.busy_floor))


def _busy_floor(p: Any) -> Term:
    return p.busy_floor


def _hash_abs(h: Term, n: Term) -> Term:
    return z3.If(h >= 0, h, -h) % n


def _hash_trunc(h: Term, n: Term) -> Term:
    """C's / Java's remainder: it takes the sign of the dividend."""
    return z3.If(h >= 0, h % n, -((-h) % n))


def _ceil(p: Pool) -> Term:
    return p.quot + z3.If(p.rem > 0, 1, 0)


def _times(p: Pool) -> Term:
    return p.ctx * p.tokens


def _mod(p: Pool) -> Term:
    return p.rem


def _no_cap(p: Pool, quotient: Term) -> Term:
    return p.margin + quotient


def _forgets_margin(p: Pool, quotient: Term) -> Term:
    """``min(c // T, cap)``: the band can sit below the margin."""
    return z3.If(quotient < p.cap, quotient, p.cap)


def _context_without_tokens(p: Pool) -> Term:
    """``T`` null, yet the context widens the margin."""
    return p.margin + p.ctx


def _rank_steps(at_min: int, above_min: int) -> Any:
    """A rank that steps by ``at_min`` at a minimum and ``above_min`` elsewhere (the spec
    steps by 1 and 0)."""
    def _stepped_rank(p: Pool, rank: Term) -> Term:
        k = z3.Int("rank_k")
        step = rank(k + 1) == rank(k) + z3.If(p.loads[k] == p.low, at_min, above_min)
        return z3.And(rank(0) == 0, z3.ForAll(
            [k], z3.Implies(in_pool(k, p.n), step), patterns=[rank(k + 1)]))
    return _stepped_rank


def _tie_from_end(p: Pool, q: Term, tie: Term, rank: Term) -> Term:
    """The ``tie``-th minimum counted from the last server: a rank of its own, over the
    positions ``>= i``."""
    back = z3.Function("rank_from_end", z3.IntSort(), z3.IntSort())
    k = z3.Int("rank_k")
    at_min = z3.If(p.loads[k] == p.low, 1, 0)
    defs = z3.And(back(p.n) == 0, z3.ForAll(
        [k], z3.Implies(in_pool(k, p.n), back(k) == back(k + 1) + at_min),
        patterns=[back(k)]))
    return z3.And(p.loads[q] == p.low, back(q + 1) == tie, defs)


def _reuse_plus_one(prompt: Term, hits: Term, lookups: Term, c: Term) -> Term:
    """One token more than ``prompt * H // Q``: can send more than the prompt."""
    base = c - 1
    scaled = z3.And(base * lookups <= prompt * hits, prompt * hits < (base + 1) * lookups)
    return z3.If(lookups == 0, c == prompt, scaled)


def _reuse_inverted(prompt: Term, hits: Term, lookups: Term, c: Term) -> Term:
    """``prompt * Q // H``: divides by the hits instead of the lookups."""
    scaled = z3.And(hits >= 1, c * hits <= prompt * lookups,
                    prompt * lookups < (c + 1) * hits)
    return z3.If(lookups == 0, c == prompt, scaled)


# ------------------------------------------------------------------ the table
def _m(name: str, lemmas: tuple[str, ...], **pieces: Any) -> EncodedMutant:
    parts = attrs.evolve(SPEC_POOL_PARTS, **pieces)
    return EncodedMutant(Variant(name, parts, MUTANT_HINT_N), lemmas)


ENCODED_MUTANTS: tuple[EncodedMutant, ...] = (
    _m("tie_rank_counts_down", ("tie_rank_monotone",), rank_defs=_rank_steps(1, -1)),
    _m("tie_rank_double_step", ("tie_exists",), rank_defs=_rank_steps(2, 0)),
    _m("margin_null_as_zero", ("default_null_equivalence",), policy=_null_as_zero),
    _m("ties_last_in_order", ("default_null_equivalence",), tie_at=_tie_from_end),
    _m("margin_under_determinism", ("determinism_ignores_load_margin_gate",),
       under_det=_policy_under_det),
    _m("hash_abs_mod", ("determinism_ignores_load_margin_gate",), det_index=_hash_abs),
    _m("hash_truncated_mod", ("determinism_ignores_load_margin_gate",),
       det_index=_hash_trunc),
    _m("keep_band_plus_one", ("per_decision_skew", "arrivals_spread_inductive"),
       within=_plus_one),
    _m("keep_band_plus_two", ("spread_nonincreasing_above_band",), within=_plus_two),
    _m("margin_zero_means_off", ("margin_zero_least_loaded",), margin_active=_zero_is_off),
    _m("keep_comparison_flipped", ("keep_monotone_in_margin",), within=_flipped),
    _m("keep_strict_lt", ("selectivity",), within=_strict),
    _m("break_keeps_old_server", ("break_correct",), on_break=_stays),
    _m("break_does_not_repin", ("break_correct",), on_break=_no_repin),
    _m("min_ignores_idle", ("no_starvation",), pool=BusyFloorPool, floor=_busy_floor),
    _m("gate_disable_inverted", ("gate_bound",), gate_disabled=_gate_inverted),
    # The context band (obligation 20).
    _m("context_without_tokens", ("band_default_equivalence",),
       unbanded=_context_without_tokens),
    _m("band_ceil_division", ("band_exact",), quotient=_ceil),
    _m("band_times_tokens", ("band_exact", "band_monotone_in_tokens"), quotient=_times),
    _m("band_no_cap", ("band_skew",), band=_no_cap),
    _m("band_mod_not_div", ("band_monotone_in_context",), quotient=_mod),
    _m("band_forgets_margin", ("band_selectivity",), band=_forgets_margin),
    _m("band_under_determinism", ("band_ignored_under_determinism",),
       under_det=_band_under_det),
    _m("band_min_ignores_idle", ("band_no_starvation",), pool=BusyFloorPool,
       floor=_busy_floor),
    _m("band_keep_strict_lt", ("band_break_correct",), within=_strict),
    _m("band_break_keeps_old_server", ("band_break_correct",), on_break=_stays),
    _m("reuse_plus_one_token", ("band_reuse_never_wider",), reuse=_reuse_plus_one),
    _m("reuse_divides_by_hits", ("band_reuse_never_wider",), reuse=_reuse_inverted),
)


def paired(lemma: str) -> tuple[Variant, ...]:
    """The encoded mutants ``lemma`` must refute, in table order."""
    return tuple(m.variant for m in ENCODED_MUTANTS if lemma in m.lemmas)


def by_name(name: str) -> Variant:
    for m in ENCODED_MUTANTS:
        if m.name == name:
            return m.variant
    raise KeyError(f"unknown encoded mutant {name!r}; known: "
                   f"{sorted(m.name for m in ENCODED_MUTANTS)}")
