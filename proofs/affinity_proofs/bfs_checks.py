"""The properties the BFS checker evaluates on every edge, one list per obligation.

Theory of operation
-------------------
Each :class:`~affinity_proofs.bfs.Check` names its obligation (proofs/README.md) and the
configurations it applies to. Wherever ``affinity_conformance.invariants`` has a named predicate
the check calls it; this module adds only properties that are not single-step
predicates of one state:

* lockstep with the independent legacy model (obligation 1): the legacy model is rebuilt
  from the pre-state's projection, so the comparison is inductive -- if the projections
  agree before every edge and each edge keeps them equal, they agree on every reachable
  state;
* decision independence under ``full_determinism`` (obligation 2): the same acquire is
  replayed by the real ``step`` on perturbed copies of the pre-state (other loads, other
  margins/gate, no other sticky entries, and for the stable mode another pool order);
* monotonicity across margins (obligation 5) via the real ``classify``;
* selectivity (obligation 6): a pin inside the band must be kept;
* the counter ledger (obligation 8) and conservation (obligation 9) are history
  properties; they are checked inductively: the ledger is seeded from the pre-state
  (``kept + broken`` hits, ``total`` acquires) and must still balance after the edge;
* the environment ground truth of :mod:`.bfs_envs` (obligations 9 and 14).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import attrs

from affinity_conformance import invariants as inv
from affinity_conformance.legacy import LegacyModel, legacy_step
from affinity_core.machine import step as reference_step
from affinity_engine import (
    VERL_STATUS_KEYS,
    Acquire,
    Acquired,
    ClearStickyCache,
    Config,
    HashMode,
    LoadTable,
    Path,
    Rejected,
    State,
    StickyCacheCleared,
    StickyLru,
    TieBreak,
    classify,
    status,
    step,
)
from affinity_engine.abstraction import to_reference
from affinity_engine.machine import Lookup
from affinity_engine.values import evolve

from .bfs import Check, Edge
from .bfs_band_checks import BAND_CHECKS
from .bfs_spec_checks import SPEC_CHECKS

__all__ = ["CHECKS", "checks_for", "in_flight_check", "lease_ground_truth_check",
           "legacy_status", "lockstep_applies"]


def _acquired(edge: Edge) -> Acquired | None:
    o = None if edge.transition is None else edge.transition.outcome
    return o if isinstance(o, Acquired) else None


def _t(edge: Edge) -> Any:
    assert edge.transition is not None
    return edge.transition


def _false(name: str) -> str:
    return f"predicate {name} is false"


_memo: list[Any] = [None, None]  # (edge, ledger): the counter and conservation checks share it


def _ledger(edge: Edge) -> inv.Ledger:
    """The history ledger seeded from the pre-state, after recording this edge.

    Seeding makes the history predicates inductive: ``kept + broken`` sticky hits and
    ``total`` acquires so far, so that they balance before the edge iff they do after it.
    """
    if _memo[0] is not edge:
        pre = edge.pre
        seed = inv.Ledger(sticky_hits_on_active=pre.affinity_kept + pre.affinity_broken,
                          acquires=pre.inflight_total)
        _memo[0], _memo[1] = edge, seed.record(pre, edge.event, _t(edge))
    ledger: inv.Ledger = _memo[1]
    return ledger


# ------------------------------------------------------------------ 1 legacy lockstep
def lockstep_applies(c: Config) -> bool:
    return (c.policy == "legacy" and not c.lease_accounting
            and c.tie_break in (TieBreak.FIRST, TieBreak.DRAW)
            and (not c.full_determinism or c.hash_mode is HashMode.CALLER))


def legacy_status(model: LegacyModel) -> dict[str, Any]:
    """verl's ``get_status`` (upstream-verl.md section 5), computed on the legacy model."""
    return {"servers": dict(model.pool), "total_inflight": sum(n for _, n in model.pool),
            "active_servers": len(model.pool), "registered_handles": [s for s, _ in model.pool]}


def _lockstep(edge: Edge) -> str | None:
    c, pre, ev, t = edge.config, edge.pre, edge.event, _t(edge)
    if isinstance(ev, Acquire) and (ev.request_id is None or (
            c.full_determinism and ev.request_hash is None)):
        return None  # verl's acquire_server always has a request id (and hashes it)
    model = LegacyModel(pre.pool.items(), pre.lru.items(), c.max_cache_size,
                        c.full_determinism)
    r = legacy_step(model, ev, ties="first" if c.tie_break is TieBreak.FIRST else "draw")
    o = t.outcome
    if isinstance(ev, Acquire):
        got = o.server_id if isinstance(o, Acquired) else None
        if got != r.server_id:
            return f"decision {got!r}, legacy model {r.server_id!r}"
        if r.error is not None and not (isinstance(o, Rejected) and o.message == r.error):
            return f"outcome {o!r}, legacy error {r.error!r}"
    if isinstance(ev, ClearStickyCache) and not (
            isinstance(o, StickyCacheCleared) and o.cleared_entries == r.cleared
            and o.server_loads == model.pool):
        return f"clear outcome {o!r}, legacy cleared {r.cleared} with loads {model.pool}"
    after = r.model
    if inv.project(t.state) != inv.legacy_projection(after):
        return f"state {inv.project(t.state)}, legacy model {inv.legacy_projection(after)}"
    core_status = {k: status(c, t.state)[k] for k in VERL_STATUS_KEYS}
    if core_status != legacy_status(after):
        return f"status {core_status}, legacy {legacy_status(after)}"
    return None


# ------------------------------------------------------------------ 2 determinism
def _alternatives(c: Config, pre: State, rid: str | None) -> list[tuple[str, Config, State]]:
    items = pre.pool.items()
    pinned = None if rid is None else pre.lru.peek(rid)
    only_entry = StickyLru(c.max_cache_size) if pinned is None or rid is None else \
        StickyLru(c.max_cache_size).put(rid, pinned)
    out: list[tuple[str, Config, State]] = []
    shuffled = [len(items) - i + 3 * (i % 2) for i in range(len(items))]
    for label, loads in (("idle loads", [0] * len(items)), ("other loads", shuffled)):
        table = LoadTable.build((s, n) for (s, _), n in zip(items, loads, strict=True))
        out.append((label, c, evolve(pre, pool=table)))
    for margin in (None, 0, 5):  # margin only: the context band (if any) dropped
        out.append((f"margin {margin}", _margin_only(c, margin), pre))
    out.append(("no other sticky entries", c, evolve(pre, lru=only_entry)))
    if c.hash_mode is HashMode.STABLE:
        reordered = LoadTable.build(tuple(reversed(items)))
        out.append(("reversed pool order", c, evolve(pre, pool=reordered)))
    return out


@functools.lru_cache(maxsize=256)
def _margin_only(c: Config, margin: int | None) -> Config:
    return attrs.evolve(c, affinity_break_margin=margin, dual_threshold=None,
                        affinity_break_tokens=None, affinity_break_band_cap=None)


# (configuration, pre-state, request id, alternatives) of the last acquire checked
_LAST_ALTERNATIVES: list[Any] = [None, None, None, None]


def _alternatives_of(c: Config, pre: State, rid: str | None
                     ) -> list[tuple[str, Config, State]]:
    """:func:`_alternatives`, shared by the acquires of one pre-state and request id
    (they differ in hash, draw or context, which the alternatives do not read)."""
    last = _LAST_ALTERNATIVES
    if last[0] is not c or last[1] is not pre or last[2] != rid:
        last[:] = [c, pre, rid, _alternatives(c, pre, rid)]
    alternatives: list[tuple[str, Config, State]] = last[3]
    return alternatives


def _determinism(edge: Edge) -> str | None:
    c, pre, ev, t = edge.config, edge.pre, edge.event, _t(edge)
    if not isinstance(ev, Acquire):
        return None
    o = t.outcome
    if isinstance(o, Acquired) and o.path is Path.BROKEN:
        return "a pin was broken under full_determinism"
    decision = o.server_id if isinstance(o, Acquired) else None
    # R-BAND-5: the context is ignored too (with or without the band configured)
    other = evolve(ev, context_tokens=10**9 if ev.context_tokens is None else None)
    for label, alt_config, alt_state, alt_event in (
            *((*a, ev) for a in _alternatives_of(c, pre, ev.request_id)),
            (f"context_tokens={other.context_tokens}", c, pre, other)):
        alt = step(alt_config, alt_state, alt_event).outcome
        alt_decision = alt.server_id if isinstance(alt, Acquired) else None
        if alt_decision != decision:
            return f"decision {decision!r} becomes {alt_decision!r} with {label}"
    return None


# ------------------------------------------------------------------ 3..7, 12, 13
def _margin_on(c: Config) -> bool:
    return c.affinity_break_margin is not None and not c.full_determinism


def _skew(edge: Edge) -> str | None:
    c, pre, t = edge.config, edge.pre, _t(edge)
    # without the event: the cap bounds a band-widened pin (R-BAND-2); with it: the band
    if not inv.within_band(c, pre, t) or not inv.within_band(c, pre, t, edge.event):
        return _false("within_band")
    if not inv.placement_is_argmin(c, pre, t):
        return _false("placement_is_argmin")
    return None


def _least_loaded_at_zero(edge: Edge) -> str | None:
    o = _acquired(edge)
    if o is None or edge.pre.pool.load(o.server_id) == edge.pre.pool.min_load:
        return None
    return f"margin 0 placed on {o.server_id} (load {edge.pre.pool.load(o.server_id)}, " \
           f"min {edge.pre.pool.min_load})"


@functools.lru_cache(maxsize=256)
def _with_margin(c: Config, margin: int | None) -> Config:
    return attrs.evolve(c, affinity_break_margin=margin)


def _margins(c: Config, top: int) -> list[int | None]:
    """The margins obligation 5 compares: 0..top and None (no margin = infinite); with the
    context band 0..cap (the cap must stay >= the margin, and the band needs one)."""
    if c.affinity_break_band_cap is not None:
        return list(range(c.affinity_break_band_cap + 1))
    return [*range(top), None]


# (configuration, pre-state, request id, context, verdict) of the last acquire checked
_LAST_MONOTONE: list[Any] = [None, None, None, None, None]


def _monotone(edge: Edge) -> str | None:
    c, pre, ev = edge.config, edge.pre, edge.event
    if not isinstance(ev, Acquire) or ev.request_id is None:
        return None
    # The verdict reads only these inputs: the acquires of one pre-state that differ only
    # in their tie draw come one after another and share it.
    last = _LAST_MONOTONE
    if last[0] is not c or last[1] is not pre or last[2] != ev.request_id \
            or last[3] != ev.context_tokens:
        last[:] = [c, pre, ev.request_id, ev.context_tokens, _monotone_verdict(c, pre, ev)]
    verdict: str | None = last[4]
    return verdict


def _monotone_verdict(c: Config, pre: State, ev: Acquire) -> str | None:
    assert ev.request_id is not None
    pinned = pre.lru.peek(ev.request_id)
    if pinned is None or pinned not in pre.pool:
        return None
    margins = _margins(c, pre.pool.max_load + 2)
    kept = [classify(_with_margin(c, m), pre, ev.request_id, ev.context_tokens)[0]
            is Lookup.HIT_KEEP for m in margins]
    # Monotone iff no adjacent pair goes from kept to broken as the margin grows.
    for i in range(len(margins) - 1):
        if kept[i] and not kept[i + 1]:
            return f"kept at margin {margins[i]} but broken at margin {margins[i + 1]}"
    return None


def _selective(edge: Edge) -> str | None:
    c, pre, ev, t = edge.config, edge.pre, edge.event, _t(edge)
    if not isinstance(ev, Acquire) or ev.request_id is None:
        return None
    pinned = pre.lru.peek(ev.request_id)
    m = c.affinity_break_margin
    if pinned is None or pinned not in pre.pool or m is None:
        return None
    if pre.pool.load(pinned) > pre.pool.min_load + m:
        return None
    o = t.outcome
    if isinstance(o, Acquired) and o.path is Path.KEPT and o.server_id == pinned:
        return None
    return f"pin {pinned} at load {pre.pool.load(pinned)} <= min {pre.pool.min_load} + {m} " \
           f"was not kept: {o!r}"


def _break(edge: Edge) -> str | None:
    c, pre, t = edge.config, edge.pre, _t(edge)
    o = _acquired(edge)
    if o is None or o.path is not Path.BROKEN:
        return None
    if not inv.break_moves(pre, t):
        return _false("break_moves")
    if not inv.placement_is_argmin(c, pre, t):
        return _false("placement_is_argmin")
    return None


def _no_starvation(edge: Edge) -> str | None:
    # with the event: the acquire's own band (R-BAND-1), not only the cap
    return None if inv.no_starvation(edge.config, edge.pre, _t(edge), edge.event) else \
        _false("no_starvation")


def _gate_bound(edge: Edge) -> str | None:
    """R-GATE-1/2: a kept pin is within max(min + abs, min * rel); breaks go to a minimum."""
    c, pre = edge.config, edge.pre
    gate = c.dual_threshold
    o = _acquired(edge)
    if o is None or gate is None or o.path is not Path.KEPT or gate.balance_abs_threshold <= 0:
        return _break(edge)
    load, low, rel = pre.pool.load(o.server_id), pre.pool.min_load, gate.balance_rel_threshold
    if load <= low + gate.balance_abs_threshold or load * rel.denominator <= low * rel.numerator:
        return None
    return f"gate kept {o.server_id} at load {load} with min {low}: beyond " \
           f"max(min + {gate.balance_abs_threshold}, min * {rel})"


# ------------------------------------------------------------------ 8..11, 14
def _counters(edge: Edge) -> str | None:
    t = _t(edge)
    if not inv.counters_monotonic(edge.pre, t):
        return _false("counters_monotonic")
    if not inv.counters_consistent(t.state, _ledger(edge)):
        return _false("counters_consistent")
    return None


def _conservation(edge: Edge) -> str | None:
    pre, t = edge.pre, _t(edge)
    negative = [(s, n) for s, n in t.state.inflight_items() if n < 0]
    if negative:  # the count part of inv.well_formed, reported on its own
        return f"in-flight count below 0: {negative}"
    if not inv.conserved(t.state, _ledger(edge)):
        return _false("conserved")
    if not inv.acquire_effect(pre, edge.event, t):
        return _false("acquire_effect")
    return None


def _cache_bound(edge: Edge) -> str | None:
    return None if inv.well_formed(edge.config, _t(edge).state) else _false("well_formed")


def _pool_liveness(edge: Edge) -> str | None:
    pre, t = edge.pre, _t(edge)
    if not inv.decision_in_pool(pre, t):
        return _false("decision_in_pool")
    if not inv.rejection_preserves_state(pre, t):
        return _false("rejection_preserves_state")
    return None


def _leases(edge: Edge) -> str | None:
    return None if inv.leases_match_loads(edge.config, _t(edge).state) else \
        _false("leases_match_loads")


def _always(c: Config) -> bool:
    return True


_ACQUIRE = (Acquire,)


_LAST_PRE: list[Any] = [None, None]  # the last pre-state and its abstraction


def _refines(edge: Edge) -> str | None:
    """Obligation 21 on every edge: the reference, stepped from the abstraction of the
    engine's pre-state, yields the same outcome and the abstraction of the engine's
    successor (refinement.py states the relation)."""
    if edge.transition is None:
        return None  # a crash of step is obligation 11's
    if _LAST_PRE[0] is not edge.pre:  # the edges of one pre-state come one after another
        _LAST_PRE[:] = [edge.pre, to_reference(edge.pre)]
    reference = reference_step(edge.config, _LAST_PRE[1], edge.event)
    if reference.outcome != edge.transition.outcome:
        return f"engine {edge.transition.outcome!r}, reference {reference.outcome!r}"
    post = edge.transition.state
    # A step that changes nothing may return its pre-state itself: the same object, so
    # the same abstraction (to_reference is a pure function of the state).
    after = _LAST_PRE[1] if post is edge.pre else to_reference(post)
    if after != reference.state:
        return f"engine successor {after!r}, reference {reference.state!r}"
    return None


CHECKS: tuple[Check, ...] = (
    Check("legacy_lockstep", 1, lockstep_applies, _lockstep),
    Check("decision_independence", 2, lambda c: c.full_determinism, _determinism,
          events=_ACQUIRE),
    Check("per_decision_skew", 3, _margin_on, _skew, events=_ACQUIRE),
    Check("least_loaded_at_margin_0", 4,  # R-SKEW-5 is the plain margin's, not the band's
          lambda c: _margin_on(c) and c.affinity_break_margin == 0
          and c.affinity_break_tokens is None, _least_loaded_at_zero,
          events=_ACQUIRE),
    Check("keep_monotone_in_margin", 5,
          lambda c: not c.full_determinism and c.dual_threshold is None, _monotone,
          events=_ACQUIRE),
    Check("selectivity", 6, _margin_on, _selective, events=_ACQUIRE),
    Check("break_correct", 7, lambda c: c.policy == "margin" and not c.full_determinism,
          _break, events=_ACQUIRE),
    Check("counter_ledger", 8, _always, _counters),
    Check("conservation", 9, _always, _conservation),
    Check("cache_bound", 10, _always, _cache_bound, per_state=True),
    Check("pool_liveness", 11, _always, _pool_liveness),
    Check("no_starvation", 12, _margin_on, _no_starvation, events=_ACQUIRE),
    Check("gate_bound", 13, lambda c: c.dual_threshold is not None and not c.full_determinism,
          _gate_bound, events=_ACQUIRE),
    Check("leases_match_loads", 14, lambda c: c.lease_accounting, _leases, per_state=True),
    *SPEC_CHECKS,  # obligations 15-18: outcomes, status, lease counters, determinism inputs
    *BAND_CHECKS,  # obligation 20 and R-BAND-3 (bfs_band_checks.py)
    Check("engine_refines_reference", 21, _always, _refines),
)


def checks_for(obligations: Sequence[int]) -> tuple[Check, ...]:
    return tuple(c for c in CHECKS if c.obligation in obligations)


# ---------------------------------------------------------- environment ground truth
def _active_mismatch(edge: Edge, expected: Callable[[str], int]) -> str | None:
    if edge.transition is None or edge.post_env is None:
        return None
    for sid, load in edge.transition.state.inflight_items():
        if load != expected(sid):
            return f"{sid} has count {load} but {expected(sid)} requests in flight"
    return None


def in_flight_check(servers: tuple[str, ...]) -> Check:
    """Obligation 9: on well-formed traces every count equals its requests in flight."""

    def violation(edge: Edge) -> str | None:
        if edge.post_env is None:
            return None  # the environment left the scope (a count above the cap)
        counts = dict(zip(servers, cast(tuple[tuple[int, int], ...], edge.post_env),
                          strict=True))
        return _active_mismatch(edge, lambda s: counts[s][0])

    return Check("in_flight_equals_count", 9, _always, violation)


def lease_ground_truth_check() -> Check:
    """Obligation 14: every count equals the outstanding grants of the current stay."""

    def violation(edge: Edge) -> str | None:
        if edge.post_env is None:
            return None
        grants = cast(tuple[tuple[str, str, int], ...], edge.post_env)
        return _active_mismatch(edge, lambda s: sum(1 for _, g, a in grants
                                                    if g == s and a == 0))

    return Check("count_equals_current_grants", 14, lambda c: c.lease_accounting, violation)
