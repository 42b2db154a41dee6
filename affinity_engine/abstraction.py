"""The abstraction function: an engine state as the reference state it stands for.

Theory of operation
-------------------
The engine keeps its own representation of the SPEC §3 state, built for speed: effective
loads ``F + X`` in a segment tree (:mod:`.loads`), the sticky map as a shared write log
(:mod:`.lru`), the group map as a second such map with its counters
(:class:`~affinity_engine.state.GroupPins`), the lease book with native fields and the
sorted pool cached. Configuration,
events and outcomes are the reference's own values (:mod:`affinity_core`), so outcomes of
the two compare with ``==``.

:func:`to_reference` maps an engine state to the ``affinity_core.State`` it represents;
:func:`from_reference` builds the engine state for a reference state. ``affinity verify``'s
refinement obligation checks, step for step, that the engine's outcome equals the
reference's and that ``to_reference`` of the engine's successor equals the reference's
successor. The two functions are inverse on every well-formed state (tested).
"""

from __future__ import annotations

from immutables import Map

import affinity_core
import affinity_core.leases
from affinity_core.config import Config

from .leases import LeaseBook
from .loads import LoadTable
from .lru import StickyLru
from .state import NO_GROUPS, GroupPins, State

__all__ = ["from_reference", "to_reference"]


def to_reference(state: State) -> affinity_core.State:
    book = state.leases
    return affinity_core.State(
        pool=state.pool.servers,
        inflight=Map(state.inflight_items()),
        external=state.external,
        sticky=state.lru.items(),
        affinity_kept=state.affinity_kept,
        affinity_broken=state.affinity_broken,
        leases=affinity_core.leases.LeaseBook(
            held=book.held, epoch=book.epoch, next_epoch=book.next_epoch,
            unknown_leases=book.unknown_leases, stale_leases=book.stale_leases),
        groups=state.groups.lru.items(),
        group_kept=state.groups.kept,
        group_broken=state.groups.broken,
    )


def from_reference(config: Config, state: affinity_core.State) -> State:
    book = state.leases
    effective = [(server_id, state.inflight[server_id] + state.external.get(server_id, 0))
                 for server_id in state.pool]
    return State(
        LoadTable.build(effective),
        StickyLru.from_items(config.max_cache_size, state.sticky),
        state.affinity_kept,
        state.affinity_broken,
        tuple(sorted(state.pool)),
        LeaseBook(book.held, book.epoch, book.next_epoch, book.unknown_leases,
                  book.stale_leases),
        state.external,
        _groups(config, state),
    )


def _groups(config: Config, state: affinity_core.State) -> GroupPins:
    if not config.groups and not state.groups and not state.group_kept \
            and not state.group_broken:
        return NO_GROUPS  # what initial_state holds with group stickiness off
    return GroupPins(StickyLru.from_items(config.max_group_cache_size, state.groups),
                     state.group_kept, state.group_broken)
