"""The context band's checks on every BFS edge (obligation 20, and R-BAND-3 under 1).

Theory of operation
-------------------
The BFS runs of the band (:mod:`.scopes`) send every acquire with each context of
:func:`~.bfs_envs.contexts` (absent, 0, T - 1, T, 2T, 10^9). On every acquire edge:

* ``band_rule`` (R-BAND-1, R-BAND-2, R-BAND-5): a hit on an active pin is kept iff
  ``L[p] <= min(L) + min(m + c // T, cap)``, computed here from the pre-state's plain
  loads and the configuration's plain fields (no call into the core's policy); a kept
  pin is within ``min + cap``; under ``full_determinism`` every such hit is kept;
* ``band_monotone`` (R-BAND-4): the real ``classify`` on the pre-state, at the contexts
  0, 1, T - 1, T, T + 1, 2T, the two where the band reaches the cap, 10^9, and at every
  ``T2 <= T``: kept at ``c1`` implies kept at every ``c2 >= c1``, kept at ``T1`` implies
  kept at every ``T2 <= T1``;
* ``context_ignored_without_band`` (R-BAND-3, obligation 1, every configuration without
  the band): the same acquire replayed by the real ``step`` with another context (10^9
  for an absent one, absent otherwise) gives the same outcome and the same successor.
  Under ``full_determinism`` obligation 2's decision-independence replay varies the
  context instead (R-BAND-5).

The third check runs on every run of the scope; it is what refutes a core that reads the
context when ``T`` is null.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import attrs

from affinity_engine import Acquire, Acquired, Config, Path, State, classify, step
from affinity_engine.machine import Lookup
from affinity_engine.values import evolve

from .bfs import Check, Edge

__all__ = ["BAND_CHECKS", "plain_band"]

HUGE_CONTEXT = 10**9


def plain_band(config: Config, context_tokens: int | None) -> int:
    """R-BAND-1's width, from the configuration's plain fields: ``min(m + c // T, cap)``."""
    m, t, cap = (config.affinity_break_margin, config.affinity_break_tokens,
                 config.affinity_break_band_cap)
    assert m is not None and t is not None and cap is not None
    return min(m + (context_tokens or 0) // t, cap)


def _hit(edge: Edge) -> str | None:
    """The active pin of an acquire edge's request, or None."""
    ev = edge.event
    if not isinstance(ev, Acquire) or ev.request_id is None:
        return None
    pinned = edge.pre.lru.peek(ev.request_id)
    return pinned if pinned is not None and pinned in edge.pre.pool else None


def _band_rule(edge: Edge) -> str | None:
    pinned = _hit(edge)
    t = edge.transition
    if pinned is None or t is None:
        return None
    c, ev = edge.config, edge.event
    assert isinstance(ev, Acquire)
    o = t.outcome
    if not isinstance(o, Acquired):
        return None  # a refused acquire (R-ACQ-9) is obligation 18's
    kept = o.path is Path.KEPT and o.server_id == pinned
    if c.full_determinism:
        return None if kept else f"R-BAND-5: a hit under full_determinism was not kept: {o!r}"
    loads = dict(edge.pre.pool.items())
    low, load = min(loads.values()), loads[pinned]
    band = plain_band(c, ev.context_tokens)
    if kept != (load <= low + band):
        return (f"R-BAND-1: pin {pinned} at load {load}, min {low}, band min("
                f"{c.affinity_break_margin} + {ev.context_tokens or 0} // "
                f"{c.affinity_break_tokens}, {c.affinity_break_band_cap}) = {band}: "
                f"{'kept' if kept else 'not kept'} ({o!r})")
    cap = c.affinity_break_band_cap
    assert cap is not None
    if kept and load > low + cap:
        return f"R-BAND-2: kept {pinned} at load {load} > min {low} + cap {cap}"
    return None


@functools.lru_cache(maxsize=256)
def _with_tokens(c: Config, tokens: int) -> Config:
    return attrs.evolve(c, affinity_break_tokens=tokens)


def _probe_contexts(c: Config) -> tuple[int, ...]:
    m, t, cap = (c.affinity_break_margin, c.affinity_break_tokens,
                 c.affinity_break_band_cap)
    assert m is not None and t is not None and cap is not None
    reach = max(cap - m, 0) * t  # the smallest context whose band is the cap
    return tuple(sorted({0, 1, max(t - 1, 0), t, t + 1, 2 * t, max(reach - 1, 0), reach,
                         HUGE_CONTEXT}))


# (configuration, pre-state, request id, verdict) of the last acquire checked
_LAST_MONOTONE: list[Any] = [None, None, None, None]


def _band_monotone(edge: Edge) -> str | None:
    pinned = _hit(edge)
    if pinned is None:
        return None
    c, pre, ev = edge.config, edge.pre, edge.event
    assert isinstance(ev, Acquire) and ev.request_id is not None
    # The probe reads neither the acquire's own context nor its tie draw: the acquires of
    # one pre-state and request id (one per context and draw) come one after another and
    # share the verdict.
    last = _LAST_MONOTONE
    if last[0] is not c or last[1] is not pre or last[2] != ev.request_id:
        last[:] = [c, pre, ev.request_id, _band_monotone_verdict(c, pre, ev.request_id)]
    verdict: str | None = last[3]
    return verdict


def _band_monotone_verdict(c: Config, pre: State, request_id: str) -> str | None:
    t = c.affinity_break_tokens
    assert t is not None
    contexts = _probe_contexts(c)
    kept = {(t2, x): classify(_with_tokens(c, t2), pre, request_id, x)[0]
            is Lookup.HIT_KEEP for t2 in range(1, t + 1) for x in contexts}
    for t2 in range(1, t + 1):
        for lo, hi in itertools.pairwise(contexts):
            if kept[t2, lo] and not kept[t2, hi]:
                return f"R-BAND-4: T={t2}: kept at context {lo} but broken at {hi}"
    for x in contexts:
        for t2 in range(1, t):
            if kept[t2 + 1, x] and not kept[t2, x]:
                return f"R-BAND-4: context {x}: kept at T={t2 + 1} but broken at T={t2}"
    return None


def _context_ignored(edge: Edge) -> str | None:
    ev, t = edge.event, edge.transition
    if not isinstance(ev, Acquire) or t is None:
        return None
    other = evolve(ev, context_tokens=HUGE_CONTEXT if ev.context_tokens is None
                         else None)
    again = step(edge.config, edge.pre, other)
    if again.outcome != t.outcome:
        return (f"R-BAND-3: context_tokens={other.context_tokens} changes the outcome "
                f"{t.outcome!r} to {again.outcome!r} without the band")
    if again.state != t.state:
        return f"R-BAND-3: context_tokens={other.context_tokens} changes the successor state"
    return None


def _banded(c: Config) -> bool:
    return c.affinity_break_tokens is not None


_ACQUIRE = (Acquire,)

BAND_CHECKS: tuple[Check, ...] = (
    # Under full_determinism obligation 2's replay already varies the context.
    Check("context_ignored_without_band", 1,
          lambda c: not _banded(c) and not c.full_determinism, _context_ignored,
          events=_ACQUIRE),
    Check("band_rule", 20, _banded, _band_rule, events=_ACQUIRE),
    Check("band_monotone", 20, lambda c: _banded(c) and not c.full_determinism,
          _band_monotone, events=_ACQUIRE),
)
