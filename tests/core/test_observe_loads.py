"""Load observation from backend metrics: ``ObserveLoads`` (R-OBS-1..3)."""

from __future__ import annotations

from affinity_conformance.invariants import Ledger, conserved, step_invariants
from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    Config,
    Event,
    LoadsObserved,
    ObserveLoads,
    Path,
    Release,
    RemoveServers,
    initial_state,
    state_from_json,
    state_to_json,
    status,
    step,
)

from .driver import Run


def test_external_is_observed_minus_inflight_and_unknown_servers_are_ignored() -> None:
    """R-OBS-1: external := max(0, observed - in-flight); inactive ids are reported."""
    run = Run.of(affinity_break_margin=1).acquire("a", expect="s0")
    outcome = run.step(ObserveLoads(observed={"s0": 5, "s1": 0, "gone": 3}))
    assert outcome == LoadsObserved(updated=("s0", "s1"), ignored=("gone",))
    assert run.status()["external_loads"] == {"s0": 4}
    assert run.status()["servers"] == {"s0": 1, "s1": 0, "s2": 0}  # in-flight only
    assert run.status()["total_inflight"] == 1
    # An observation below the router's own count never makes external negative.
    run.step(ObserveLoads(observed={"s0": 0}))
    assert "external_loads" not in run.status()
    assert run.loads == {"s0": 1, "s1": 0, "s2": 0}


def test_routing_compares_effective_loads() -> None:
    """R-OBS-2, R-KEEP-1: a pin is judged on in-flight + external, so work the router did
    not send (another client's queue on s0) breaks a margin-1 pin."""
    run = Run.of(affinity_break_margin=1).acquire("a", expect="s0")
    run.step(ObserveLoads(observed={"s0": 3}))  # effective 3 vs min 0: outside the band
    run.acquire("a", expect="s1", path="broken", previous="s0")
    run.acquire("new", expect="s2", path="new")  # s0 (3) is not least-loaded any more


def test_release_decrements_inflight_only_and_clamps_there() -> None:
    """R-OBS-2, R-RLS-1: external load is never released; the clamp is on in-flight."""
    config = Config(affinity_break_margin=0)
    state = step(config, initial_state(config, ["s0", "s1"]), Acquire(request_id="a")).state
    state = step(config, state, ObserveLoads(observed={"s0": 4})).state
    assert state.pool.load("s0") == 4 and state.inflight("s0") == 1
    state = step(config, state, Release(server_id="s0")).state
    assert state.pool.load("s0") == 3 and state.inflight("s0") == 0
    again = step(config, state, Release(server_id="s0"))
    assert again.state == state and again.outcome.result.value == "at_zero"  # type: ignore[union-attr]


def test_add_reset_and_remove_drop_the_external_load() -> None:
    """R-OBS-2, R-POOL-2, R-POOL-3: a re-added or removed server starts with no
    external load."""
    config = Config()
    state = initial_state(config, ["s0", "s1"])
    state = step(config, state, ObserveLoads(observed={"s0": 2, "s1": 5})).state
    state = step(config, state, RemoveServers(server_ids=["s1"])).state
    assert dict(state.external) == {"s0": 2}
    state = step(config, state, AddServers(server_ids=["s0", "s1"])).state
    assert dict(state.external) == {} and state.pool.items() == (("s0", 0), ("s1", 0))


def test_inflight_is_conserved_across_observations() -> None:
    """R-OBS-3, R-CONS-2: observations never change the in-flight books, and every step
    invariant (incl. the per-decision band on effective loads) still holds."""
    config = Config(affinity_break_margin=1)
    state = initial_state(config, ["s0", "s1", "s2"])
    ledger = Ledger()
    script: list[Event] = [
        Acquire(request_id="a"), Acquire(request_id="b"),
        ObserveLoads(observed={"s0": 7, "s2": 2}), Acquire(request_id="a"),
        Acquire(request_id="c"), Release(server_id="s0"), ObserveLoads(observed={"s1": 0}),
        Acquire(request_id="b"), Release(server_id="s1"), Release(server_id="s2"),
    ]
    for event in script:
        t = step(config, state, event)
        assert all(step_invariants(config, state, event, t).values()), (event, t)
        ledger = ledger.record(state, event, t)
        state = t.state
        assert conserved(state, ledger)
    assert ledger.count_resets == 0  # observations discard no in-flight count


def test_observation_can_move_loads_so_the_arrivals_only_bound_needs_no_observation() -> None:
    """R-OBS-3: an observation may raise max-min arbitrarily in one step, which is why the
    arrivals-only induction (R-SKEW-2) is stated for traces without observations; the
    band of each decision is still measured against the loads at decision time."""
    config = Config(affinity_break_margin=1)
    state = initial_state(config, ["s0", "s1"])
    state = step(config, state, ObserveLoads(observed={"s0": 100})).state
    assert state.pool.max_load - state.pool.min_load == 100  # far above m + 1
    t = step(config, state, Acquire(request_id="x"))
    assert isinstance(t.outcome, Acquired) and t.outcome.server_id == "s1"
    assert t.outcome.path is Path.NEW


def test_observed_state_round_trips_through_the_codec() -> None:
    """R-OBS-2, R-CODEC-1: a state with external loads encodes "servers" as in-flight
    counts plus an "external" map, and decodes to the same state."""
    config = Config()
    state = step(config, initial_state(config, ["s0", "s1"]), Acquire(request_id="a")).state
    state = step(config, state, ObserveLoads(observed={"s0": 3, "s1": 2})).state
    data = state_to_json(state)
    assert data["servers"] == [["s0", 1], ["s1", 0]]
    assert data["external"] == {"s0": 2, "s1": 2}
    assert state_from_json(config, data) == state
    assert status(config, state)["external_loads"] == {"s0": 2, "s1": 2}
