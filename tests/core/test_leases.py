"""Lease accounting (opt-in, R-LEASE-1..6) against the legacy release hazards.

Each lease scenario is run next to its legacy counterpart, so the test shows both the
hazard and the fix. The driver checks R-LEASE-5 (counts equal open current-epoch leases)
after every step.
"""

from __future__ import annotations

from affinity_engine import Release, step

from .driver import Run


def test_lease_mode_off_ignores_request_id() -> None:
    """R-LEASE-1, R-RLS-1: without lease accounting a release's request_id changes nothing."""
    run = Run().acquire("a", expect="s0").acquire(None, expect="s1")
    with_id = step(run.config, run.state, Release(server_id="s0", request_id="not-a"))
    without = step(run.config, run.state, Release(server_id="s0"))
    assert with_id == without
    assert with_id.state.pool.items() == (("s0", 0), ("s1", 1), ("s2", 0))


def test_every_acquire_grants_a_lease() -> None:
    """R-LEASE-2, R-LEASE-5: keyed and unkeyed acquires each open one lease on the choice."""
    run = Run.of(lease_accounting=True).acquire("a", expect="s0").acquire(None, expect="s1")
    run.acquire("a", expect="s0", path="kept")
    assert [run.state.leases.open_count(s) for s in run.servers] == [2, 1, 0]
    run.release("s1", result="applied")  # an unkeyed lease is settled without an id
    run.release("s0", request_id="a", result="applied")
    assert run.loads == {"s0": 1, "s1": 0, "s2": 0}


def test_double_release_undercounts_in_legacy_mode() -> None:
    """R-RLS-1, R-HAZ-1: legacy: a duplicated release takes another request's count."""
    run = Run(servers=("s0",)).acquire("a").acquire("b")
    run.release("s0", request_id="a", result="applied")
    run.release("s0", request_id="a", result="applied")
    assert run.loads == {"s0": 0}  # b is still running


def test_double_release_does_not_undercount_with_leases() -> None:
    """R-LEASE-3, R-LEASE-6: the duplicate finds no lease: ignored, counted as unknown."""
    run = Run.of(("s0",), lease_accounting=True).acquire("a").acquire("b")
    run.release("s0", request_id="a", result="applied")
    before = run.loads
    run.release("s0", request_id="a", result="unknown_lease")
    assert run.loads == before == {"s0": 1}
    assert (run.status()["unknown_leases"], run.status()["stale_leases"]) == (1, 0)
    run.release("s0", request_id="b", result="applied")
    assert run.loads == {"s0": 0}


def test_late_release_after_remove_and_re_add_is_stale() -> None:
    """R-LEASE-3, R-LEASE-4, R-LEASE-6: a release for the old epoch leaves the fresh
    count alone and is counted as stale; the fresh request's release applies."""
    run = Run.of(("s0", "s1"), lease_accounting=True).acquire("old", expect="s0")
    run.remove("s0").add("s0").acquire("busy", expect="s1").acquire("fresh", expect="s0")
    run.release("s0", request_id="old", result="stale_lease")
    assert run.loads == {"s1": 1, "s0": 1}
    assert run.status()["stale_leases"] == 1
    run.release("s0", request_id="fresh", result="applied")
    assert run.loads == {"s1": 1, "s0": 0}
    run.release("s0", request_id="old", result="unknown_lease")  # consumed already


def test_release_after_remove_is_stale() -> None:
    """R-LEASE-4: remove closes the epoch; a late release is consumed as stale."""
    run = Run.of(lease_accounting=True).acquire("a", expect="s0").remove("s0")
    run.release("s0", request_id="a", result="stale_lease")
    assert run.status()["stale_leases"] == 1


def test_add_of_an_active_server_keeps_count_and_epoch() -> None:
    """R-LEASE-4, R-POOL-2: in lease mode add-on-active neither resets the count nor
    opens a new epoch, so the running request's release still applies."""
    run = Run.of(lease_accounting=True).acquire("a", expect="s0").acquire("a", expect="s0")
    run.add("s0", "s3")
    assert run.state.pool.items() == (("s0", 2), ("s1", 0), ("s2", 0), ("s3", 0))
    run.release("s0", request_id="a", result="applied")
    run.release("s0", request_id="a", result="applied")
    assert run.loads["s0"] == 0


def test_unknown_lease_is_counted_in_status() -> None:
    """R-LEASE-3, R-LEASE-6: releases that match no lease (wrong id, wrong server, a keyed
    request released without its id) move nothing and are each counted."""
    run = Run.of(lease_accounting=True).acquire("a", expect="s0")
    run.release("s1", request_id="a", result="unknown_lease")
    run.release("s0", request_id="zzz", result="unknown_lease")
    run.release("s0", result="unknown_lease")
    run.release("ghost", result="unknown_lease")
    assert run.loads == {"s0": 1, "s1": 0, "s2": 0}
    assert run.status()["unknown_leases"] == 4
    assert "unknown_leases" not in Run().status()  # only reported in lease mode
