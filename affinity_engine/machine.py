"""The transition function: ``step(config, state, event) -> Transition``.

Theory of operation
-------------------
Rule 1: no I/O, clock, randomness, the builtin hash function, floats or logging: randomness and
hashes arrive in event fields (R-PURE-1).
Rule 2: every state change happens here. :data:`TRANSITIONS` maps each event type to
its handler, and :data:`ACQUIRE_RULES` maps each way an acquire can meet the sticky map
to what it does -- the transition table as data, after h11.
Rule 3: ``step`` is total. Each event yields exactly one outcome; a :class:`Rejected`
outcome leaves the state as it was (R-OUT-2), except the stale-entry deletion of R-ACQ-6.

An acquire, in order (R-ACQ-1..8):

1. Validate the event against the configuration (reject before touching anything).
2. Classify the sticky lookup: unkeyed, miss, hit on an active server (kept or broken
   by :func:`~affinity_engine.policy.keep_pin`), or hit on a removed server. A hit is a
   lookup and refreshes recency; a removed-server hit deletes the entry. With group
   stickiness on, a grouped acquire (request id and group id) takes
   :func:`_acquire_grouped` instead, which reads the group map as the reference does
   (R-GRP-2): ``fallback`` only when the request has no own entry, ``only`` always.
3. If a placement is needed and the pool is empty: reject with ``no_servers``.
4. Choose the server (:data:`ACQUIRE_RULES` says how), write the sticky entry when the
   rule says so (evicting the least recent entry of a full map), bump the counter the
   rule names, then increment the chosen server's count -- cache write first, as verl.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Final, final

from immutables import Map

from affinity_core.config import Config, HashMode
from affinity_core.events import (
    Acquire,
    AddServers,
    ClearStickyCache,
    Event,
    ObserveLoads,
    Release,
    RemoveServers,
)
from affinity_core.outcomes import (
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

from .builders import acquired
from .leases import LeaseBook
from .loads import LoadTable
from .lru import StickyLru
from .policy import (
    Plan,
    deterministic_server,
    keep_group_pin,
    keep_pin,
    keyed_deterministic_server,
    keyed_least_loaded,
    least_loaded,
    plan_of,
    prefix_placed,
)
from .state import GroupPins, State
from .values import Value, register

__all__ = ["ACQUIRE_RULES", "TRANSITIONS", "AcquireRule", "Choice", "Lookup", "Recency",
           "Transition", "classify", "step", "writes_own_pin"]


@final
class Transition(Value):
    __slots__ = ("outcome", "state")
    __match_args__ = ("state", "outcome")
    state: State
    outcome: Outcome

    def __init__(self, state: State, outcome: Outcome) -> None:
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "outcome", outcome)


class Lookup(enum.Enum):
    """How an acquire met the sticky map, and for a grouped miss the group map."""

    UNKEYED = "unkeyed"
    MISS = "miss"
    HIT_KEEP = "hit_keep"
    HIT_BREAK = "hit_break"
    HIT_REMOVED = "hit_removed"
    GROUP_MISS = "group_miss"
    GROUP_KEEP = "group_keep"
    GROUP_BREAK = "group_break"
    GROUP_REMOVED = "group_removed"

    # Members are singletons, so identity is their equality: hashing by identity keys
    # ACQUIRE_RULES without Enum's Python-level __hash__ on every acquire.
    __hash__ = object.__hash__


class Choice(enum.Enum):
    STAY = "stay"  # the pinned server
    PLACE = "place"  # deterministic under full_determinism, else least-loaded
    LEAST_LOADED = "least_loaded"  # a re-pin: always least-loaded


class Recency(enum.Enum):
    """What a grouped acquire does to its group's entry before any write."""

    NONE = "none"  # no entry read (a membership test changes nothing)
    TOUCH = "touch"  # a lookup: the entry becomes most recent
    DELETE = "delete"  # a pin on a removed server is invalidated

    __hash__ = object.__hash__


# The members the hot path compares against, read once: an Enum member lookup on the
# class costs about as much as a dict lookup in CPython 3.11.
_UNKEYED: Final = Lookup.UNKEYED
_MISS: Final = Lookup.MISS
_HIT_KEEP: Final = Lookup.HIT_KEEP
_HIT_BREAK: Final = Lookup.HIT_BREAK
_HIT_REMOVED: Final = Lookup.HIT_REMOVED
_STAY: Final = Choice.STAY
_PLACE: Final = Choice.PLACE
_GROUP_MISS: Final = Lookup.GROUP_MISS
_GROUP_KEEP: Final = Lookup.GROUP_KEEP
_GROUP_BREAK: Final = Lookup.GROUP_BREAK
_GROUP_REMOVED: Final = Lookup.GROUP_REMOVED
_TOUCH: Final = Recency.TOUCH
_DELETE: Final = Recency.DELETE
_KEPT: Final = Path.KEPT
_NEW: Final = Path.NEW
_APPLIED: Final = ReleaseResult.APPLIED


@final
class AcquireRule(Value):
    __slots__ = ("choice", "counter", "group_recency", "path", "reports_group_eviction",
                 "write_group_pin", "write_pin")
    __match_args__ = ("path", "choice", "write_pin", "counter", "group_recency",
                      "write_group_pin", "reports_group_eviction")
    path: Path
    choice: Choice
    write_pin: bool  # write request_id -> choice into the sticky map
    counter: str | None  # the State counter this branch increments
    group_recency: Recency  # on the group's entry
    write_group_pin: bool  # write group_id -> choice into the group map
    reports_group_eviction: bool  # the outcome names the group the group write evicted

    def __init__(self, path: Path, choice: Choice, write_pin: bool, counter: str | None,
                 group_recency: Recency = Recency.NONE, write_group_pin: bool = False,
                 reports_group_eviction: bool = False) -> None:
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "choice", choice)
        object.__setattr__(self, "write_pin", write_pin)
        object.__setattr__(self, "counter", counter)
        object.__setattr__(self, "group_recency", group_recency)
        object.__setattr__(self, "write_group_pin", write_group_pin)
        object.__setattr__(self, "reports_group_eviction", reports_group_eviction)


register(Transition, AcquireRule)


# Final: the compiled build keeps the table in a C static instead of looking the name up
# in the module's globals on every acquire. Final fixes the binding, not the contents:
# the proofs' mutants still patch its entries.
ACQUIRE_RULES: Final[dict[Lookup, AcquireRule]] = {
    Lookup.UNKEYED: AcquireRule(Path.UNKEYED, Choice.PLACE, False, None),
    Lookup.MISS: AcquireRule(Path.NEW, Choice.PLACE, True, None),
    Lookup.HIT_KEEP: AcquireRule(Path.KEPT, Choice.STAY, False, "affinity_kept"),
    Lookup.HIT_BREAK: AcquireRule(Path.BROKEN, Choice.LEAST_LOADED, True, "affinity_broken"),
    Lookup.HIT_REMOVED: AcquireRule(Path.RESELECTED, Choice.PLACE, True, None),
    # The group rows (SPEC §10). Their request-pin write is skipped under "only"
    # (R-GRP-4); a group row reads no own entry, so it never touches the sticky map's.
    Lookup.GROUP_MISS: AcquireRule(Path.NEW, Choice.PLACE, True, None,
                                   Recency.NONE, True, True),
    Lookup.GROUP_KEEP: AcquireRule(Path.GROUP_KEPT, Choice.STAY, True, "group_kept",
                                   Recency.TOUCH, False, False),
    Lookup.GROUP_BREAK: AcquireRule(Path.GROUP_BROKEN, Choice.LEAST_LOADED, True,
                                    "group_broken", Recency.TOUCH, True, False),
    Lookup.GROUP_REMOVED: AcquireRule(Path.RESELECTED, Choice.PLACE, True, None,
                                      Recency.DELETE, True, False),
}


def classify(
    config: Config, state: State, request_id: str | None, context_tokens: int | None = None,
    group_id: str | None = None,
) -> tuple[Lookup, str | None]:
    """The lookup class and the pinned server (None when there is no entry).

    ``context_tokens`` is the acquire's field, read only by the context band; ``group_id``
    is read only with group stickiness on.
    """
    if request_id is None:
        return _UNKEYED, None
    if group_id is not None and plan_of(config).groups:
        return _classify_grouped(config, state, request_id, context_tokens, group_id)
    pinned = state.lru.peek(request_id)
    if pinned is None:
        return _MISS, None
    pool = state.pool
    if pinned not in pool.position:
        return _HIT_REMOVED, pinned
    if keep_pin(config, pool, pinned, context_tokens):
        return _HIT_KEEP, pinned
    return _HIT_BREAK, pinned


def _classify_grouped(config: Config, state: State, request_id: str,
                      context_tokens: int | None, group_id: str) -> tuple[Lookup, str | None]:
    """A grouped acquire's class: its own entry first under ``fallback`` (none under
    ``only``), then, with no own entry at all, its group's (R-GRP-2, R-GRP-3)."""
    pool = state.pool
    if not plan_of(config).group_only:
        pinned = state.lru.peek(request_id)
        if pinned is not None:
            if pinned not in pool.position:
                return _HIT_REMOVED, pinned
            if keep_pin(config, pool, pinned, context_tokens):
                return _HIT_KEEP, pinned
            return _HIT_BREAK, pinned
    group_pin = state.groups.lru.peek(group_id)
    if group_pin is None:
        return _GROUP_MISS, None
    if group_pin not in pool.position:
        return _GROUP_REMOVED, group_pin
    if keep_group_pin(config, pool, group_pin, context_tokens):
        return _GROUP_KEEP, group_pin
    return _GROUP_BREAK, group_pin


def _config_rejection(config: Config, event: Acquire) -> Rejected | None:
    if config.full_determinism:
        if event.request_id is None:
            return Rejected(
                RejectReason.INVALID_FOR_CONFIG, "full_determinism needs a request_id"
            )
        if config.hash_mode is HashMode.CALLER and event.request_hash is None:
            return Rejected(
                RejectReason.INVALID_FOR_CONFIG,
                "full_determinism with hash_mode 'caller' needs request_hash",
            )
    return None


def _acquire(config: Config, state: State, event: Acquire) -> Transition:
    plan = plan_of(config)  # the options, read once (policy.Plan)
    if plan.full_determinism:
        rejection = _config_rejection(config, event)
        if rejection is not None:
            return Transition(state, rejection)
    rid = event.request_id
    if plan.groups and event.group_id is not None and rid is not None:
        return _acquire_grouped(config, plan, state, event)
    lookup, pinned = classify(config, state, rid, event.context_tokens)
    rule = ACQUIRE_RULES[lookup]
    lru = state.lru
    if lookup is _HIT_REMOVED:
        assert rid is not None
        lru = lru.delete(rid)  # lazy invalidation, before the empty-pool check
    elif pinned is not None:
        assert rid is not None
        lru = lru.touch(rid)  # a lookup refreshes recency
    pool = state.pool
    choice = rule.choice
    if choice is _STAY:
        assert pinned is not None
        chosen = pinned
    elif len(pool.servers) == 0:
        reject = Rejected(RejectReason.NO_SERVERS, NO_SERVERS_MESSAGE)
        return Transition(_with_lru(state, lru) if lru is not state.lru else state, reject)
    elif choice is _PLACE and plan.full_determinism:
        chosen = deterministic_server(config, pool, state.sorted_servers, event)
    elif plan.placement:
        chosen = prefix_placed(config, pool, event, pinned, rid)
    else:
        chosen = least_loaded(config, pool, event)
    evicted = None
    if rule.write_pin:
        assert rid is not None
        evicted = lru.evicts_on_put(rid)
        lru = lru.put(rid, chosen)
    kept, broken = state.affinity_kept, state.affinity_broken
    counter = rule.counter
    if counter is not None:
        if counter == "affinity_kept":
            kept += 1
        elif counter == "affinity_broken":
            broken += 1
    leases = state.leases
    if plan.lease_accounting:
        leases = leases.grant(rid, chosen)
    new_state = State(
        pool.add_load(chosen, 1), lru, kept, broken, state.sorted_servers, leases,
        state.external, state.groups,
    )
    if evicted is None and (lookup is _HIT_KEEP or lookup is _MISS):
        return Transition(new_state, _plain_acquired(chosen, rule.path))
    previous = pinned if lookup is _HIT_BREAK or lookup is _HIT_REMOVED else None
    return Transition(new_state, acquired(chosen, rule.path, previous, evicted))


def writes_own_pin(config: Config, rule: AcquireRule) -> bool:
    """A grouped acquire's request-pin write: the row's, except that ``only`` never writes
    a grouped acquire's own entry (R-GRP-4)."""
    return rule.write_pin and not plan_of(config).group_only


def _acquire_grouped(config: Config, plan: Plan, state: State, event: Acquire) -> Transition:
    """A grouped acquire: the table's row read in full, as the reference reads it.

    Off the non-group hot path, so it favours plainness: the row says what happens to the
    group's entry, which maps are written, what the outcome reports and which counter
    moves; ``only`` never writes the request's own entry (R-GRP-4)."""
    rid, gid = event.request_id, event.group_id
    assert rid is not None and gid is not None
    lookup, pinned = _classify_grouped(config, state, rid, event.context_tokens, gid)
    rule = ACQUIRE_RULES[lookup]
    lru = state.lru
    if lookup is _HIT_REMOVED:
        lru = lru.delete(rid)
    elif lookup is _HIT_KEEP or lookup is _HIT_BREAK:
        lru = lru.touch(rid)
    pins = state.groups
    groups = pins.lru
    if groups.capacity != plan.group_cache:  # a state built without its group map
        groups = StickyLru.from_items(plan.group_cache, groups.items())
    if rule.group_recency is _TOUCH:
        groups = groups.touch(gid)
    elif rule.group_recency is _DELETE:
        groups = groups.delete(gid)
    pool = state.pool
    choice = rule.choice
    if choice is _STAY:
        assert pinned is not None
        chosen = pinned
    elif len(pool.servers) == 0:
        reject = Rejected(RejectReason.NO_SERVERS, NO_SERVERS_MESSAGE)
        if lru is state.lru and groups is pins.lru:
            return Transition(state, reject)
        return Transition(_with_lru(state, lru, GroupPins(groups, pins.kept, pins.broken)),
                          reject)
    elif choice is _PLACE and plan.full_determinism:
        chosen = keyed_deterministic_server(config, pool, state.sorted_servers, event, gid)
    elif plan.placement:
        chosen = prefix_placed(config, pool, event, pinned, gid)
    else:
        chosen = keyed_least_loaded(config, pool, event, gid)
    evicted = evicted_group = None
    if writes_own_pin(config, rule):
        evicted = lru.evicts_on_put(rid)
        lru = lru.put(rid, chosen)
    if rule.write_group_pin:
        if rule.reports_group_eviction:
            evicted_group = groups.evicts_on_put(gid)
        groups = groups.put(gid, chosen)
    counter = rule.counter
    kept, broken = state.affinity_kept, state.affinity_broken
    group_kept, group_broken = pins.kept, pins.broken
    if counter == "affinity_kept":
        kept += 1
    elif counter == "affinity_broken":
        broken += 1
    elif counter == "group_kept":
        group_kept += 1
    elif counter == "group_broken":
        group_broken += 1
    leases = state.leases.grant(rid, chosen) if plan.lease_accounting else state.leases
    new_state = State(pool.add_load(chosen, 1), lru, kept, broken, state.sorted_servers,
                      leases, state.external, GroupPins(groups, group_kept, group_broken))
    reports_previous = (lookup is _HIT_BREAK or lookup is _HIT_REMOVED
                        or lookup is _GROUP_BREAK or lookup is _GROUP_REMOVED)
    outcome = acquired(chosen, rule.path, pinned if reports_previous else None, evicted,
                       evicted_group)
    return Transition(new_state, outcome)


# Outcomes are values, so the two commonest -- a kept pin and a first placement without
# eviction, ``Acquired(server, path)`` -- and an applied release are shared, not rebuilt
# on every event. Each table is emptied when it reaches _SHARED_LIMIT server ids, so it
# stays small whatever pools a process sees. Which object is returned is unobservable:
# equal values, never mutated.
_SHARED_LIMIT: Final = 4096
_SHARED_KEPT: Final[dict[str, Acquired]] = {}
_SHARED_NEW: Final[dict[str, Acquired]] = {}
_SHARED_RELEASED: Final[dict[str, Released]] = {}


def _plain_acquired(server: str, path: Path) -> Acquired:
    table = _SHARED_KEPT if path is _KEPT else _SHARED_NEW if path is _NEW else None
    if table is None:
        return acquired(server, path)
    outcome = table.get(server)
    if outcome is None:
        if len(table) >= _SHARED_LIMIT:
            table.clear()
        outcome = table[server] = Acquired(server, path)
    return outcome


def _applied_release(server: str) -> Released:
    outcome = _SHARED_RELEASED.get(server)
    if outcome is None:
        if len(_SHARED_RELEASED) >= _SHARED_LIMIT:
            _SHARED_RELEASED.clear()
        outcome = _SHARED_RELEASED[server] = Released(server, _APPLIED)
    return outcome


def _release(config: Config, state: State, event: Release) -> Transition:
    sid = event.server_id
    if plan_of(config).lease_accounting:
        leases, verdict = state.leases.settle(event.request_id, sid)
        if verdict == "current":
            return Transition(
                _with(state, pool=state.pool.add_load(sid, -1), leases=leases),
                _applied_release(sid),
            )
        result = ReleaseResult.STALE_LEASE if verdict == "stale" else ReleaseResult.UNKNOWN_LEASE
        return Transition(_with(state, pool=state.pool, leases=leases), Released(sid, result))
    pool = state.pool
    if sid not in pool.position:
        return Transition(state, Released(sid, ReleaseResult.UNKNOWN_SERVER))
    if state.inflight(sid) == 0:  # external load is never released
        return Transition(state, Released(sid, ReleaseResult.AT_ZERO))
    return Transition(
        _with(state, pool=pool.add_load(sid, -1), leases=state.leases), _applied_release(sid)
    )


def _with(state: State, *, pool: LoadTable, leases: LeaseBook) -> State:
    return State(pool, state.lru, state.affinity_kept, state.affinity_broken,
                 state.sorted_servers, leases, state.external, state.groups)


def _with_lru(state: State, lru: StickyLru, groups: GroupPins | None = None) -> State:
    return State(state.pool, lru, state.affinity_kept, state.affinity_broken,
                 state.sorted_servers, state.leases, state.external,
                 state.groups if groups is None else groups)


def _with_pool(state: State, items: list[tuple[str, int]], external: Map[str, int],
               leases: LeaseBook) -> State:
    pool = LoadTable.build(items)
    return State(pool, state.lru, state.affinity_kept, state.affinity_broken,
                 tuple(sorted(pool.servers)), leases, external, state.groups)


def _add(config: Config, state: State, event: AddServers) -> Transition:
    loads = dict(state.pool.items())
    external = state.external
    for sid in event.server_ids:
        if sid not in loads or not config.lease_accounting:
            # Legacy: re-adding an active server resets its count (R-POOL-2), and with
            # it whatever was observed about the old incarnation.
            loads[sid] = 0
            if sid in external:
                external = external.delete(sid)
    leases = state.leases
    if config.lease_accounting:
        leases = state.leases.opened(event.server_ids)
    new_state = _with_pool(state, list(loads.items()), external, leases)
    return Transition(new_state, PoolChanged(new_state.pool.servers))


def _remove(config: Config, state: State, event: RemoveServers) -> Transition:
    gone = set(event.server_ids)
    items = [(sid, n) for sid, n in state.pool.items() if sid not in gone]
    external = state.external
    for sid in gone & set(external.keys()):
        external = external.delete(sid)
    leases = state.leases
    if config.lease_accounting:
        leases = state.leases.closed(event.server_ids)
    new_state = _with_pool(state, items, external, leases)
    return Transition(new_state, PoolChanged(new_state.pool.servers))


def _clear(config: Config, state: State, event: ClearStickyCache) -> Transition:
    pins = state.groups
    cleared_groups = len(pins.lru)
    outcome = StickyCacheCleared(len(state.lru), state.inflight_items(), cleared_groups)
    groups = pins if cleared_groups == 0 else GroupPins(pins.lru.cleared(), pins.kept,
                                                        pins.broken)
    return Transition(_with_lru(state, state.lru.cleared(), groups), outcome)


def _observe(config: Config, state: State, event: ObserveLoads) -> Transition:
    """R-OBS-1: external = max(0, observed - in-flight); routing sees in-flight + external."""
    pool, external = state.pool, state.external
    updated: list[str] = []
    ignored: list[str] = []
    for sid, observed in event.observed:
        if sid not in pool:
            ignored.append(sid)
            continue
        inflight = state.inflight(sid)
        extra = max(0, observed - inflight)
        pool = pool.set_load(sid, inflight + extra)
        external = external.set(sid, extra) if extra else (
            external.delete(sid) if sid in external else external)
        updated.append(sid)
    new_state = State(pool, state.lru, state.affinity_kept, state.affinity_broken,
                      state.sorted_servers, state.leases, external, state.groups)
    return Transition(new_state, LoadsObserved(tuple(updated), tuple(ignored)))


_Handler = Callable[[Config, State, Any], Transition]

TRANSITIONS: Final[dict[type[Any], _Handler]] = {  # Final as ACQUIRE_RULES
    Acquire: _acquire,
    Release: _release,
    AddServers: _add,
    RemoveServers: _remove,
    ClearStickyCache: _clear,
    ObserveLoads: _observe,
}

# The machine's own handlers and their event types as constants, to recognise them in
# the table without a globals lookup per step.
_ACQUIRE_HANDLER: Final[_Handler] = _acquire
_RELEASE_HANDLER: Final[_Handler] = _release
_ACQUIRE_EVENT: Final = Acquire
_RELEASE_EVENT: Final = Release


def step(config: Config, state: State, event: Event) -> Transition:
    """Apply one event. Total: every event of a known type yields one outcome."""
    handler = TRANSITIONS.get(type(event))
    # The table is read on every step (the proofs patch it); when it holds the machine's
    # own acquire or release, that handler is called directly -- a native call in the
    # compiled build instead of a call through a Python function object.
    if handler is _ACQUIRE_HANDLER and isinstance(event, _ACQUIRE_EVENT):
        return _acquire(config, state, event)
    if handler is _RELEASE_HANDLER and isinstance(event, _RELEASE_EVENT):
        return _release(config, state, event)
    if handler is None:
        raise TypeError(f"not an affinity_engine event: {event!r}")
    return handler(config, state, event)
