"""The context band's lemmas (SPEC section 7.5), proved for every pool size N >= 1.

Theory of operation
-------------------
Same method as :mod:`.z3_param_lemmas`: ``hypotheses and not goal`` over the symbolic
pool of :mod:`.z3_param`, here built with ``band=True``. UNSAT proves a lemma for every
``n >= 1``, every integer load >= 0, every margin ``m >= 0``, every ``T >= 1``, every
``cap >= max(m, 1)`` and every context ``c >= 0``. The division is exact and has no
operator: ``c = q*T + r`` with ``0 <= r < T`` pins ``q`` to ``c // T`` for ``c >= 0``,
``T >= 1`` (the products make this nonlinear integer arithmetic, which Z3 settles here
in milliseconds).

A lemma that compares two acquires on the *same* pool -- another context ``c2`` or another
``T2`` -- gets the second one by substitution (:func:`_again`): the same decision terms
with ``(c, q, r)`` or ``(T, q, r)`` replaced by fresh variables under the same division
constraints, so both sides are the same formula builder's output.

``band_exact`` states R-BAND-1 without division at all: a hit is kept iff
``L[p] <= min + cap`` and either ``L[p] <= min + m`` or ``(L[p] - min - m) * T <= c`` --
for an integer ``k >= 1``, ``k <= c // T`` iff ``k*T <= c``. This independent form is what
refutes the ceiling and ``c * T`` mutants.

Every lemma lists the encoded mutants it must refute (:func:`.z3_mutants.paired`: the spec's
pieces with the band's quotient, cap, null-``T`` width, determinism override or reuse
scaling replaced, or the margin's band test, break or floor applied with the band on);
:func:`~.z3_param_kit.run` refutes them with the same formula, and checks that the spec's
hypotheses are satisfiable (not vacuous).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import z3

from .z3_mutants import paired
from .z3_param import Pool, band_width, decide, det_index, in_pool, keep_rule
from .z3_param_kit import Formula, ParamLemma, Variant

__all__ = ["BAND_LEMMAS", "BAND_OBLIGATION"]

Term = Any

BAND_OBLIGATION = 20


def _band_case(p: Pool) -> Term:
    return z3.And(p.domain(), p.band_on, z3.Not(p.det))


def _again(p: Pool, name: str, ctx: Term | None = None,
           tokens: Term | None = None) -> tuple[Term, list[tuple[Term, Term]]]:
    """The same acquire at context ``ctx`` and/or ``T = tokens``: the division's
    constraints for the new quotient and remainder, and the substitution pairs."""
    c = p.ctx if ctx is None else ctx
    t = p.tokens if tokens is None else tokens
    q, r = z3.Int(f"{name}_quot"), z3.Int(f"{name}_rem")
    defs = z3.And(c >= 0, c == q * t + r, r >= 0, r < t)
    pairs = [(p.quot, q), (p.rem, r)]
    if ctx is not None:
        pairs.append((p.ctx, ctx))
    if tokens is not None:
        pairs.append((p.tokens, tokens))
    return defs, pairs


def _default_equivalence(v: Variant) -> Formula:
    """T null: the decision is the margin rule's and the same for any other context."""
    p = v.parts.pool(band=True)
    d = decide(p, v.parts)
    c2 = z3.Int("ctx2")
    terms = (d.choice, d.kept, d.broken, d.pin_after)
    other = [z3.substitute(t, (p.ctx, c2)) for t in terms]
    margin_rule = z3.And(p.hit, keep_rule(p, v.parts, margin=p.margin))
    return (z3.And(p.domain(), z3.Not(p.band_on), c2 >= 0),
            z3.Or(d.kept != margin_rule, *[a != b for a, b in zip(terms, other, strict=True)]))


def _exact(v: Variant) -> Formula:
    p = v.parts.pool(band=True)
    d = decide(p, v.parts)
    over = p.own - p.low - p.margin
    exact = z3.And(p.own <= p.low + p.cap, z3.Or(over <= 0, over * p.tokens <= p.ctx))
    return z3.And(_band_case(p), p.hit), d.kept != exact


def _skew(v: Variant) -> Formula:
    p = v.parts.pool(band=True)
    d = decide(p, v.parts)
    return _band_case(p), p.loads[d.choice] > p.low + p.cap


def _monotone_context(v: Variant) -> Formula:
    p = v.parts.pool(band=True)
    d = decide(p, v.parts)
    c2 = z3.Int("ctx2")
    defs, pairs = _again(p, "ctx2", ctx=c2)
    return (z3.And(_band_case(p), p.hit, defs, c2 >= p.ctx),
            z3.And(d.kept, z3.Not(z3.substitute(d.kept, *pairs))))


def _monotone_tokens(v: Variant) -> Formula:
    p = v.parts.pool(band=True)
    d = decide(p, v.parts)
    t2 = z3.Int("tokens2")
    defs, pairs = _again(p, "tokens2", tokens=t2)
    return (z3.And(_band_case(p), p.hit, defs, t2 >= 1, t2 <= p.tokens),
            z3.And(d.kept, z3.Not(z3.substitute(d.kept, *pairs))))


def _selectivity(v: Variant) -> Formula:
    p = v.parts.pool(band=True)
    d = decide(p, v.parts)
    return (z3.And(_band_case(p), p.hit, p.own <= p.low + p.margin),
            z3.Not(z3.And(d.kept, d.choice == p.pin)))


def _determinism(v: Variant) -> Formula:
    p = v.parts.pool(band=True)
    d = decide(p, v.parts)
    placed = z3.If(p.hit, p.pin, det_index(p.hash, p.n))
    return (z3.And(p.domain(), p.band_on, p.det),
            z3.Or(d.broken, d.choice != placed, d.pin_after != placed))


def _no_starvation(v: Variant) -> Formula:
    p = v.parts.pool(band=True)
    d = decide(p, v.parts)
    idle = z3.Int("idle")
    return (z3.And(_band_case(p), in_pool(idle, p.n), p.loads[idle] == 0),
            p.loads[d.choice] > band_width(p))


def _break(v: Variant) -> Formula:
    p = v.parts.pool(band=True)
    d = decide(p, v.parts)
    correct = z3.And(p.own > p.low, d.choice != p.pin, p.loads[d.choice] == p.low,
                     d.pin_after == d.choice)
    return z3.And(_band_case(p), d.broken), z3.Not(correct)


def _reuse_never_wider(v: Variant) -> Formula:
    """A hit the band keeps at the reuse-scaled context, it keeps at the whole prompt: the
    reuse source only ever narrows the band (towards the margin, which selectivity keeps)."""
    p = v.parts.pool(band=True)
    d = decide(p, v.parts)
    prompt, hits, lookups = z3.Int("prompt"), z3.Int("hits"), z3.Int("lookups")
    defs, pairs = _again(p, "prompt", ctx=prompt)
    report = z3.And(prompt >= 0, lookups >= 0, hits >= 0, hits <= lookups)
    return (z3.And(_band_case(p), p.hit, defs, report,
                   v.parts.reuse(prompt, hits, lookups, p.ctx)),
            z3.And(d.kept, z3.Not(z3.substitute(d.kept, *pairs))))


def _lemma(name: str, requirements: tuple[str, ...], statement: str,
           build: Callable[[Variant], Formula]) -> ParamLemma:
    return ParamLemma(name, BAND_OBLIGATION, requirements, statement, build, paired(name))


BAND_LEMMAS: tuple[ParamLemma, ...] = (
    _lemma("band_default_equivalence", ("R-BAND-3",),
           "T null: every decision is the margin rule's (any policy) and the same for every "
           "context c", _default_equivalence),
    _lemma("band_exact", ("R-BAND-1", "R-KEEP-2"),
           "band on: a hit is kept iff L[p] <= min + cap and (L[p] <= min + m or "
           "(L[p] - min - m) * T <= c), i.e. L[p] <= min + min(m + c // T, cap)",
           _exact),
    _lemma("band_skew", ("R-BAND-2",),
           "band on: the chosen server's load <= min + cap, whatever c",
           _skew),
    _lemma("band_monotone_in_context", ("R-BAND-4",),
           "band on: kept with context c1 implies kept with every c2 >= c1",
           _monotone_context),
    _lemma("band_monotone_in_tokens", ("R-BAND-4",),
           "band on: kept with T1 implies kept with every 1 <= T2 <= T1",
           _monotone_tokens),
    _lemma("band_selectivity", ("R-BAND-4", "R-KEEP-1"),
           "band on: a pin with L[p] <= min + m is kept, whatever c",
           _selectivity),
    _lemma("band_ignored_under_determinism", ("R-BAND-5", "R-DET-4"),
           "band on and full_determinism: a hit keeps its pin, a placement is pool[h mod n], "
           "whatever loads, c, T, cap",
           _determinism),
    _lemma("band_no_starvation", ("R-BAND-1", "R-KEEP-3"),
           "band on and an idle server: the chosen server's load <= min(m + c // T, cap)",
           _no_starvation),
    _lemma("band_break_correct", ("R-BAND-1", "R-BREAK-1"),
           "band on: a broken pin is above the minimum, and the acquire moves to a "
           "different least-loaded server and re-pins",
           _break),
    _lemma("band_reuse_never_wider", ("R-BAND-6", "R-BAND-4"),
           "band on, c = prompt * H // Q (prompt if Q = 0), 0 <= H <= Q: a hit kept at c "
           "is kept at c = prompt; the reuse source only narrows the band",
           _reuse_never_wider),
)
