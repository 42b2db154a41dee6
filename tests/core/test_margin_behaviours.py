"""PR #7435's 20 behaviours (upstream-verl.md section 9.5) as core scenarios.

The PR's tests set in-flight counters directly; here every load is reached through
events (:meth:`Run.set_loads`: unkeyed fills and releases). Numbers in the test names
follow the PR's list: (1)-(7) default behaviour, (8)-(20) with a margin.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest

import affinity_engine
from affinity_engine import Config, ConfigError, initial_state, step

from .driver import Run


def pinned_to_s0(**options: Any) -> Run:
    """A run whose request "conv" is pinned to s0 (first placement on an idle pool)."""
    return Run.of(**options).acquire("conv", expect="s0", path="new")


# ------------------------------------------------------------------ default behaviour
def test_01_six_new_ids_spread_two_per_server() -> None:
    """R-PLACE-1, R-TIE-1: six concurrent new ids fill s0, s1, s2 twice each."""
    run = Run.of(affinity_break_margin=2)
    for i in range(6):
        run.acquire(f"r{i}", expect=f"s{i % 3}", path="new")
    assert run.loads == {"s0": 2, "s1": 2, "s2": 2}


def test_02_first_pick_on_idle_pool_is_s0() -> None:
    """R-TIE-2: tie_break first picks the first server in pool order (conflicts #7613)."""
    Run.of(affinity_break_margin=2).acquire("x", expect="s0", path="new")


def test_02_first_pick_tie_agnostic() -> None:
    """R-REL-1, R-TIE-3: under draw every idle server is allowed and each is reachable."""
    run = Run.of(affinity_break_margin=2, tie_break="draw")
    assert run.allowed("x") == {"s0", "s1", "s2"}
    picks = {step(run.config, run.state, affinity_engine.Acquire(request_id="x", tie_draw=d))
             .state.lru.peek("x") for d in range(3)}
    assert picks == {"s0", "s1", "s2"}


def test_03_repeats_keep_their_server() -> None:
    """R-ACQ-2, R-LRU-2: with a margin, balanced repeats are kept hits on the same server."""
    run = Run.of(affinity_break_margin=2)
    for rid in ("a", "b", "c"):
        run.acquire(rid, path="new")
    for _ in range(2):
        run.acquire("a", expect="s0", path="kept").acquire("b", expect="s1", path="kept")
        run.acquire("c", expect="s2", path="kept")
    assert run.counters == (6, 0)


def test_04_margin_none_keeps_a_pin_at_plus_1000() -> None:
    """R-POL-1, R-CNT-1: legacy policy never breaks a pin; the hit still counts as kept."""
    run = pinned_to_s0().set_loads(s0=1000)
    run.acquire("conv", expect="s0", path="kept")
    assert run.counters == (1, 0)
    assert run.status()["affinity_broken"] == 0


def test_05_removing_the_pinned_server_reselects_elsewhere() -> None:
    """R-ACQ-3, R-CNT-3: a removed pin is re-placed least-loaded and not counted."""
    run = pinned_to_s0(affinity_break_margin=2).remove("s0")
    run.acquire("conv", expect="s1", path="reselected", previous="s0")
    assert run.counters == (0, 0)
    assert run.lru == (("conv", "s1"),)


def test_06_empty_servers_rejects_acquire() -> None:
    """R-ACQ-5, R-CFG-2: a balancer built with no servers rejects every acquire."""
    run = Run(Config(affinity_break_margin=2), servers=())
    run.reject("x", reason="no_servers").reject(None, reason="no_servers")
    assert run.lru == ()


def test_07_no_coroutine_api() -> None:
    """R-PURE-1: the core is synchronous: no public callable is a coroutine function."""
    public = [getattr(affinity_engine, name) for name in affinity_engine.__all__]
    assert not [f for f in public if inspect.iscoroutinefunction(f)]
    t = step(Config(), initial_state(Config(), ["s0"]), affinity_engine.Acquire(request_id="a"))
    assert not inspect.isawaitable(t)


# --------------------------------------------------------------------------- bounded
def test_08_margin_2_pin_plus_10_moves() -> None:
    """R-KEEP-1, R-BREAK-1: load 10 > 0 + 2: the pin moves to the first least-loaded."""
    run = pinned_to_s0(affinity_break_margin=2).set_loads(s0=10)
    run.acquire("conv", expect="s1", path="broken", previous="s0", evicted=None)
    assert run.counters == (0, 1)
    assert run.lru == (("conv", "s1"),)
    assert run.loads == {"s0": 10, "s1": 1, "s2": 0}  # R-BREAK-2: old count untouched


def test_09_margin_5_pin_plus_4_stays() -> None:
    """R-KEEP-1: load 4 <= 0 + 5: kept."""
    run = pinned_to_s0(affinity_break_margin=5).set_loads(s0=4)
    run.acquire("conv", expect="s0", path="kept")
    assert run.counters == (1, 0)


@pytest.mark.parametrize(("excess", "path", "server"), [(3, "kept", "s0"), (4, "broken", "s1")])
def test_10_margin_3_boundary_is_inclusive(excess: int, path: str, server: str) -> None:
    """R-KEEP-1, R-KEEP-2: min + 3 stays, min + 4 moves (loads read before the increment)."""
    run = pinned_to_s0(affinity_break_margin=3).set_loads(s0=7 + excess, s1=7, s2=9)
    run.acquire("conv", expect=server, path=path)


def test_11_margin_0_moves_then_follows_the_new_pin() -> None:
    """R-SKEW-5, R-BREAK-2: 50/0/50 moves to s1; with s1 back at 0 the next turn stays."""
    run = pinned_to_s0(affinity_break_margin=0).set_loads(s0=50, s2=50)
    run.acquire("conv", expect="s1", path="broken", previous="s0")
    run.release("s1", result="applied")
    assert run.loads == {"s0": 50, "s1": 0, "s2": 50}
    run.acquire("conv", expect="s1", path="kept")
    assert run.counters == (1, 1)


def test_12_margin_0_follows_the_rotating_idle_server() -> None:
    """R-SKEW-5, R-BREAK-1: margin 0 chases the unique zero-load server as it moves."""
    run = pinned_to_s0(affinity_break_margin=0)
    for idle, busy in (("s1", ("s0", "s2")), ("s2", ("s0", "s1")), ("s0", ("s1", "s2"))):
        loads = {sid: 5 for sid in busy}
        loads[idle] = 0
        run.set_loads(**loads)
        run.acquire("conv", expect=idle, path="broken")
    assert run.counters == (0, 3)


def test_13_counters_after_first_placement_and_second_call() -> None:
    """R-CNT-1, R-CNT-3: (0, 0) after the first placement, (1, 0) after the second call."""
    run = Run.of(affinity_break_margin=1).acquire("conv", path="new")
    assert run.counters == (0, 0)
    run.acquire("conv", path="kept")
    assert run.counters == (1, 0)
    assert (run.status()["affinity_kept"], run.status()["affinity_broken"]) == (1, 0)


def test_14_full_determinism_ignores_margin_0() -> None:
    """R-DET-4: under full_determinism a pin at +100 is kept, and kept still counts."""
    run = Run.of(affinity_break_margin=0, full_determinism=True)
    run.acquire("conv", expect="s0", request_hash=0, path="new").set_loads(s0=101)
    run.acquire("conv", expect="s0", request_hash=0, path="kept")
    assert run.counters == (1, 0)


def test_15_releases_on_the_old_server_do_not_pull_the_pin_back() -> None:
    """R-BREAK-2: after a move, 10 releases on the old server leave the new pin in place."""
    run = pinned_to_s0(affinity_break_margin=2).set_loads(s0=20)
    run.acquire("conv", expect="s1", path="broken")
    for _ in range(10):
        run.release("s0", result="applied")
    assert run.loads == {"s0": 10, "s1": 1, "s2": 0}
    run.acquire("conv", expect="s1", path="kept")
    assert run.lru == (("conv", "s1"),)


@pytest.mark.parametrize("margin", [-1, -0.5, -math.inf, math.nan])
def test_16_19_invalid_margins_raise(margin: float) -> None:
    """R-CFG-1, R-CFG-3: negative, -inf and NaN margins fail at construction."""
    with pytest.raises(ConfigError, match="affinity_break_margin"):
        Config(affinity_break_margin=margin)


def test_20_six_hits_are_all_counted() -> None:
    """R-CNT-1: with margin 1, kept + broken equals the number of sticky hits."""
    run = Run.of(affinity_break_margin=1).acquire("conv", path="new")
    for turn in range(6):
        run.acquire("conv")
        if turn % 2 == 0:  # load the pin so some of the turns break
            run.acquire(None).acquire(None)
    kept, broken = run.counters
    assert kept + broken == 6
    assert (kept, broken) == (4, 2)  # turns 3 and 5 found the pin above min + 1


# ------------------------------------------------- beyond the PR's list: the band itself
@pytest.mark.parametrize("margin", range(7))
def test_keep_is_monotone_in_the_margin(margin: int) -> None:
    """R-KEEP-4: one state, pin at min + 3: broken for every m < 3, kept for every m >= 3."""
    run = pinned_to_s0(affinity_break_margin=margin).set_loads(s0=5, s1=2, s2=4)
    run.acquire("conv", path="kept" if margin >= 3 else "broken")


def test_no_starvation_while_an_idle_server_exists() -> None:
    """R-KEEP-3, R-SKEW-1: with margin 2 a pin at load 3 is left for the idle server,
    and one at load 2 (inside the band) is kept."""
    run = pinned_to_s0(affinity_break_margin=2).set_loads(s0=3, s1=1, s2=0)
    run.acquire("conv", expect="s2", path="broken")
    run.set_loads(s2=2, s1=0).acquire("conv", expect="s2", path="kept")
