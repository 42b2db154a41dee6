"""The balancer state and the configuration event that creates it (SPEC §3).

Theory of operation
-------------------
The state is the legacy balancer's state made explicit (R-ST-1):

* ``pool``: the active server ids in pool order (insertion order, R-POOL-1);
* ``inflight``: the requests this balancer routed to each active server and has not seen
  released (``F``);
* ``external``: load the balancer did not route, set by observe_loads (``X``, R-OBS-1);
  only non-zero entries are stored;
* ``sticky``: the sticky map, least recent first (:mod:`affinity_core.sticky`); its
  entries may point at removed servers, which are invalidated lazily (R-ACQ-3);
* ``affinity_kept`` / ``affinity_broken``: monotonic counters (R-CNT-1);
* ``groups``: the group map, ``group_id -> server_id`` with the sticky map's LRU rules,
  and its counters ``group_kept`` / ``group_broken``; empty and 0 unless group stickiness
  is on (R-GRP-1, R-GRP-5);
* ``leases``: the lease book, used only with ``lease_accounting`` (§12).

Every routing rule compares the load ``L[s] = F[s] + X[s]`` (:func:`load`). States are
frozen values; every step builds a new one.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from immutables import Map

from .config import Config, ConfigError
from .events import is_valid_id
from .leases import LeaseBook, open_epochs
from .sticky import Sticky

__all__ = ["State", "inflight_items", "initial_state", "load", "loads"]


@attrs.frozen
class State:
    pool: tuple[str, ...]
    inflight: Map[str, int]
    external: Map[str, int] = attrs.field(factory=Map)
    sticky: Sticky = ()
    affinity_kept: int = 0
    affinity_broken: int = 0
    leases: LeaseBook = attrs.field(factory=LeaseBook)
    groups: Sticky = ()
    group_kept: int = 0
    group_broken: int = 0


def load(state: State, server_id: str) -> int:
    """``L[s] = F[s] + X[s]`` for an active server."""
    return state.inflight[server_id] + state.external.get(server_id, 0)


def loads(state: State) -> tuple[int, ...]:
    """The loads of the active servers, in pool order."""
    return tuple(load(state, server_id) for server_id in state.pool)


def inflight_items(state: State) -> tuple[tuple[str, int], ...]:
    """``(server_id, F)`` in pool order."""
    return tuple((server_id, state.inflight[server_id]) for server_id in state.pool)


def initial_state(config: Config, servers: Iterable[str] = ()) -> State:
    """The configuration event (R-CFG-2): a fresh balancer over ``servers``, all idle."""
    supplied: object = servers
    if isinstance(supplied, str) or not isinstance(supplied, Iterable):
        raise ConfigError(f"servers must be a list of server ids, got {supplied!r}")
    ids: list[object] = list(supplied)
    for value in ids:
        if not is_valid_id(value):
            raise ConfigError(
                f"servers must be non-empty strings of Unicode scalar values, got {value!r}")
    pool = tuple(str(server_id) for server_id in ids)
    if len(set(pool)) != len(pool):
        raise ConfigError(f"servers must be unique, got {list(pool)!r}")
    leases = open_epochs(LeaseBook(), pool) if config.lease_accounting else LeaseBook()
    return State(pool=pool, inflight=Map({server_id: 0 for server_id in pool}), leases=leases)
