"""The reference consumer: run a parsed vector through :mod:`affinity_engine`.

Theory of operation
-------------------
This is spec/vectors/README.md executed literally, in the order it prescribes:

1. A construction rejection (``valid: false`` at top level) passes iff decoding the
   configuration (stage ``config``) or building the initial state (stage
   ``initial_state``) raises.
2. Otherwise decode ``config`` and ``initial_state``, then walk ``steps``:

   * malformed-event step (``error.stage == "event"``): decoding must raise; the
     state does not change;
   * event step: ``step()`` the event; the outcome JSON must equal ``expect`` exactly;
     ``allowed`` (when present) must equal the permitted set in pool order; a
     ``valid: false`` step must be rejected and leave the state unchanged (except the
     stale-entry deletion of R-ACQ-6);
   * check step: each listed field must equal the current state's.

The first mismatch ends the run: after it, the vector and the state disagree, so later
comparisons would only repeat the same divergence.
"""

from __future__ import annotations

from typing import Any

import attrs

from affinity_core.events import Acquire
from affinity_engine import (
    CodecError,
    Config,
    ConfigError,
    State,
    allowed,
    config_from_json,
    event_from_json,
    outcome_to_json,
    state_from_json,
    status,
    step,
)

from .invariants import rejection_preserves_state
from .vector_format import Case, CheckStep, EventStep

__all__ = ["Mismatch", "check_fields", "run_case"]


@attrs.frozen
class Mismatch:
    case: str
    step: int | None  # index into steps, None for construction
    message: str

    def __str__(self) -> str:
        where = "construction" if self.step is None else f"steps[{self.step}]"
        return f"{self.case}: {where}: {self.message}"


def check_fields(config: Config, state: State, checks: dict[str, Any]) -> list[str]:
    """Differences between the listed check fields and ``state`` (empty if all equal)."""
    actual = observed_fields(config, state)
    problems = []
    for key, want in checks.items():
        if key == "status":
            got_status = actual["status"]
            for skey, svalue in want.items():
                if got_status.get(skey, _MISSING) != svalue:
                    problems.append(f"status.{skey}: expected {svalue!r}, "
                                    f"got {got_status.get(skey, '<absent>')!r}")
        elif actual.get(key) != want:
            problems.append(f"{key}: expected {want!r}, got {actual.get(key)!r}")
    return problems


_MISSING = object()


def observed_fields(config: Config, state: State) -> dict[str, Any]:
    """Every check field, as JSON, for ``state``."""
    return {
        "servers": [list(p) for p in state.inflight_items()],
        "lru": [list(p) for p in state.lru.items()],
        "affinity_kept": state.affinity_kept,
        "affinity_broken": state.affinity_broken,
        "external": dict(sorted(state.external.items())),
        "status": status(config, state),
    }


def run_case(case: Case) -> Mismatch | None:
    """None when the core reproduces the vector, else the first mismatch."""
    if not case.valid:
        return _run_rejection(case)
    config, state = case.config, case.initial_state
    assert config is not None and state is not None
    for item in case.steps:
        if isinstance(item, CheckStep):
            problems = check_fields(config, state, item.checks)
            if problems:
                return Mismatch(case.path, item.index, "; ".join(problems))
            continue
        result = _run_event(config, state, item, case.path)
        if isinstance(result, Mismatch):
            return result
        state = result
    return None


def _run_event(config: Config, state: State, item: EventStep, path: str) -> State | Mismatch:
    if item.event is None:
        try:
            event_from_json(item.raw_event)
        except CodecError as exc:
            return _names_key(path, item.index, item.error, exc) or state
        return Mismatch(path, item.index, f"event {item.raw_event!r} decoded, but the vector "
                        "says it must be rejected")
    event = item.event
    if item.allowed is not None:
        if not isinstance(event, Acquire):
            return Mismatch(path, item.index, "'allowed' given on a non-acquire step")
        permitted = allowed(config, state, event)
        in_order = [sid for sid, _ in state.pool.items() if sid in permitted]
        if in_order != list(item.allowed):
            return Mismatch(path, item.index,
                            f"allowed: expected {list(item.allowed)}, got {in_order}")
    t = step(config, state, event)
    got = outcome_to_json(t.outcome)
    if got != item.expect:
        return Mismatch(path, item.index, f"outcome: expected {item.expect}, got {got}")
    if not item.valid and not rejection_preserves_state(state, t):
        return Mismatch(path, item.index, "a rejected step changed the state")
    return t.state


def _run_rejection(case: Case) -> Mismatch | None:
    assert case.error is not None
    stage = case.error["stage"]
    try:
        config = config_from_json(case.raw_config)
    except CodecError as exc:
        if stage == "config":
            return _names_key(case.path, None, case.error, exc)
        return Mismatch(case.path, None, "the configuration was rejected, but the vector "
                        "expects the initial state to be the rejected part")
    if stage == "config":
        return Mismatch(case.path, None, f"configuration {case.raw_config} was accepted; "
                        f"the vector expects it rejected ({case.error})")
    try:
        state_from_json(config, case.raw_initial_state)
    except (CodecError, ConfigError) as exc:
        return _names_key(case.path, None, case.error, exc)
    return Mismatch(case.path, None, f"initial state {case.raw_initial_state} was accepted; "
                    f"the vector expects it rejected ({case.error})")


def _names_key(path: str, index: int | None, error: dict[str, Any] | None,
               exc: Exception) -> Mismatch | None:
    """R-CFG-1 / R-EV-2: the refusal's message must name the offending key."""
    key = (error or {}).get("key", "")
    if key and key not in str(exc):
        return Mismatch(path, index, f"refused, but the message does not name {key!r}: {exc}")
    return None
