"""The explicit-state checker itself: shortest traces, finiteness, symmetry soundness
(formal-methods.md section 9), and the environments' ground truth (R-CONS-2, R-HAZ-1,
R-LEASE-5)."""

from __future__ import annotations

import attrs
from affinity_proofs.bfs import Check, explore, normalize, state_key
from affinity_proofs.bfs_envs import FreeEnv, Universe
from affinity_proofs.bfs_tasks import run_spec, symmetry_sound
from affinity_proofs.scopes import BfsRun, scope_named

from affinity_engine import Acquire, AddServers, Config, initial_state, step
from affinity_engine.values import evolve

U2 = Universe(("s0", "s1"), ("s0", "s1"), ("a", "b"), unkeyed=False)


def test_violation_trace_is_a_shortest_one() -> None:
    """A deliberately false property (global skew <= 1, R-SKEW-4) is found at the
    minimal depth: one acquire leaves a spread of 1; a kept sticky hit (load 1 <= min 0 +
    margin 1) makes it 2."""
    def skew(edge: object) -> str | None:
        t = edge.transition  # type: ignore[attr-defined]
        loads = [n for _, n in t.state.pool.items()]
        return "spread" if loads and max(loads) - min(loads) > 1 else None

    check = Check("global_skew", 3, lambda c: True, skew)
    result = explore(Config(affinity_break_margin=1, max_cache_size=2), U2.servers,
                     U2.initial_pool, FreeEnv(U2), [check], load_cap=3, stop_on_first=True)
    (violation,) = result.violations
    assert len(violation.trace) == 2
    assert violation.labels == ("acquire", "acquire")
    # Replaying the trace on the real core reproduces the violation.
    config = violation.config
    state = initial_state(config, U2.initial_pool)
    for event in violation.trace:
        state = step(config, state, event).state
    loads = [n for _, n in state.pool.items()]
    assert max(loads) - min(loads) > 1


def test_counters_are_clamped_and_leases_renumbered() -> None:
    config = Config(affinity_break_margin=None, max_cache_size=2)
    state = initial_state(config, ["s0"])
    for _ in range(4):
        state = step(config, state, Acquire(request_id="a")).state
    assert state.affinity_kept == 3
    assert normalize(state).affinity_kept == 1  # enough to see a reset (R-CNT-2)
    assert state_key(normalize(state)) == state_key(normalize(evolve(state,
                                                                           affinity_kept=9)))


def test_symmetry_reduction_is_sound_for_draw_ties_and_caught_for_stable_hash() -> None:
    run = BfsRun("draw", Config(affinity_break_margin=1, tie_break="draw", max_cache_size=2),
                 U2, 2)
    ok, reduced, orbits, _ = symmetry_sound(run)
    assert ok and reduced == orbits and reduced > 0
    stable = attrs.evolve(run, config=Config(affinity_break_margin=0, full_determinism=True,
                                             hash_mode="stable", max_cache_size=2))
    ok, reduced, orbits, _ = symmetry_sound(stable)
    assert not ok and reduced != orbits  # stable hashing reads server names


def test_hazard_runs_find_the_documented_exceptions() -> None:
    """R-HAZ-1: an add on an active server and a late release after a busy removal break
    'count == requests in flight'; well-formed traces do not."""
    by_label = {r.label: r for r in scope_named("small").bfs_runs}
    add = run_spec(by_label["hazard: add on active server"])
    late = run_spec(by_label["hazard: busy remove, late release"])
    assert isinstance(add.violations[0].trace[-1], AddServers)
    assert late.violations[0].labels[-1] == "late release"
    assert run_spec(by_label["margin 1, well-formed traces"]).violations == ()
