"""The transition function ``step(config, state, event) -> Transition`` (SPEC §10-§11).

Theory of operation
-------------------
Every state change happens here, and the transition table is data: :data:`TRANSITIONS`
maps each event type to its handler, and :data:`ACQUIRE_RULES` maps each way an acquire
meets the sticky map (:class:`Lookup`) to everything the acquire then does. The acquire
handler only interprets a row; SPEC §10 prints the same table, and a test holds the two
equal.

An acquire, in order (SPEC §10):

1. reject an acquire that does not fit ``full_determinism`` (R-ACQ-9), changing nothing;
2. classify the lookup (R-ACQ-1): unkeyed, miss, hit kept or broken by
   :func:`~affinity_core.policy.keep_pin`, or hit on a removed server;
3. apply the row's recency: a hit is a lookup (touch), a removed-server hit deletes the
   entry (R-ACQ-3), before the empty-pool check (R-ACQ-6);
4. choose the server: stay on the pin, place (deterministic under ``full_determinism``,
   else least-loaded) or re-pin least-loaded; an empty pool rejects a placement (R-ACQ-5);
5. write the pin when the row says so, noting the evicted key (R-LRU-3);
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

from .config import Config, HashMode
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
from .policy import deterministic_server, keep_pin, least_loaded
from .state import State, inflight_items
from .sticky import delete, pinned_server, put, touch

__all__ = ["ACQUIRE_RULES", "TRANSITIONS", "AcquireRule", "Choice", "Counter", "Lookup",
           "Recency", "Transition", "classify", "config_rejection", "step"]


@attrs.frozen
class Transition:
    state: State
    outcome: Outcome


class Lookup(enum.Enum):
    """How an acquire met the sticky map (R-ACQ-1)."""

    UNKEYED = "unkeyed"
    MISS = "miss"
    HIT_KEEP = "hit_keep"
    HIT_BREAK = "hit_break"
    HIT_REMOVED = "hit_removed"


class Recency(enum.Enum):
    """What the lookup does to the request's own sticky entry before any write."""

    NONE = "none"  # no entry was read (a membership test changes nothing, R-LRU-1)
    TOUCH = "touch"  # a lookup: the entry becomes most recent (R-LRU-2)
    DELETE = "delete"  # a pin on a removed server is invalidated (R-ACQ-3)


class Choice(enum.Enum):
    STAY = "stay"  # the pinned server
    PLACE = "place"  # deterministic under full_determinism, else least-loaded
    LEAST_LOADED = "least_loaded"  # a re-pin: always least-loaded (R-ACQ-4)


class Counter(enum.Enum):
    NONE = "none"
    KEPT = "affinity_kept"
    BROKEN = "affinity_broken"


@attrs.frozen
class AcquireRule:
    path: Path
    recency: Recency
    choice: Choice
    write_pin: bool  # put(request_id -> chosen) into the sticky map
    reports_previous: bool  # the outcome names the old pin
    reports_eviction: bool  # the outcome names the key the pin write evicted
    counter: Counter


ACQUIRE_RULES: MappingProxyType[Lookup, AcquireRule] = MappingProxyType({
    Lookup.UNKEYED: AcquireRule(Path.UNKEYED, Recency.NONE, Choice.PLACE,
                                False, False, False, Counter.NONE),
    Lookup.MISS: AcquireRule(Path.NEW, Recency.NONE, Choice.PLACE,
                             True, False, True, Counter.NONE),
    Lookup.HIT_KEEP: AcquireRule(Path.KEPT, Recency.TOUCH, Choice.STAY,
                                 False, False, False, Counter.KEPT),
    Lookup.HIT_BREAK: AcquireRule(Path.BROKEN, Recency.TOUCH, Choice.LEAST_LOADED,
                                  True, True, False, Counter.BROKEN),
    Lookup.HIT_REMOVED: AcquireRule(Path.RESELECTED, Recency.DELETE, Choice.PLACE,
                                    True, True, False, Counter.NONE),
})


def classify(config: Config, state: State, event: Acquire) -> tuple[Lookup, str | None]:
    """The lookup class and the pinned server (None without an entry), R-ACQ-1."""
    if event.request_id is None:
        return Lookup.UNKEYED, None
    pinned = pinned_server(state.sticky, event.request_id)
    if pinned is None:
        return Lookup.MISS, None
    if pinned not in state.pool:
        return Lookup.HIT_REMOVED, pinned
    if keep_pin(config, state, pinned, event.context_tokens):
        return Lookup.HIT_KEEP, pinned
    return Lookup.HIT_BREAK, pinned


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


def _acquire(config: Config, state: State, event: Acquire) -> Transition:
    rejection = config_rejection(config, event)
    if rejection is not None:
        return Transition(state, rejection)
    lookup, pinned = classify(config, state, event)
    rule = ACQUIRE_RULES[lookup]
    request_id = event.request_id
    sticky = state.sticky
    if rule.recency is Recency.TOUCH:
        assert request_id is not None
        sticky = touch(sticky, request_id)
    elif rule.recency is Recency.DELETE:
        assert request_id is not None
        sticky = delete(sticky, request_id)
    if rule.choice is Choice.STAY:
        assert pinned is not None
        chosen = pinned
    elif not state.pool:
        rejected = Rejected(RejectReason.NO_SERVERS, NO_SERVERS_MESSAGE)
        return Transition(attrs.evolve(state, sticky=sticky), rejected)
    elif rule.choice is Choice.PLACE and config.full_determinism:
        chosen = deterministic_server(config, state, event)
    else:
        chosen = least_loaded(config, state, event)
    evicted = None
    if rule.write_pin:
        assert request_id is not None
        sticky, evicted = put(sticky, request_id, chosen, config.max_cache_size)
    kept = state.affinity_kept + (rule.counter is Counter.KEPT)
    broken = state.affinity_broken + (rule.counter is Counter.BROKEN)
    leases = grant(state.leases, request_id, chosen) if config.lease_accounting else state.leases
    new_state = attrs.evolve(
        state, inflight=state.inflight.set(chosen, state.inflight[chosen] + 1), sticky=sticky,
        affinity_kept=kept, affinity_broken=broken, leases=leases)
    outcome = Acquired(chosen, rule.path,
                       previous=pinned if rule.reports_previous else None,
                       evicted=evicted if rule.reports_eviction else None)
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
    outcome = StickyCacheCleared(len(state.sticky), inflight_items(state))  # R-CLR-1
    return Transition(attrs.evolve(state, sticky=()), outcome)


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
