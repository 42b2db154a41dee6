"""An independent, deliberately naive model of the upstream verl balancer.

Theory of operation
-------------------
This is the oracle for default-null equivalence (R-LEG-1). It is written from
upstream-verl.md sections 2-7 line by line and shares *no* rule with the core (it reads
only the events' data): plain tuples instead of persistent structures, linear scans
instead of a segment tree, an explicit recency list instead of a linked map. If the
core's clever structures drift from verl's semantics, the lockstep checks that compare
the two will say so.

``LegacyModel`` mirrors verl's two dicts and its LRUCache:

* ``pool``: ``((server_id, inflight), ...)`` in dict (insertion) order;
* ``lru``: ``((request_id, server_id), ...)`` from least to most recent.

``ties`` selects the upstream version: ``"first"`` (Aug-2026 main, PR #7435 with margin
null) or ``"draw"`` (verl 0.9.1's ``random.choice``, with the draw supplied).
"""

from __future__ import annotations

from typing import Literal

import attrs

from affinity_core.events import (
    Acquire,
    AddServers,
    ClearStickyCache,
    Event,
    Release,
    RemoveServers,
)

__all__ = ["LegacyModel", "LegacyResult", "legacy_acquire", "legacy_add", "legacy_clear",
           "legacy_release", "legacy_remove", "legacy_step"]

Ties = Literal["first", "draw"]


@attrs.frozen
class LegacyModel:
    pool: tuple[tuple[str, int], ...]
    lru: tuple[tuple[str, str], ...]
    max_cache_size: int
    full_determinism: bool = False

    @classmethod
    def fresh(cls, servers: list[str], max_cache_size: int = 10000,
              full_determinism: bool = False) -> LegacyModel:
        return cls(tuple((s, 0) for s in servers), (), max_cache_size, full_determinism)


@attrs.frozen
class LegacyResult:
    model: LegacyModel
    server_id: str | None  # None when verl raised
    error: str | None = None
    cleared: int | None = None  # clear_sticky_cache's cleared_entries


def _lru_get(lru: tuple[tuple[str, str], ...], key: str) -> tuple[tuple[tuple[str, str], ...], str]:
    """cachetools ``c[key]``: returns the value and moves the key to most recent."""
    for i, (k, v) in enumerate(lru):
        if k == key:
            return (*lru[:i], *lru[i + 1:], (k, v)), v
    raise KeyError(key)


def _lru_set(lru: tuple[tuple[str, str], ...], key: str, value: str,
             maxsize: int) -> tuple[tuple[str, str], ...]:
    """cachetools ``c[key] = value``."""
    if any(k == key for k, _ in lru):
        return (*[(k, v) for k, v in lru if k != key], (key, value))
    while len(lru) >= maxsize:
        lru = lru[1:]
    return (*lru, (key, value))


def legacy_acquire(model: LegacyModel, request_id: str, *, ties: Ties = "first",
                   tie_draw: int = 0, request_hash: int = 0) -> LegacyResult:
    lru = model.lru
    keys = [k for k, _ in lru]
    active = [s for s, _ in model.pool]
    loads = dict(model.pool)
    if request_id in keys:  # membership: no refresh
        lru, pinned = _lru_get(lru, request_id)  # lookup: refresh
        if pinned in loads:
            loads[pinned] += 1
            return LegacyResult(attrs.evolve(model, pool=tuple(loads.items()), lru=lru), pinned)
        lru = tuple((k, v) for k, v in lru if k != request_id)  # del cache[request_id]
    if not active:
        return LegacyResult(attrs.evolve(model, lru=lru), None,
                            "No available servers in load balancer")
    if model.full_determinism:
        chosen = active[request_hash % len(active)]
    else:
        lowest = min(loads.values())
        candidates = [s for s in active if loads[s] == lowest]
        chosen = candidates[0] if ties == "first" else candidates[tie_draw % len(candidates)]
    lru = _lru_set(lru, request_id, chosen, model.max_cache_size)
    loads[chosen] += 1
    return LegacyResult(attrs.evolve(model, pool=tuple(loads.items()), lru=lru), chosen)


def legacy_release(model: LegacyModel, server_id: str) -> LegacyModel:
    loads = dict(model.pool)
    if server_id in loads and loads[server_id] > 0:
        loads[server_id] -= 1
    return attrs.evolve(model, pool=tuple(loads.items()))


def legacy_add(model: LegacyModel, server_ids: list[str]) -> LegacyModel:
    loads = dict(model.pool)
    for sid in server_ids:
        loads[sid] = 0
    return attrs.evolve(model, pool=tuple(loads.items()))


def legacy_remove(model: LegacyModel, server_ids: list[str]) -> LegacyModel:
    loads = dict(model.pool)
    for sid in server_ids:
        loads.pop(sid, None)
    return attrs.evolve(model, pool=tuple(loads.items()))


def legacy_clear(model: LegacyModel) -> tuple[LegacyModel, int]:
    return attrs.evolve(model, lru=()), len(model.lru)


def legacy_step(model: LegacyModel, event: Event, *, ties: Ties = "first") -> LegacyResult:
    """One verl call, named by a core event (only the event's data is used).

    verl has no unkeyed requests and no load observations: an ``Acquire`` without a
    request id or an ``ObserveLoads`` is a ``ValueError`` here. ``request_hash`` stands for
    verl's builtin hash of the request id (0 when the event carries none).
    """
    if isinstance(event, Acquire):
        if event.request_id is None:
            raise ValueError("the legacy balancer has no unkeyed requests")
        return legacy_acquire(model, event.request_id, ties=ties, tie_draw=event.tie_draw,
                              request_hash=event.request_hash or 0)
    if isinstance(event, Release):
        return LegacyResult(legacy_release(model, event.server_id), None)
    if isinstance(event, AddServers):
        return LegacyResult(legacy_add(model, list(event.server_ids)), None)
    if isinstance(event, RemoveServers):
        return LegacyResult(legacy_remove(model, list(event.server_ids)), None)
    if isinstance(event, ClearStickyCache):
        cleared_model, cleared = legacy_clear(model)
        return LegacyResult(cleared_model, None, cleared=cleared)
    raise ValueError(f"the legacy balancer has no {type(event).__name__} call")
