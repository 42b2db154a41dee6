"""Lazy invalidation and the inherited pool hazards (upstream-verl.md section 6).

In legacy accounting the core reproduces verl's hazards on purpose (R-HAZ-1): stale
stickiness after a re-add, late-release drift and the add-on-active reset. These
scenarios pin each one down exactly, next to the lazy invalidation that causes the first.
"""

from __future__ import annotations

from .driver import Run


def test_remove_does_not_purge_and_lookup_invalidates_lazily() -> None:
    """R-POOL-3, R-ACQ-3: entries pointing at a removed server survive until looked up;
    a lookup deletes only its own entry."""
    run = Run().acquire("a", expect="s0").acquire("b", expect="s1").acquire("a", expect="s0")
    run.set_loads(s0=2, s1=1, s2=1)  # nothing else idle, so b's stale entry stays put
    run.remove("s0")
    assert run.lru == (("b", "s1"), ("a", "s0"))
    run.acquire("a", expect="s1", path="reselected", previous="s0")
    assert run.lru == (("b", "s1"), ("a", "s1"))


def test_stale_entry_deletion_persists_when_the_pool_is_empty() -> None:
    """R-ACQ-6, R-OUT-2: the rejected acquire still deleted the stale entry, so after a
    re-add the id is placed anew instead of hitting its old server."""
    run = Run(servers=("s0",)).acquire("conv", expect="s0").acquire("other", expect="s0")
    run.remove("s0")
    loads_before = run.loads
    run.reject("conv", reason="no_servers")
    assert run.lru == (("other", "s0"),)  # conv's entry is gone, other's stays
    assert run.loads == loads_before == {}
    run.add("s0").acquire("conv", expect="s0", path="new")
    assert run.counters == (0, 0)  # no turn was a hit on an active server


def test_stale_stickiness_after_re_add_is_a_valid_hit_again() -> None:
    """R-HAZ-1, R-POOL-1: remove then re-add before the lookup: the old entry is a kept
    hit again, on the re-added server now at the end of the pool."""
    run = Run.of(affinity_break_margin=1).acquire("a", expect="s0").acquire("conv",
                                                                             expect="s1")
    run.remove("s1").add("s1")
    assert run.servers == ("s0", "s2", "s1")
    run.acquire("conv", expect="s1", path="kept")
    assert run.counters == (1, 0)


def test_re_adding_an_active_server_keeps_its_position_and_resets_its_count() -> None:
    """R-HAZ-1, R-POOL-1, R-POOL-2, R-CONS-2: add-on-active zeroes the live count; the
    late releases of the requests still running on it are then clamped."""
    run = Run().acquire("a", expect="s0").acquire("a", expect="s0").acquire("b", expect="s1")
    run.add("s0")
    assert run.state.pool.items() == (("s0", 0), ("s1", 1), ("s2", 0))
    assert run.status()["total_inflight"] == 1
    run.release("s0", result="at_zero").release("s0", result="at_zero")
    assert run.loads == {"s0": 0, "s1": 1, "s2": 0}
    # The reset server now looks idle: new work piles onto it although two requests run.
    run.acquire("c", expect="s0", path="new")


def test_late_release_after_re_add_drifts_the_fresh_count() -> None:
    """R-HAZ-1, R-RLS-1: a release for a request started before remove/re-add decrements
    the re-added server's fresh count (undercount, clamped at 0)."""
    run = Run(servers=("s0", "s1")).acquire("old", expect="s0")
    run.remove("s0").add("s0")
    assert run.servers == ("s1", "s0")
    run.acquire("busy", expect="s1").acquire("fresh", expect="s0")
    run.release("s0", result="applied")  # really old's release: fresh is still running
    assert run.loads == {"s1": 1, "s0": 0}
    run.release("s0", result="at_zero")  # fresh's own release is then lost
    assert run.status()["total_inflight"] == 1


def test_first_tie_avalanche() -> None:
    """R-HAZ-1, R-TIE-2: with first-in-order ties and release before the next arrival,
    every new session lands on replica 0."""
    run = Run.of(tie_break="first")
    for i in range(10):
        run.acquire(f"session-{i}", expect="s0", path="new").release("s0", result="applied")
    assert {sid for _, sid in run.lru} == {"s0"}
