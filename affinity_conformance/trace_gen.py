"""Seeded random traces and exhaustive enumeration of tiny traces.

Theory of operation
-------------------
Generated cases must be reproducible byte for byte (the drift test regenerates every
vector and compares), and ``affinity check --budget N --seed S`` must replay the same
traces on any machine. So randomness comes from :class:`SplitMix64`, a 64-bit generator
fully specified by its 10-line algorithm, never from Python's ``random``.

A :class:`Family` is a configuration plus a small universe of ids chosen to force
collisions: 3 servers plus one spare that add/remove bring in and out, 3-5 request ids,
and small caches where evictions are the point. :func:`random_trace` draws events with
state-aware weights (releases prefer loaded servers, adds prefer removed ones) by
running the core alongside; the trace itself is just the event list.

:func:`enumerate_traces` lists every event sequence of a given length over a tiny
alphabet; :func:`select_covering` keeps a small subset that covers every distinct
*abstract step* -- (pre-state shape, event kind, outcome class) -- seen in the full set
(greedy set cover, deterministic tie order).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    Config,
    DualThreshold,
    Event,
    ObserveLoads,
    Rejected,
    Release,
    Released,
    RemoveServers,
    State,
    allowed,
    initial_state,
    step,
)

__all__ = ["FAMILIES", "Family", "SplitMix64", "abstract_steps", "enumerate_traces",
           "random_trace", "select_covering", "trace_features"]

_MASK = (1 << 64) - 1


class SplitMix64:
    """Steele, Lea and Flood's SplitMix64: portable and fully specified."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """An integer in ``[0, n)`` (modulo reduction: tiny bias, fine for testing)."""
        return self.next() % n

    def choice(self, items: Sequence[Any]) -> Any:
        return items[self.below(len(items))]

    def chance(self, percent: int) -> bool:
        return self.below(100) < percent


@attrs.frozen
class Family:
    """A configuration and id universe for generated traces (one suite each)."""

    name: str
    suite: str
    options: dict[str, Any] = attrs.field(factory=dict, hash=False)
    servers: tuple[str, ...] = ("s0", "s1", "s2")
    spare: tuple[str, ...] = ("s3",)
    rids: tuple[str, ...] = ("a", "b", "c", "d")
    pool_change_percent: int = 10
    unkeyed_percent: int = 0
    observe_percent: int = 0
    release_id_percent: int = 30
    # context_tokens values an acquire draws from (the band's c); empty: never set, and no
    # random number is drawn for it, so the older families' streams are unchanged.
    contexts: tuple[int | None, ...] = ()
    # group_id values an acquire draws from (R-GRP-2); empty: never set, and no random
    # number is drawn for it, so the other families' streams are unchanged.
    groups: tuple[str | None, ...] = ()
    # cached-prefix token counts an acquire's estimate draws from, one per active server
    # (R-PFX-3); empty: never set, and no random number is drawn for it.
    prefix_tokens: tuple[int, ...] = ()

    def config(self) -> Config:
        return Config(**self.options)


FAMILIES: tuple[Family, ...] = (
    Family("legacy_first", "legacy"),
    Family("legacy_draw", "legacy", {"tie_break": "draw"}),
    Family("eviction_c2", "eviction", {"max_cache_size": 2}, rids=("a", "b", "c", "d", "e")),
    Family("eviction_c3_draw", "eviction", {"max_cache_size": 3, "tie_break": "draw"},
           rids=("a", "b", "c", "d", "e")),
    Family("failover", "failover", pool_change_percent=30),
    Family("determinism_caller", "determinism", {"full_determinism": True}),
    Family("determinism_stable", "determinism",
           {"full_determinism": True, "hash_mode": "stable"}),
    Family("margin0", "margin", {"affinity_break_margin": 0}),
    Family("margin1", "margin", {"affinity_break_margin": 1}, rids=("a", "b", "c")),
    Family("margin2_c2", "margin", {"affinity_break_margin": 2, "max_cache_size": 2}),
    Family("margin1_draw", "ties", {"affinity_break_margin": 1, "tie_break": "draw"}),
    Family("margin1_hashed", "ties", {"affinity_break_margin": 1, "tie_break": "hashed"}),
    Family("gate", "dual_threshold", {"dual_threshold": DualThreshold(1, 1)}),
    Family("gate_rel", "dual_threshold", {"dual_threshold": DualThreshold(2, "3/2")}),
    Family("unkeyed", "unkeyed", {"affinity_break_margin": 1}, unkeyed_percent=30),
    Family("leases", "leases", {"lease_accounting": True}, pool_change_percent=20,
           release_id_percent=80, unkeyed_percent=10),
    Family("observations", "observations", {"affinity_break_margin": 1}, observe_percent=10),
    # The context band (SPEC section 7.5); appended last so the seeds above stay the same.
    # Contexts straddle multiples of T (T-1, T, 2T, ...), absent (None) and huge values.
    Family("band_m1_t4_cap3", "band", {"affinity_break_margin": 1, "affinity_break_tokens": 4,
                                       "affinity_break_band_cap": 3},
           rids=("a", "b", "c"), contexts=(None, 0, 3, 4, 7, 8, 12, 1000)),
    Family("band_m0_t2_cap2_c2", "band", {"affinity_break_margin": 0, "affinity_break_tokens": 2,
                                          "affinity_break_band_cap": 2, "max_cache_size": 2},
           contexts=(None, 0, 1, 2, 3, 4, 9)),
    Family("band_ignored_margin1", "band", {"affinity_break_margin": 1},
           rids=("a", "b", "c"), contexts=(None, 0, 5, 50, 5000)),
    # Group pins (SPEC section 7.6), appended last for the same reason. group_only is
    # R-GRP-8's configuration: every acquire carries a group id and no pool change (PR
    # #6122's class has no add/remove), so a trace exercises group hits and the group LRU.
    Family("group_only", "group", {"group_stickiness": "only", "max_cache_size": 2,
                                   "max_group_cache_size": 2},
           rids=("a", "b", "c", "d", "e"), pool_change_percent=0, groups=("g1", "g2", "g3")),
    Family("group_fallback_m1", "group", {"group_stickiness": "fallback",
                                          "affinity_break_margin": 1, "group_break_margin": 0,
                                          "max_group_cache_size": 2},
           rids=("a", "b", "c", "d", "e"), groups=("g1", "g2", "g3", None)),
    # Prefix-aware placement (SPEC section 8.1), appended last for the same reason. The
    # estimates are drawn from few values so that equal estimates (the load tie-break,
    # then the configured one) are common.
    Family("prefix_m1_p2", "prefix", {"affinity_break_margin": 1, "placement_margin": 2},
           prefix_tokens=(0, 0, 16, 64), unkeyed_percent=10),
    Family("prefix_m0_p1_draw", "prefix", {"affinity_break_margin": 0, "placement_margin": 1,
                                           "tie_break": "draw"}, prefix_tokens=(0, 32)),
    Family("prefix_groups_hashed", "prefix", {"affinity_break_margin": 1, "placement_margin": 3,
                                              "group_stickiness": "fallback",
                                              "group_break_margin": 0, "tie_break": "hashed"},
           groups=("g1", "g2", None), prefix_tokens=(0, 16, 16, 48)),
)


def random_trace(family: Family, rng: SplitMix64, length: int) -> list[Event]:
    """``length`` events for ``family`` drawn from ``rng`` (see module docstring)."""
    config = family.config()
    state = initial_state(config, family.servers)
    universe = (*family.servers, *family.spare)
    events: list[Event] = []
    for _ in range(length):
        event = _draw_event(family, config, state, universe, rng)
        events.append(event)
        state = step(config, state, event).state
    return events


def _draw_event(family: Family, config: Config, state: State, universe: Sequence[str],
                rng: SplitMix64) -> Event:
    roll = rng.below(100)
    active = [s for s, _ in state.pool.items()]
    if roll < family.pool_change_percent:
        inactive = [s for s in universe if s not in active]
        if rng.chance(50) and active:
            return RemoveServers(server_ids=[rng.choice(active)])
        pick = [rng.choice(inactive)] if inactive and rng.chance(75) else [rng.choice(universe)]
        return AddServers(server_ids=pick)
    roll -= family.pool_change_percent
    if roll < 3:
        return ClearStickyCache()
    if roll < 3 + family.observe_percent:
        sid = rng.choice(universe)
        return ObserveLoads(observed=[(sid, rng.below(5))])
    if roll < 33 + family.observe_percent:
        return _draw_release(family, state, active, universe, rng)
    rid = None if rng.chance(family.unkeyed_percent) else rng.choice(family.rids)
    draw = rng.below(6) if config.tie_break.value in ("draw", "hashed") else 0
    request_hash = None
    if config.full_determinism and config.hash_mode.value == "caller":
        request_hash = rng.below(13) - 3
    context = rng.choice(family.contexts) if family.contexts else None
    group = rng.choice(family.groups) if family.groups else None
    cached = tuple((sid, rng.choice(family.prefix_tokens)) for sid in active) \
        if family.prefix_tokens else ()
    return Acquire(request_id=rid, tie_draw=draw, request_hash=request_hash,
                   context_tokens=context, group_id=group, cached_prefix=cached)


def _draw_release(family: Family, state: State, active: Sequence[str],
                  universe: Sequence[str], rng: SplitMix64) -> Release:
    loaded = [s for s, n in state.inflight_items() if n > 0]
    sid = rng.choice(loaded) if loaded and rng.chance(80) else rng.choice(universe)
    rid = None
    if rng.chance(family.release_id_percent):
        pinned = [r for r, s in state.lru.items() if s == sid]
        rid = rng.choice(pinned) if pinned and rng.chance(70) else rng.choice(family.rids)
    return Release(server_id=sid, request_id=rid)


def trace_features(config: Config, servers: Sequence[str], events: Sequence[Event]) -> set[str]:
    """What makes a trace interesting: the branches and hazards it exercises."""
    state = initial_state(config, servers)
    seen: set[str] = set()
    removed: set[str] = set()
    for event in events:
        pre = state
        # Read from ``pre`` before stepping it: a stepped state's sticky map re-derives
        # itself on its next read (StickyLru, "a non-tip version").
        ties = isinstance(event, Acquire) and len(allowed(config, pre, event)) > 1
        t = step(config, state, event)
        outcome = t.outcome
        if isinstance(outcome, Acquired):
            seen.add(f"path:{outcome.path.value}")
            if isinstance(event, Acquire):
                seen |= _band_features(config, pre, event, outcome)
            if outcome.evicted is not None:
                seen.add("eviction")
            if outcome.evicted_group is not None:
                seen.add("group_eviction")
            if ties:
                seen.add("tie")
        elif isinstance(outcome, Rejected):
            seen.add(f"rejected:{outcome.reason.value}")
        elif isinstance(outcome, Released):
            seen.add(f"release:{outcome.result.value}")
        if isinstance(event, RemoveServers):
            removed.update(s for s in event.server_ids if s in pre.pool)
        if isinstance(event, AddServers):
            if any(s in removed for s in event.server_ids):
                seen.add("re-add")
            if any(s in pre.pool for s in event.server_ids):
                seen.add("add-active")
        if isinstance(event, ClearStickyCache) and len(pre.lru):
            seen.add("clear")
        state = t.state
    return seen


def _band_features(config: Config, pre: State, event: Acquire, outcome: Acquired) -> set[str]:
    """The context band's cases (only with T set): a hit kept only because the context
    widened the margin, and a band clamped by the cap (R-BAND-1, R-BAND-2)."""
    margin, tokens, cap = (config.affinity_break_margin, config.affinity_break_tokens,
                           config.affinity_break_band_cap)
    if not config.context_band or margin is None or tokens is None or cap is None:
        return set()
    seen = set()
    if margin + (event.context_tokens or 0) // tokens > cap:
        seen.add("band:capped")
    pinned = pre.pool.load(outcome.server_id) if outcome.server_id in pre.pool else 0
    if outcome.path.value == "kept" and pinned > pre.pool.min_load + margin:
        seen.add("band:widened")
    return seen


# ----------------------------------------------------------------- enumeration
def enumerate_traces(alphabet: Sequence[Event], length: int) -> Iterator[tuple[Event, ...]]:
    """Every sequence of exactly ``length`` events over ``alphabet`` (product order)."""
    return itertools.product(alphabet, repeat=length)


def _shape(config: Config, state: State, event: Event) -> tuple[Any, ...]:
    pool = state.pool
    spread = (pool.max_load - pool.min_load) if len(pool) else -1
    pinned: str = "-"
    if isinstance(event, Acquire) and event.request_id is not None:
        pin = state.lru.peek(event.request_id)
        pinned = "miss" if pin is None else ("active" if pin in pool else "removed")
    full = len(state.lru) >= config.max_cache_size
    return (len(pool), min(spread, 2), pool.tie_count if len(pool) else 0, full, pinned)


def abstract_steps(config: Config, servers: Sequence[str],
                   events: Sequence[Event]) -> set[tuple[Any, ...]]:
    """The (pre-state shape, event kind, outcome class) items a trace covers."""
    state = initial_state(config, servers)
    items: set[tuple[Any, ...]] = set()
    for event in events:
        shape = _shape(config, state, event)  # before stepping (see trace_features)
        t = step(config, state, event)
        o = t.outcome
        detail = (o.path.value, o.evicted is not None) if isinstance(o, Acquired) else (
            o.result.value if isinstance(o, Released) else type(o).__name__)
        items.add((shape, type(event).__name__, detail))
        state = t.state
    return items


def select_covering(config: Config, servers: Sequence[str],
                    traces: Sequence[Sequence[Event]], limit: int) -> list[int]:
    """Indices of at most ``limit`` traces covering the most abstract steps (greedy)."""
    covers = [abstract_steps(config, servers, t) for t in traces]
    covered: set[tuple[Any, ...]] = set()
    chosen: list[int] = []
    while len(chosen) < limit:
        best, gain = -1, 0
        for i, items in enumerate(covers):
            new = len(items - covered)
            if new > gain:
                best, gain = i, new
        if best < 0:
            break
        chosen.append(best)
        covered |= covers[best]
    return chosen
