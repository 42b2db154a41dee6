"""Named invariant predicates, shared by the tests, the proofs and the conformance runners.

Theory of operation
-------------------
These are checker artefacts: they judge the engine from outside, so no runtime package
imports them (tests/test_runtime_layering.py). Each predicate states one requirement of
spec/SPEC.md as a boolean function of plain values, so that Hypothesis (``@invariant``),
the explicit-state checker, CrossHair (``post:`` lines) and the vector and scenario
runners all test the *same* sentence. Z3 cannot call Python, so :mod:`affinity_proofs`
encodes the same rules symbolically and a test cross-checks that encoding against these
functions on concrete inputs.

State-level: :func:`well_formed`. Step-level, on ``(config, pre, event, transition)``:
:func:`decision_in_pool`, :func:`within_band`, :func:`placement_is_argmin`,
:func:`acquire_effect`, :func:`counters_monotonic`, :func:`rejection_preserves_state`,
:func:`break_moves`, :func:`no_starvation`, :func:`prefix_choice`. History-level:
:class:`Ledger` with :func:`counters_consistent` and :func:`conserved`. Projection: :func:`project`,
comparing the core with :class:`~affinity_conformance.legacy.LegacyModel`.

The keep band is restated here from SPEC §7.5 (:func:`spec_band`) rather than imported from
the engine's policy: a checker that borrowed the rule it checks would agree with a wrong
rule. A test holds :func:`spec_band` equal to :func:`affinity_core.policy.keep_band`.
"""

from __future__ import annotations

import attrs

from affinity_core.config import Config
from affinity_core.events import Acquire, Event, Release
from affinity_core.outcomes import Acquired, Path, Rejected, Released, ReleaseResult
from affinity_engine.codec import state_to_json
from affinity_engine.machine import Transition
from affinity_engine.state import State
from affinity_engine.values import evolve

from .legacy import LegacyModel

__all__ = [
    "Ledger",
    "acquire_effect",
    "break_moves",
    "conserved",
    "counters_consistent",
    "counters_monotonic",
    "decision_in_pool",
    "leases_match_loads",
    "legacy_projection",
    "no_starvation",
    "placement_is_argmin",
    "prefix_choice",
    "project",
    "rejection_preserves_state",
    "spec_band",
    "step_invariants",
    "well_formed",
    "within_band",
]


def well_formed(config: Config, state: State) -> bool:
    """R-ST-2: counts >= 0, total matches, cache bound, unique keys, sorted mirror."""
    items = state.pool.items()
    servers = [s for s, _ in items]
    lru = state.lru.items()
    return (
        all(n >= 0 for _, n in state.inflight_items())
        and all(state.external[s] > 0 for s in state.external)
        and set(state.external.keys()) <= set(servers)
        and sum(n for _, n in items) == state.pool.total
        and len(set(servers)) == len(servers)
        and len(lru) <= config.max_cache_size
        and len({k for k, _ in lru}) == len(lru) == len(state.lru)
        and state.sorted_servers == tuple(sorted(servers))
        and state.affinity_kept >= 0
        and state.affinity_broken >= 0
    )


def decision_in_pool(pre: State, t: Transition) -> bool:
    """R-POOL-4: an acquire returns a server that was active before the step."""
    return not isinstance(t.outcome, Acquired) or t.outcome.server_id in pre.pool


def spec_band(config: Config, context_tokens: int | None) -> int | None:
    """The skew a sticky hit on an active pin tolerates, or None when no band applies.

    SPEC §7.5: margin ``m`` alone keeps iff ``L[p] <= min(L) + m`` (R-KEEP-1); with
    ``affinity_break_tokens = T`` and ``affinity_break_band_cap = cap`` the band is
    ``min(m + floor(c / T), cap)``, an absent ``c`` counting as 0 (R-BAND-1). Without a
    margin (legacy or dual-threshold policy) there is no band; R-CFG-6 refuses T and cap
    without a margin or without each other. ``full_determinism`` is the caller's case
    (R-BAND-5).
    """
    m = config.affinity_break_margin
    if m is None:
        return None
    tokens, cap = config.affinity_break_tokens, config.affinity_break_band_cap
    if tokens is None or cap is None:  # R-BAND-3: without T the rule is R-KEEP-1 exactly
        return m
    c = 0 if context_tokens is None else context_tokens
    return min(m + c // tokens, cap)


def _band(config: Config, event: Event | None) -> int | None:
    """The acquire's keep band (R-KEEP-1, R-BAND-1); without the event, its bound (R-BAND-2)."""
    if config.affinity_break_tokens is None or isinstance(event, Acquire):
        return spec_band(config, event.context_tokens if isinstance(event, Acquire) else None)
    return config.affinity_break_band_cap


def within_band(config: Config, pre: State, t: Transition, event: Event | None = None) -> bool:
    """R-KEEP-1 / R-BAND-1 / R-PLACE-1: a kept pin is inside the band; a break lands on a
    minimum. Without the event, a band-widened pin is checked against the cap (R-BAND-2)."""
    o = t.outcome
    band = _band(config, event)
    if not isinstance(o, Acquired) or band is None:
        return True
    if config.full_determinism:
        return o.path not in _BREAKS
    low = pre.pool.min_load
    if o.path is Path.KEPT:
        return pre.pool.load(o.server_id) <= low + band
    if o.path is Path.GROUP_KEPT:  # R-GRP-3: the group's own margin, when it has one
        margin = config.group_break_margin
        return pre.pool.load(o.server_id) <= low + (band if margin is None else margin)
    return pre.pool.load(o.server_id) <= low + _placement_slack(config)


_BREAKS = (Path.BROKEN, Path.GROUP_BROKEN)
_STAYS = (Path.KEPT, Path.GROUP_KEPT)


def _placement_slack(config: Config) -> int:
    """How far above the minimum a load-aware choice may land: ``placement_margin`` with
    prefix-aware placement (R-PFX-2, R-PFX-4), else 0 (R-PLACE-1); under
    ``full_determinism`` the margin is ignored (R-PFX-5)."""
    if config.placement_margin is None or config.full_determinism:
        return 0
    return config.placement_margin


def group_pins(state: State) -> list[tuple[str, str]]:
    """The group map (R-GRP-4), least recent first, as the codec writes it."""
    return [(g, s) for g, s in state_to_json(state).get("groups", [])]


def placement_is_argmin(config: Config, pre: State, t: Transition) -> bool:
    """R-PLACE-1: new, unkeyed, re-selected and broken placements land on a minimum (with
    prefix-aware placement, within ``min + placement_margin``: R-PFX-4)."""
    o = t.outcome
    if not isinstance(o, Acquired) or o.path in _STAYS:
        return True
    if config.full_determinism and o.path not in _BREAKS:
        return True
    return pre.pool.load(o.server_id) <= pre.pool.min_load + _placement_slack(config)


def prefix_choice(config: Config, pre: State, event: Event, t: Transition) -> bool:
    """R-PFX-2 / R-PFX-3, restated: with prefix-aware placement a load-aware choice is an
    admissible server (``L <= min + m_place``, not the pin it moves off) with the most
    cached prefix tokens among the admissible ones, and the least load among those."""
    o = t.outcome
    if (not isinstance(o, Acquired) or o.path in _STAYS or config.full_determinism
            or config.placement_margin is None):
        return True
    assert isinstance(event, Acquire)
    loads = dict(pre.pool.items())
    cached = dict(event.cached_prefix)
    bound = min(loads.values()) + config.placement_margin
    moved_off = o.previous if o.path in _BREAKS else None
    admissible = [s for s, n in loads.items() if n <= bound and s != moved_off]
    if o.server_id not in admissible:
        return False
    most = max(cached.get(s, 0) for s in admissible)
    if cached.get(o.server_id, 0) != most:
        return False
    return loads[o.server_id] == min(loads[s] for s in admissible if cached.get(s, 0) == most)


def break_moves(pre: State, t: Transition) -> bool:
    """R-BREAK-1: a break re-pins to a different server and records it as most recent."""
    o = t.outcome
    if not isinstance(o, Acquired) or o.path not in _BREAKS:
        return True
    if o.path is Path.GROUP_BROKEN:  # R-GRP-4: the group is re-pinned, most recent
        pins = group_pins(t.state)
        return (o.previous is not None and o.server_id != o.previous and bool(pins)
                and pins[-1][1] == o.server_id)
    return (
        o.previous is not None
        and o.server_id != o.previous
        and len(t.state.lru) > 0
        and t.state.lru.items()[-1][1] == o.server_id
    )


def acquire_effect(pre: State, event: Event, t: Transition,
                   config: Config | None = None) -> bool:
    """R-ACQ-7: exactly one count +1; a keyed request ends pinned (MRU) to the choice --
    except a grouped acquire under "only", which leaves the sticky map alone and ends with
    its group pinned (MRU) to the choice instead (R-GRP-4)."""
    o = t.outcome
    if not isinstance(o, Acquired):
        return True
    before, after = dict(pre.pool.items()), dict(t.state.pool.items())
    changed = {s: after[s] - before[s] for s in after if after[s] != before.get(s)}
    if changed != {o.server_id: 1}:
        return False
    assert isinstance(event, Acquire)
    if event.request_id is None:
        return t.state.lru.items() == pre.lru.items()
    if (config is not None and config.group_stickiness.value == "only"
            and event.group_id is not None):
        pins = group_pins(t.state)
        return (t.state.lru.items() == pre.lru.items() and bool(pins)
                and pins[-1] == (event.group_id, o.server_id))
    return t.state.lru.items()[-1] == (event.request_id, o.server_id)


def counters_monotonic(pre: State, t: Transition) -> bool:
    """R-CNT-2: the counters never decrease, and move by at most one per step."""
    dk = t.state.affinity_kept - pre.affinity_kept
    db = t.state.affinity_broken - pre.affinity_broken
    return dk >= 0 and db >= 0 and dk + db <= 1


def rejection_preserves_state(pre: State, t: Transition) -> bool:
    """R-OUT-2 / R-ACQ-6: a rejection changes at most the deletion of one stale entry."""
    if not isinstance(t.outcome, Rejected):
        return True
    if t.state == pre:
        return True
    if t.state.lru.items() == pre.lru.items():  # a stale group entry (R-GRP-2, step 4)
        before, after = group_pins(pre), group_pins(t.state)
        gone_groups = set(before) - set(after)
        return (
            evolve(t.state, groups=pre.groups) == pre
            and len(gone_groups) == 1
            and next(iter(gone_groups))[1] not in pre.pool
            and set(after) <= set(before)
        )
    gone = set(pre.lru.items()) - set(t.state.lru.items())
    return (
        evolve(t.state, lru=pre.lru) == pre
        and len(gone) == 1
        and next(iter(gone))[1] not in pre.pool
        and set(t.state.lru.items()) <= set(pre.lru.items())
    )


def no_starvation(config: Config, pre: State, t: Transition, event: Event | None = None) -> bool:
    """R-KEEP-3: with a margin, nothing lands on load > m (the acquire's band, R-BAND-1)
    while an idle server exists."""
    o = t.outcome
    m = _band(config, event)
    if not isinstance(o, Acquired) or m is None or config.full_determinism:
        return True
    if pre.pool.min_load > 0:
        return True
    # R-PFX-4: a load-aware choice may use the placement margin's slack too.
    bound = m if o.path in _STAYS else max(m, _placement_slack(config))
    return pre.pool.load(o.server_id) <= bound


def leases_match_loads(config: Config, state: State) -> bool:
    """R-LEASE-5: with lease accounting, each count equals its open current leases."""
    if not config.lease_accounting:
        return True
    return all(state.leases.open_count(s) == n for s, n in state.inflight_items())


def step_invariants(config: Config, pre: State, event: Event, t: Transition) -> dict[str, bool]:
    """Every per-step predicate, by name (for reporting which one failed)."""
    return {
        "well_formed": well_formed(config, t.state),
        "decision_in_pool": decision_in_pool(pre, t),
        "within_band": within_band(config, pre, t, event),
        "placement_is_argmin": placement_is_argmin(config, pre, t),
        "break_moves": break_moves(pre, t),
        "acquire_effect": acquire_effect(pre, event, t, config),
        "counters_monotonic": counters_monotonic(pre, t),
        "rejection_preserves_state": rejection_preserves_state(pre, t),
        "no_starvation": no_starvation(config, pre, t, event),
        "prefix_choice": prefix_choice(config, pre, event, t),
        "leases_match_loads": leases_match_loads(config, t.state),
    }


@attrs.frozen
class Ledger:
    """History summary for the counter and conservation predicates."""

    sticky_hits_on_active: int = 0
    acquires: int = 0
    applied_releases: int = 0
    count_resets: int = 0  # load discarded by add-on-active resets and removals

    def record(self, pre: State, event: Event, t: Transition) -> Ledger:
        o = t.outcome
        hits = self.sticky_hits_on_active
        acquires, released, resets = self.acquires, self.applied_releases, self.count_resets
        if isinstance(o, Acquired):
            acquires += 1
            hits += o.path in (Path.KEPT, Path.BROKEN)
        elif isinstance(o, Released) and o.result is ReleaseResult.APPLIED:
            released += 1
        elif not isinstance(event, (Acquire, Release)):
            resets += pre.inflight_total - t.state.inflight_total
        return Ledger(hits, acquires, released, resets)


def counters_consistent(state: State, ledger: Ledger) -> bool:
    """R-CNT-1: kept + broken == sticky hits on active servers."""
    return state.affinity_kept + state.affinity_broken == ledger.sticky_hits_on_active


def conserved(state: State, ledger: Ledger) -> bool:
    """R-CONS-2: total == acquires - applied releases - counts discarded by pool changes."""
    return state.inflight_total == (
        ledger.acquires - ledger.applied_releases - ledger.count_resets
    )


def project(state: State) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str], ...]]:
    """The part of a core state the legacy model has: pool with loads, and the LRU."""
    return state.pool.items(), state.lru.items()


def legacy_projection(model: LegacyModel) -> tuple[tuple[tuple[str, int], ...],
                                                   tuple[tuple[str, str], ...]]:
    return model.pool, model.lru
