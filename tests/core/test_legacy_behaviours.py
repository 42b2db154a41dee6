"""The legacy balancer's 15 behaviours (upstream-verl.md section 10) as core scenarios.

verl's own tests run on Ray; here each one is a literal event sequence on the pure core.
The behaviours that depend on tie order (marked (T) upstream) are checked exactly under
``tie_break="first"`` (Aug-2026 main, PR #7435) and again tie-agnostically under
``tie_break="draw"`` (0.9.1's random choice) with several draws, asserting membership in
:func:`affinity_engine.allowed` instead of a fixed server.
"""

from __future__ import annotations

import pytest

from affinity_engine import NO_SERVERS_MESSAGE, VERL_STATUS_KEYS, Rejected, RejectReason

from .driver import Run

DRAWS = (0, 1, 2, 5)


# (L1) three new ids cover three servers ----------------------------------------------
def test_three_new_ids_cover_three_servers_first() -> None:
    """R-ACQ-4, R-TIE-2: three new ids on an idle pool go to s0, s1, s2 in pool order."""
    run = Run()
    run.acquire("r0", expect="s0", path="new").acquire("r1", expect="s1", path="new")
    run.acquire("r2", expect="s2", path="new")
    assert run.loads == {"s0": 1, "s1": 1, "s2": 1}
    assert run.lru == (("r0", "s0"), ("r1", "s1"), ("r2", "s2"))


@pytest.mark.parametrize("draw", DRAWS)
def test_three_new_ids_cover_three_servers_any_ties(draw: int) -> None:
    """R-PLACE-1, R-TIE-3: whatever the draws, three new ids use all three servers."""
    run = Run.of(tie_break="draw")
    for i in range(3):
        run.acquire(f"r{i}", tie_draw=draw + i, path="new")
    assert run.loads == {"s0": 1, "s1": 1, "s2": 1}


# (L2, T) after "a" x3 and "b", a new "d" goes to s2 -----------------------------------
def test_new_id_goes_to_the_idle_server_first() -> None:
    """R-ACQ-2, R-PLACE-1: a x3 stays on s0 (2 kept hits), b -> s1, then d -> s2."""
    run = Run()
    run.acquire("a", expect="s0", path="new")
    run.acquire("a", expect="s0", path="kept").acquire("a", expect="s0", path="kept")
    run.acquire("b", expect="s1", path="new").acquire("d", expect="s2", path="new")
    assert run.loads == {"s0": 3, "s1": 1, "s2": 1}
    assert run.counters == (2, 0)


@pytest.mark.parametrize("draw", DRAWS)
def test_new_id_goes_to_the_idle_server_any_ties(draw: int) -> None:
    """R-REL-1: d's only allowed server is the one neither a nor b took."""
    run = Run.of(tie_break="draw")
    for _ in range(3):
        run.acquire("a", tie_draw=draw)
    a_server = run.lru[-1][1]
    run.acquire("b", tie_draw=draw + 1)
    b_server = run.lru[-1][1]
    idle = {"s0", "s1", "s2"} - {a_server, b_server}
    assert len(idle) == 1
    assert run.allowed("d") == idle
    run.acquire("d", tie_draw=draw, expect=idle.pop())


# (L3) r0 != r1, release both, r2 != r3 ------------------------------------------------
def test_two_at_once_then_released_then_two_again() -> None:
    """R-PLACE-1, R-RLS-1: concurrent requests spread; after releases they spread again."""
    run = Run(servers=("s0", "s1"))
    run.acquire("r0", expect="s0").acquire("r1", expect="s1")
    run.release("s0", result="applied").release("s1", result="applied")
    assert run.loads == {"s0": 0, "s1": 0}
    run.acquire("r2", expect="s0").acquire("r3", expect="s1")
    assert run.loads == {"s0": 1, "s1": 1}


@pytest.mark.parametrize("draw", DRAWS)
def test_two_at_once_differ_any_ties(draw: int) -> None:
    """R-PLACE-1: the second of two concurrent new ids never joins the first."""
    run = Run.of(("s0", "s1"), tie_break="draw")
    run.acquire("r0", tie_draw=draw)
    first = run.lru[-1][1]
    run.acquire("r1", tie_draw=draw, expect_in={"s0", "s1"} - {first})
    run.release("s0", result="applied").release("s1", result="applied")
    run.acquire("r2", tie_draw=draw + 1)
    again = run.lru[-1][1]
    run.acquire("r3", tie_draw=draw, expect_in={"s0", "s1"} - {again})


# (L4) releasing an unknown or idle server does not raise -------------------------------
def test_release_of_unknown_or_idle_server_changes_nothing() -> None:
    """R-RLS-1, R-CONS-1: unknown server ignored, count 0 clamped; the state is unchanged."""
    run = Run().acquire("a", expect="s0")
    before = run.state
    run.release("nope", result="unknown_server")
    assert run.state == before
    run.release("s1", result="at_zero")
    assert run.state == before
    assert run.loads == {"s0": 1, "s1": 0, "s2": 0}


# (L5) acquire / release / acquire keeps the server -----------------------------------
@pytest.mark.parametrize("tie_break", ["first", "draw"])
def test_acquire_release_acquire_keeps_server(tie_break: str) -> None:
    """R-ACQ-2, R-RLS-1: the release leaves the sticky entry; the next turn is a kept hit."""
    run = Run.of(tie_break=tie_break).acquire("conv", path="new", tie_draw=1)
    pinned = run.lru[-1][1]
    run.release(pinned, result="applied")
    assert run.lru == (("conv", pinned),)
    run.acquire("conv", expect=pinned, path="kept", tie_draw=2)
    assert run.counters == (1, 0)


# (L6) an added server shows count 0 --------------------------------------------------
def test_added_server_shows_count_zero() -> None:
    """R-POOL-1, R-POOL-2, R-STAT-1: a new server is appended to the pool, idle."""
    run = Run().acquire("a").add("s3")
    assert run.state.pool.items() == (("s0", 1), ("s1", 0), ("s2", 0), ("s3", 0))
    assert run.status()["servers"]["s3"] == 0
    assert run.status()["registered_handles"] == ["s0", "s1", "s2", "s3"]


# (L7, L8) a removed server leaves servers / registered_handles; next goes elsewhere --
def test_removed_server_leaves_status() -> None:
    """R-POOL-3, R-STAT-1: after remove, status lists only the remaining server."""
    run = Run(servers=("s0", "s1")).remove("s0")
    st = run.status()
    assert st["servers"] == {"s1": 0}
    assert st["registered_handles"] == ["s1"]
    assert st["active_servers"] == 1


@pytest.mark.parametrize("tie_break", ["first", "draw"])
@pytest.mark.parametrize("gone", ["s0", "s1"])
def test_removed_server_is_never_chosen(tie_break: str, gone: str) -> None:
    """R-POOL-4: every acquire after the removal goes to the other server."""
    run = Run.of(("s0", "s1"), tie_break=tie_break).remove(gone)
    other = "s1" if gone == "s0" else "s0"
    for i in range(4):
        run.acquire(f"r{i}", expect=other, tie_draw=i)
    assert run.loads == {other: 4}


# (L9, T) occupy-s0 -> s0, sticky-req -> s1, remove s1, sticky-req -> s0 --------------
def test_sticky_request_reselected_after_its_server_is_removed() -> None:
    """R-ACQ-3, R-POOL-3, R-OUT-3: the removed pin is deleted and the request is placed
    anew; the outcome names the old pin."""
    run = Run(servers=("s0", "s1"))
    run.acquire("occupy-s0", expect="s0").acquire("sticky-req", expect="s1")
    run.remove("s1")
    assert run.lru == (("occupy-s0", "s0"), ("sticky-req", "s1"))  # not purged on remove
    run.acquire("sticky-req", expect="s0", path="reselected", previous="s1", evicted=None)
    assert run.lru == (("occupy-s0", "s0"), ("sticky-req", "s0"))
    assert run.counters == (0, 0)  # R-CNT-3: re-selections are not counted


@pytest.mark.parametrize("draw", DRAWS)
def test_sticky_request_reselected_any_ties(draw: int) -> None:
    """R-ACQ-3: tie-agnostic form: the re-selection lands on the occupier's server."""
    run = Run.of(("s0", "s1"), tie_break="draw").acquire("occupy", tie_draw=draw)
    occupied = run.lru[-1][1]
    sticky = "s1" if occupied == "s0" else "s0"
    run.acquire("sticky-req", expect=sticky, tie_draw=draw).remove(sticky)
    run.acquire("sticky-req", expect=occupied, path="reselected", tie_draw=draw)


# (L10) get_all_servers excludes removed ----------------------------------------------
def test_all_servers_excludes_removed_in_pool_order() -> None:
    """R-POOL-1, R-POOL-3: the active servers keep their order; unknown ids are ignored."""
    run = Run().remove("s1", "ghost")
    assert run.servers == ("s0", "s2")
    assert run.state.pool.servers == ("s0", "s2")


# (L11) all removed -> "No available servers in load balancer" ------------------------
def test_all_removed_rejects_with_no_servers() -> None:
    """R-ACQ-5, R-OUT-2: empty pool: rejected with verl's exact message, state unchanged."""
    run = Run(servers=("s0", "s1")).remove("s0", "s1")
    before = run.state
    run.reject("r", reason="no_servers")
    assert run.last == Rejected(RejectReason.NO_SERVERS, "No available servers in load balancer")
    assert NO_SERVERS_MESSAGE == "No available servers in load balancer"
    assert run.state == before


# (L12) re-add works -------------------------------------------------------------------
def test_re_add_after_removing_all() -> None:
    """R-POOL-1: re-added servers are usable again, in their new insertion order."""
    run = Run(servers=("s0", "s1")).remove("s0", "s1").reject("r", reason="no_servers")
    run.add("s1", "s0")
    assert run.servers == ("s1", "s0")
    run.acquire("r", expect="s1", path="new")


# (L13, T) count 0, r1 -> s0, count 1 ---------------------------------------------------
def test_count_goes_from_zero_to_one() -> None:
    """R-ACQ-7: exactly the chosen server's count goes up by one."""
    run = Run(servers=("s0", "s1"))
    assert run.state.pool.load("s0") == 0
    run.acquire("r1", expect="s0")
    assert run.state.pool.load("s0") == 1
    assert run.state.pool.load("s1") == 0


@pytest.mark.parametrize("draw", DRAWS)
def test_count_goes_from_zero_to_one_any_ties(draw: int) -> None:
    """R-ACQ-7: tie-agnostic form: the chosen server goes 0 -> 1, the other stays 0."""
    run = Run.of(("s0", "s1"), tie_break="draw").acquire("r1", tie_draw=draw)
    chosen = run.lru[-1][1]
    assert run.loads == {"s0": 0, "s1": 0, chosen: 1}


# (L14) status --------------------------------------------------------------------------
def test_status_of_an_idle_two_server_pool() -> None:
    """R-STAT-1: verl's keys plus the affinity fields, on an idle pool."""
    st = Run(servers=("s0", "s1")).status()
    assert set(VERL_STATUS_KEYS) <= set(st)
    assert st["active_servers"] == 2
    assert st["total_inflight"] == 0
    assert st["servers"] == {"s0": 0, "s1": 0}
    assert (st["affinity_break_margin"], st["affinity_kept"], st["affinity_broken"]) == (
        None, 0, 0)
    assert st["policy"] == "legacy"
