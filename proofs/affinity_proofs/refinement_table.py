"""Obligation 15, the feedback half of refinement: ``draw_for`` makes the reference pick
every server ``allowed`` permits, and no other (R-REL-2).

Theory of operation
-------------------
R-REL-2 checks an implementation with its own ties by feeding each of its choices back
into the reference: ``draw_for(config, S, e, c)`` is the acquire whose ``tie_draw`` makes a
``draw``-mode step choose ``c``. If it named the wrong tie, every refinement check built
on it (``affinity replay``, the stateful lockstep, the router check) would compare an
implementation with a different successor than the one its choice leads to. The decision
table checks ``allowed`` against R-REL-1; this table checks the inverse on the same
configurations and pre-states (the narrow ones, N <= 3, and the wide pools of 33-65
servers): for the ``draw``-mode variant of each configuration, every ``c`` in ``allowed``
gets an event on which ``step`` returns ``c``, with the event otherwise unchanged, and an
active server outside ``allowed`` gets ``None``.
"""

from __future__ import annotations

import importlib

from affinity_engine import Acquire, Acquired, Config, TieBreak, step
from affinity_engine.values import evolve

from .decision_table import CONFIGS, _states, contexts

__all__ = ["check_feedback"]

# the module: the package re-exports the function under the same name
allowed_mod = importlib.import_module("affinity_engine.allowed")


def check_feedback(narrow_max: int = 3, max_failures: int = 1) -> tuple[int, list[str]]:
    """(choices fed back, first failures) over the decision table's configurations."""
    failures: list[str] = []
    checked = 0
    for config in CONFIGS:
        draw = config if config.tie_break is TieBreak.DRAW else \
            evolve(config, tie_break=TieBreak.DRAW)
        hashes: tuple[int | None, ...] = (None, -7) if config.full_determinism else (None,)
        for state in _states(config, narrow_max):
            for rid in ("r", "q", None):
                for h in hashes:
                    for context in contexts(config)[:2]:
                        event = Acquire(request_id=rid, request_hash=h,
                                        context_tokens=context)
                        why = _feedback(draw, state, event)
                        checked += 1
                        if why is not None:
                            failures.append(f"{config!r} loads {list(state.pool.items())[:6]}"
                                            f" pin {state.lru.peek('r')} {event!r}: {why}")
                            if len(failures) >= max_failures:
                                return checked, failures
    return checked, failures


def _feedback(config: Config, state: object, event: Acquire) -> str | None:
    from affinity_engine import State

    assert isinstance(state, State)
    permitted = allowed_mod.allowed(config, state, event)
    for choice in sorted(permitted):
        fed = allowed_mod.draw_for(config, state, event, choice)
        if fed is None or evolve(fed, tie_draw=event.tie_draw) != event:
            return f"draw_for({choice!r}) = {fed!r}, not the event with a tie_draw"
        o = step(config, state, fed).outcome
        if not (isinstance(o, Acquired) and o.server_id == choice):
            return f"draw_for({choice!r}) gives tie_draw {fed.tie_draw}, on which the " \
                   f"reference returns {o!r} (R-REL-2)"
    outside = [s for s in state.pool.servers if s not in permitted]
    if outside and allowed_mod.draw_for(config, state, event, outside[0]) is not None:
        return f"draw_for({outside[0]!r}) is not None, but it is not allowed (R-REL-1)"
    return None
