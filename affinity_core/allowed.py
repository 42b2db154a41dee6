"""The decision relation: which servers the spec permits for an acquire (SPEC §14).

Theory of operation
-------------------
``allowed(config, state, event)`` is the set of servers a conforming implementation may
return for an acquire (R-REL-1). It abstracts from the tie-break: where ``step`` picks one
of several least-loaded servers (with prefix-aware placement: one of several equally good
:func:`~affinity_core.policy.candidates`), every one of them is allowed; everywhere else
the set is the single server ``step`` chooses. It is empty exactly when the acquire is
rejected.

:func:`draw_for` inverts the ``draw`` tie-break: the event whose ``tie_draw`` makes ``step``
pick a given allowed server, so an implementation's own random choice can be fed back into
the reference (R-REL-2).
"""

from __future__ import annotations

import attrs

from .config import Config, TieBreak
from .events import Acquire
from .machine import ACQUIRE_RULES, Choice, classify, config_rejection
from .policy import candidates, deterministic_server
from .state import State

__all__ = ["allowed", "draw_for"]


def allowed(config: Config, state: State, event: Acquire) -> frozenset[str]:
    """Servers the spec permits for this acquire (empty iff it is rejected)."""
    if config_rejection(config, event) is not None:
        return frozenset()
    lookup, pinned = classify(config, state, event)
    choice = ACQUIRE_RULES[lookup].choice
    if choice is Choice.STAY:
        assert pinned is not None
        return frozenset((pinned,))
    if not state.pool:
        return frozenset()
    if config.full_determinism and choice is Choice.PLACE:
        return frozenset((deterministic_server(config, state, event),))
    return frozenset(candidates(config, state, event, moving_from=pinned))


def draw_for(config: Config, state: State, event: Acquire, server_id: str) -> Acquire | None:
    """The event with the ``tie_draw`` under which a ``draw``-mode ``step`` picks
    ``server_id``; None when ``server_id`` is not allowed."""
    if server_id not in allowed(config, state, event):
        return None
    _, pinned = classify(config, state, event)
    ties = candidates(config, state, event, moving_from=pinned) if state.pool else ()
    if server_id in ties and config.tie_break is TieBreak.DRAW:
        return attrs.evolve(event, tie_draw=ties.index(server_id))
    return event
