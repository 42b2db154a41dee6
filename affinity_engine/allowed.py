"""The decision relation: which servers the spec permits for an acquire.

Theory of operation
-------------------
``allowed(config, state, event)`` is the set of servers a conforming implementation may
return for an acquire (R-REL-1). It abstracts from the tie-break: wherever the reference
:func:`~affinity_engine.machine.step` picks one of several least-loaded servers, every one
of them is allowed. Everywhere else the set is a singleton equal to the reference choice:

* kept sticky hit: ``{pin}``;
* ``full_determinism``: ``{deterministic_server(...)}``;
* otherwise (new, unkeyed, removed-server re-selection, broken pin): all servers at the
  minimum load, or with prefix-aware placement all of its candidates (R-PFX-3).

It is empty exactly when the acquire is rejected. :func:`draw_for` inverts the ``draw``
tie-break: the ``tie_draw`` that makes the reference pick a given allowed server. The
differential tests use it to feed an implementation's random choice back into the core
(refinement checking, R-REL-2).
"""

from __future__ import annotations

from affinity_core.config import Config, TieBreak
from affinity_core.events import Acquire

from .machine import ACQUIRE_RULES, Choice, _config_rejection, classify
from .policy import (
    deterministic_server,
    keyed_deterministic_server,
    plan_of,
    prefix_candidates,
)
from .state import State
from .values import evolve

__all__ = ["allowed", "draw_for"]


def _lookup(config: Config, state: State, event: Acquire) -> tuple[Choice, str | None]:
    grouped = config.groups and event.group_id is not None and event.request_id is not None
    if grouped:
        lookup, pinned = classify(config, state, event.request_id, event.context_tokens,
                                  event.group_id)
    else:
        lookup, pinned = classify(config, state, event.request_id, event.context_tokens)
    return ACQUIRE_RULES[lookup].choice, pinned


def _ties(config: Config, state: State, event: Acquire, pinned: str | None) -> tuple[str, ...]:
    if plan_of(config).placement:
        return tuple(prefix_candidates(config, state.pool, event, pinned))
    return state.pool.least_loaded_all()


def allowed(config: Config, state: State, event: Acquire) -> frozenset[str]:
    """Servers the spec permits for this acquire (empty iff it is rejected)."""
    if _config_rejection(config, event) is not None:
        return frozenset()
    choice, pinned = _lookup(config, state, event)
    grouped = config.groups and event.group_id is not None and event.request_id is not None
    if choice is Choice.STAY:
        assert pinned is not None
        return frozenset((pinned,))
    pool = state.pool
    if len(pool) == 0:
        return frozenset()
    if config.full_determinism and choice is Choice.PLACE:
        sorted_servers = state.sorted_servers
        if grouped:
            assert event.group_id is not None
            return frozenset((keyed_deterministic_server(config, pool, sorted_servers, event,
                                                         event.group_id),))
        return frozenset((deterministic_server(config, pool, sorted_servers, event),))
    return frozenset(_ties(config, state, event, pinned))


def draw_for(config: Config, state: State, event: Acquire, server_id: str) -> Acquire | None:
    """The event, with the ``tie_draw`` under which a ``draw``-mode core picks ``server_id``.

    Returns None when ``server_id`` is not allowed. Requires ``config.tie_break`` to be
    ``draw`` whenever the choice is among ties.
    """
    if server_id not in allowed(config, state, event):
        return None
    ties = _ties(config, state, event, _lookup(config, state, event)[1]) \
        if len(state.pool) else ()
    if server_id in ties and config.tie_break is TieBreak.DRAW:
        return evolve(event, tie_draw=ties.index(server_id))
    return event
