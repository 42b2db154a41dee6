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
active server outside ``allowed`` gets ``None``. Both packages are checked: the engine's
``allowed``/``draw_for``/``step`` on the table's engine states, and the reference's own
three functions on the same states abstracted (``to_reference``).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import affinity_core
import affinity_engine
from affinity_engine import Acquire, Acquired, Config, TieBreak
from affinity_engine.abstraction import to_reference
from affinity_engine.values import evolve

from .decision_table import CONFIGS, _states, contexts

__all__ = ["check_feedback"]

# the modules: each package re-exports the functions under the same names, and the
# checker controls patch the engine's module attribute
allowed_mod = importlib.import_module("affinity_engine.allowed")
reference_allowed_mod = importlib.import_module("affinity_core.allowed")


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
                        why = _feedback(draw, state, event, allowed_mod, affinity_engine) or \
                            _feedback(draw, to_reference(state), event, reference_allowed_mod,
                                      affinity_core)
                        checked += 1
                        if why is not None:
                            failures.append(f"{config!r} loads {list(state.pool.items())[:6]}"
                                            f" pin {state.lru.peek('r')} {event!r}: {why}")
                            if len(failures) >= max_failures:
                                return checked, failures
    return checked, failures


def _feedback(config: Config, state: Any, event: Acquire, functions: ModuleType,
              package: ModuleType) -> str | None:
    """The first failure of ``functions``' draw_for on ``state``, with ``package``'s step."""
    where = package.__name__
    permitted = functions.allowed(config, state, event)
    for choice in sorted(permitted):
        fed = functions.draw_for(config, state, event, choice)
        if fed is None or evolve(fed, tie_draw=event.tie_draw) != event:
            return f"{where}: draw_for({choice!r}) = {fed!r}, not the event with a tie_draw"
        o = package.step(config, state, fed).outcome
        if not (isinstance(o, Acquired) and o.server_id == choice):
            return f"{where}: draw_for({choice!r}) gives tie_draw {fed.tie_draw}, on " \
                   f"which step returns {o!r} (R-REL-2)"
    pool = state.pool if isinstance(state, affinity_core.State) else state.pool.servers
    outside = [s for s in pool if s not in permitted]
    if outside and functions.draw_for(config, state, event, outside[0]) is not None:
        return f"{where}: draw_for({outside[0]!r}) is not None, but it is not allowed " \
               "(R-REL-1)"
    return None
