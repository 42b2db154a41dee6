"""The transition function ``step(config, state, event) -> Transition`` (SPEC §10-§11).

Theory of operation
-------------------
Every state change happens here, and the transition table is data: :data:`TRANSITIONS`
maps each event type to its handler, and :data:`ACQUIRE_RULES` maps each way an acquire
meets the sticky map and the group map (:class:`Lookup`) to everything the acquire then
does. The acquire handler only interprets a row; SPEC §10 prints the same table, and a
test holds the two equal.

An acquire, in order (SPEC §10):

1. reject an acquire that does not fit ``full_determinism`` (R-ACQ-9), changing nothing;
2. classify the lookup (R-ACQ-1): unkeyed, miss, hit kept or broken by
   :func:`~affinity_core.policy.keep_pin`, or hit on a removed server; with group
   stickiness a grouped miss is classified again against the group map (R-GRP-2);
3. apply the row's recency to the entry it read: a hit is a lookup (touch), a
   removed-server hit deletes the entry (R-ACQ-3), before the empty-pool check (R-ACQ-6);
4. choose the server: stay on the pin, place (deterministic under ``full_determinism``,
   else least-loaded) or re-pin least-loaded, each least-loaded choice among
   :func:`~affinity_core.policy.candidates` (with prefix-aware placement, the admissible
   servers with the most cached prefix, R-PFX-3); an empty pool rejects a placement
   (R-ACQ-5);
5. write the pins the row names, noting the evicted keys (R-LRU-3, R-GRP-4);
6. bump the row's counter, count the request on the chosen server and grant its lease.

``step`` is total (R-OUT-1): each event yields exactly one outcome, and a rejected acquire
leaves the state as it was, except the deletion of step 3 (R-OUT-2).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import attrs

from .config import Config, GroupStickiness, HashMode
from .events import (
    Acquire,
    AddServers,
    ClearStickyCache,
    Event,
    ObserveLoads,
    Release,
    RemoveServers,
)
from .leases import Settlement, close_epochs, grant, open_epochs, settle
from .outcomes import (
    NO_SERVERS_MESSAGE,
    Acquired,
    LoadsObserved,
    Outcome,
    Path,
    PoolChanged,
    Rejected,
    RejectReason,
    Released,
    ReleaseResult,
    StickyCacheCleared,
)
from .policy import deterministic_server, is_grouped, keep_group_pin, keep_pin, least_loaded
from .state import State, inflight_items
from .sticky import Sticky, delete, pinned_server, put, touch

__all__ = ["ACQUIRE_RULES", "TRANSITIONS", "AcquireRule", "Choice", "Counter", "Lookup",
           "Recency", "Transition", "classify", "config_rejection", "step", "writes_own_pin"]


@attrs.frozen
class Transition:
    state: State
    outcome: Outcome


class Lookup(enum.Enum):
    """How an acquire met the sticky map, and for a grouped miss the group map (R-ACQ-1,
    R-GRP-2)."""

    UNKEYED = "unkeyed"
    MISS = "miss"
    HIT_KEEP = "hit_keep"
    HIT_BREAK = "hit_break"
    HIT_REMOVED = "hit_removed"
    GROUP_MISS = "group_miss"
    GROUP_KEEP = "group_keep"
    GROUP_BREAK = "group_break"
    GROUP_REMOVED = "group_removed"


class Recency(enum.Enum):
    """What the lookup does to the entry it read, before any write."""

    NONE = "none"  # no entry was read (a membership test changes nothing, R-LRU-1)
    TOUCH = "touch"  # a lookup: the entry becomes most recent (R-LRU-2)
    DELETE = "delete"  # a pin on a removed server is invalidated (R-ACQ-3)


class Choice(enum.Enum):
    STAY = "stay"  # the pin that was read
    PLACE = "place"  # deterministic under full_determinism, else least-loaded
    LEAST_LOADED = "least_loaded"  # a re-pin: always least-loaded (R-ACQ-4)


class Counter(enum.Enum):
    NONE = "none"
    KEPT = "affinity_kept"
    BROKEN = "affinity_broken"
    GROUP_KEPT = "group_kept"
    GROUP_BROKEN = "group_broken"


@attrs.frozen
class AcquireRule:
    path: Path
    recency: Recency  # on the request's own entry
    group_recency: Recency  # on the group's entry
    choice: Choice
    write_pin: bool  # put(request_id -> chosen) into the sticky map
    write_group_pin: bool  # put(group_id -> chosen) into the group map
    reports_previous: bool  # the outcome names the pin that was read
    reports_eviction: bool  # the outcome names the key the pin write evicted
    reports_group_eviction: bool  # ... and the group the group write evicted
    counter: Counter


def _rule(path: Path, recency: Recency, group_recency: Recency, choice: Choice,
          pins: str, reports: str, counter: Counter) -> AcquireRule:
    # ``pins`` and ``reports`` are written as SPEC §10's table writes them: the maps the
    # acquire writes (request, group) and the outcome fields it fills.
    pin, report = pins.split(), reports.split()
    return AcquireRule(path, recency, group_recency, choice, "request" in pin, "group" in pin,
                       "previous" in report, "evicted" in report, "evicted_group" in report,
                       counter)


_NONE, _TOUCH, _DELETE = Recency.NONE, Recency.TOUCH, Recency.DELETE
ACQUIRE_RULES: MappingProxyType[Lookup, AcquireRule] = MappingProxyType({
    Lookup.UNKEYED: _rule(Path.UNKEYED, _NONE, _NONE, Choice.PLACE, "", "", Counter.NONE),
    Lookup.MISS: _rule(Path.NEW, _NONE, _NONE, Choice.PLACE,
                       "request", "evicted", Counter.NONE),
    Lookup.HIT_KEEP: _rule(Path.KEPT, _TOUCH, _NONE, Choice.STAY, "", "", Counter.KEPT),
    Lookup.HIT_BREAK: _rule(Path.BROKEN, _TOUCH, _NONE, Choice.LEAST_LOADED,
                            "request", "previous", Counter.BROKEN),
    Lookup.HIT_REMOVED: _rule(Path.RESELECTED, _DELETE, _NONE, Choice.PLACE,
                              "request", "previous", Counter.NONE),
    Lookup.GROUP_MISS: _rule(Path.NEW, _NONE, _NONE, Choice.PLACE,
                             "request group", "evicted evicted_group", Counter.NONE),
    Lookup.GROUP_KEEP: _rule(Path.GROUP_KEPT, _NONE, _TOUCH, Choice.STAY,
                             "request", "evicted", Counter.GROUP_KEPT),
    Lookup.GROUP_BREAK: _rule(Path.GROUP_BROKEN, _NONE, _TOUCH, Choice.LEAST_LOADED,
                              "request group", "previous evicted", Counter.GROUP_BROKEN),
    Lookup.GROUP_REMOVED: _rule(Path.RESELECTED, _NONE, _DELETE, Choice.PLACE,
                                "request group", "previous evicted", Counter.NONE),
})


def classify(config: Config, state: State, event: Acquire) -> tuple[Lookup, str | None]:
    """The lookup class and the pin that was read (None without one), R-ACQ-1, R-GRP-2.

    A grouped acquire reads its own entry first (``fallback``; ``only`` skips it) and its
    group's entry only when it has no own entry at all."""
    request_id = event.request_id
    if request_id is None:
        return Lookup.UNKEYED, None
    grouped = is_grouped(config, event)
    own_map = not grouped or config.group_stickiness is GroupStickiness.FALLBACK
    pinned = pinned_server(state.sticky, request_id) if own_map else None
    if pinned is not None:
        if pinned not in state.pool:
            return Lookup.HIT_REMOVED, pinned
        if keep_pin(config, state, pinned, event.context_tokens):
            return Lookup.HIT_KEEP, pinned
        return Lookup.HIT_BREAK, pinned
    if not grouped:
        return Lookup.MISS, None
    assert event.group_id is not None
    group_pin = pinned_server(state.groups, event.group_id)
    if group_pin is None:
        return Lookup.GROUP_MISS, None
    if group_pin not in state.pool:
        return Lookup.GROUP_REMOVED, group_pin
    if keep_group_pin(config, state, group_pin, event.context_tokens):
        return Lookup.GROUP_KEEP, group_pin
    return Lookup.GROUP_BREAK, group_pin


def writes_own_pin(config: Config, event: Acquire, rule: AcquireRule) -> bool:
    """The row's request-pin write, except that ``only`` never writes a grouped acquire's
    own entry (R-GRP-4)."""
    return rule.write_pin and not (config.group_stickiness is GroupStickiness.ONLY
                                   and is_grouped(config, event))


def config_rejection(config: Config, event: Acquire) -> Rejected | None:
    """R-ACQ-9: under ``full_determinism`` an acquire needs the inputs of its placement."""
    if not config.full_determinism:
        return None
    if event.request_id is None:
        return Rejected(RejectReason.INVALID_FOR_CONFIG, "full_determinism needs a request_id")
    if config.hash_mode is HashMode.CALLER and event.request_hash is None:
        return Rejected(RejectReason.INVALID_FOR_CONFIG,
                        "full_determinism with hash_mode 'caller' needs request_hash")
    return None


def _recency(entries: Sticky, key: str | None, recency: Recency) -> Sticky:
    if recency is Recency.NONE:
        return entries
    assert key is not None
    return touch(entries, key) if recency is Recency.TOUCH else delete(entries, key)


def _acquire(config: Config, state: State, event: Acquire) -> Transition:
    rejection = config_rejection(config, event)
    if rejection is not None:
        return Transition(state, rejection)
    lookup, pinned = classify(config, state, event)
    rule = ACQUIRE_RULES[lookup]
    request_id, group_id = event.request_id, event.group_id
    sticky = _recency(state.sticky, request_id, rule.recency)
    groups = _recency(state.groups, group_id, rule.group_recency)
    if rule.choice is Choice.STAY:
        assert pinned is not None
        chosen = pinned
    elif not state.pool:
        rejected = Rejected(RejectReason.NO_SERVERS, NO_SERVERS_MESSAGE)
        return Transition(attrs.evolve(state, sticky=sticky, groups=groups), rejected)
    elif rule.choice is Choice.PLACE and config.full_determinism:
        chosen = deterministic_server(config, state, event)
    else:
        chosen = least_loaded(config, state, event, moving_from=pinned)
    evicted = evicted_group = None
    if writes_own_pin(config, event, rule):
        assert request_id is not None
        sticky, evicted = put(sticky, request_id, chosen, config.max_cache_size)
    if rule.write_group_pin:
        assert group_id is not None
        groups, evicted_group = put(groups, group_id, chosen, config.max_group_cache_size)
    leases = grant(state.leases, request_id, chosen) if config.lease_accounting else state.leases
    new_state = attrs.evolve(
        state, inflight=state.inflight.set(chosen, state.inflight[chosen] + 1), sticky=sticky,
        groups=groups, leases=leases,
        affinity_kept=state.affinity_kept + (rule.counter is Counter.KEPT),
        affinity_broken=state.affinity_broken + (rule.counter is Counter.BROKEN),
        group_kept=state.group_kept + (rule.counter is Counter.GROUP_KEPT),
        group_broken=state.group_broken + (rule.counter is Counter.GROUP_BROKEN))
    outcome = Acquired(chosen, rule.path,
                       previous=pinned if rule.reports_previous else None,
                       evicted=evicted if rule.reports_eviction else None,
                       evicted_group=evicted_group if rule.reports_group_eviction else None)
    return Transition(new_state, outcome)


_SETTLED = MappingProxyType({
    Settlement.CURRENT: ReleaseResult.APPLIED,
    Settlement.STALE: ReleaseResult.STALE_LEASE,
    Settlement.UNKNOWN: ReleaseResult.UNKNOWN_LEASE,
})


def _release(config: Config, state: State, event: Release) -> Transition:
    server_id = event.server_id
    if config.lease_accounting:  # R-LEASE-3
        leases, settlement = settle(state.leases, event.request_id, server_id)
        inflight = state.inflight
        if settlement is Settlement.CURRENT:
            inflight = inflight.set(server_id, inflight[server_id] - 1)
        return Transition(attrs.evolve(state, inflight=inflight, leases=leases),
                          Released(server_id, _SETTLED[settlement]))
    if server_id not in state.pool:  # R-RLS-1
        return Transition(state, Released(server_id, ReleaseResult.UNKNOWN_SERVER))
    if state.inflight[server_id] == 0:  # the clamp: external load is never released
        return Transition(state, Released(server_id, ReleaseResult.AT_ZERO))
    inflight = state.inflight.set(server_id, state.inflight[server_id] - 1)
    return Transition(attrs.evolve(state, inflight=inflight),
                      Released(server_id, ReleaseResult.APPLIED))


def _add(config: Config, state: State, event: AddServers) -> Transition:
    pool, inflight, external = state.pool, state.inflight, state.external
    for server_id in event.server_ids:
        if server_id not in pool:
            pool = (*pool, server_id)  # R-POOL-1: appended in event order
        elif config.lease_accounting:
            continue  # R-LEASE-4: an active server keeps its count and external load
        inflight = inflight.set(server_id, 0)  # R-POOL-2: verl resets an active count
        if server_id in external:
            external = external.delete(server_id)
    leases = state.leases
    if config.lease_accounting:
        leases = open_epochs(leases, event.server_ids)
    new_state = attrs.evolve(state, pool=pool, inflight=inflight, external=external,
                             leases=leases)
    return Transition(new_state, PoolChanged(pool))


def _remove(config: Config, state: State, event: RemoveServers) -> Transition:
    gone = set(event.server_ids)
    pool = tuple(server_id for server_id in state.pool if server_id not in gone)
    inflight, external = state.inflight, state.external
    for server_id in gone:
        if server_id in inflight:
            inflight = inflight.delete(server_id)
        if server_id in external:
            external = external.delete(server_id)
    leases = state.leases
    if config.lease_accounting:
        leases = close_epochs(leases, event.server_ids)
    new_state = attrs.evolve(state, pool=pool, inflight=inflight, external=external,
                             leases=leases)
    return Transition(new_state, PoolChanged(pool))


def _clear(config: Config, state: State, event: ClearStickyCache) -> Transition:
    outcome = StickyCacheCleared(len(state.sticky), inflight_items(state),  # R-CLR-1
                                 cleared_groups=len(state.groups))  # R-GRP-5
    return Transition(attrs.evolve(state, sticky=(), groups=()), outcome)


def _observe(config: Config, state: State, event: ObserveLoads) -> Transition:
    """R-OBS-1: ``X[s] := max(0, observed - F[s])`` for each active ``s``, in order."""
    external = state.external
    updated: list[str] = []
    ignored: list[str] = []
    for server_id, observed in event.observed:
        if server_id not in state.pool:
            ignored.append(server_id)
            continue
        extra = max(0, observed - state.inflight[server_id])
        if extra:
            external = external.set(server_id, extra)
        elif server_id in external:
            external = external.delete(server_id)
        updated.append(server_id)
    return Transition(attrs.evolve(state, external=external),
                      LoadsObserved(tuple(updated), tuple(ignored)))


TRANSITIONS: MappingProxyType[type[Any], Callable[[Config, State, Any], Transition]] = (
    MappingProxyType({
        Acquire: _acquire,
        Release: _release,
        AddServers: _add,
        RemoveServers: _remove,
        ClearStickyCache: _clear,
        ObserveLoads: _observe,
    }))


def step(config: Config, state: State, event: Event) -> Transition:
    """Apply one event. Total: every event of a known type yields one outcome."""
    handler = TRANSITIONS.get(type(event))
    if handler is None:
        raise TypeError(f"not an affinity_core event: {event!r}")
    return handler(config, state, event)
