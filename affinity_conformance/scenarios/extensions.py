"""Suites for Affinity's extensions and tie modes: ``ties``, ``unkeyed``, ``leases``,
``observations`` (SPEC sections 8, 10, 11.1 and 12).

None of these is expressible through verl 0.9.1's API except the ``draw`` tie cases, which
an implementation with random ties passes by refinement (``--tie-break any``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from affinity_conformance.scenario import Scenario

COUNTERS = ("affinity_kept", "affinity_broken")
LEASE_STATUS = ("unknown_leases", "stale_leases")


def _s(suite: str, case: str, description: str, reqs: str, **options: Any) -> Scenario:
    return Scenario(suite, case, description, requirements=reqs.split(), **options)


def cases() -> Iterator[Scenario]:
    yield from _ties()
    yield from _unkeyed()
    yield from _leases()
    yield from _observations()


def _ties() -> Iterator[Scenario]:
    # crc32: a=3904355907 (mod 3 = 0, mod 2 = 1), b=1908338681 (mod 2 = 1),
    # d=2564639436 (mod 3 = 0), e=4024072794 (mod 2 = 0), y=4225443349 (mod 3 = 1).
    yield (_s("ties", "hashed_spreads_new_sessions",
              "tie_break hashed: T[stable_hash(rid) mod t] among the least-loaded servers.",
              "R-TIE-1 R-TIE-4 R-HASH-1", tie_break="hashed")
           .acquire("a", expect="s0").acquire("b", expect="s2").acquire("c", expect="s1")
           .acquire("d", expect="s0").acquire("e", expect="s1"))
    yield (_s("ties", "hashed_break_uses_the_hash",
              "A margin break under hashed ties picks T[stable_hash(rid) mod t].",
              "R-TIE-4 R-BREAK-1", tie_break="hashed", affinity_break_margin=0)
           .acquire("a", expect="s0").acquire("a", expect="s2", path="broken"))
    yield (_s("ties", "hashed_unkeyed_falls_back_to_draw",
              "An unkeyed request under hashed ties uses its tie_draw.",
              "R-TIE-4 R-TIE-3 R-ACQ-8", tie_break="hashed")
           .acquire(None, draw=2, expect="s2").acquire(None, draw=1, expect="s1"))
    yield (_s("ties", "draw_break_among_ties",
              "A margin break under draw ties: index tie_draw mod t among [s1, s2].",
              "R-TIE-3 R-BREAK-1 R-REL-1 R-REL-2", tie_break="draw", affinity_break_margin=0)
           .acquire("a", draw=0, expect="s0").acquire("a", draw=1, expect="s2", path="broken"))
    yield (_s("ties", "draw_reselect_among_ties",
              "A removed-server re-selection under draw ties.",
              "R-TIE-3 R-ACQ-3 R-REL-2", tie_break="draw")
           .acquire("a", draw=0, expect="s0").remove("s0")
           .acquire("a", draw=1, expect="s2", path="reselected"))
    yield (_s("ties", "first_tie_avalanche_avoided_by_hashed",
              "Acquire/release cycles on an idle pool spread under hashed ties.",
              "R-TIE-4 R-HAZ-1", tie_break="hashed")
           .acquire("a", expect="s0").release("s0").acquire("b", expect="s2").release("s2")
           .acquire("y", expect="s1"))


def _unkeyed() -> Iterator[Scenario]:
    yield (_s("unkeyed", "least_loaded_and_never_pinned",
              "Unkeyed requests go to a least-loaded server and never touch the sticky map.",
              "R-ACQ-8 R-PLACE-1")
           .acquire(None, expect="s0", path="unkeyed").acquire(None, expect="s1")
           .acquire(None, expect="s2").acquire(None, expect="s0").check("lru", "servers"))
    yield (_s("unkeyed", "not_counted",
              "Unkeyed acquires never move the counters.",
              "R-CNT-3 R-ACQ-8", affinity_break_margin=1)
           .acquire("a", expect="s0").acquire(None, expect="s1")
           .acquire("a", expect="s0", path="kept").acquire(None, expect="s2")
           .assert_counters(1, 0).check(status_keys=COUNTERS))
    yield (_s("unkeyed", "does_not_evict_or_refresh",
              "With capacity 1 an unkeyed request neither evicts nor refreshes entries.",
              "R-ACQ-8 R-LRU-5", max_cache_size=1)
           .acquire("a", expect="s0").acquire(None, expect="s1")
           .acquire("a", expect="s0", path="kept").check("lru"))
    yield (_s("unkeyed", "empty_pool_rejects",
              "An unkeyed request on an empty pool is rejected with no_servers.",
              "R-ACQ-5 R-ACQ-8", servers=())
           .reject(None, reason="no_servers").add("s0").acquire(None, expect="s0"))
    yield (_s("unkeyed", "fills_evenly_under_margin",
              "Unkeyed placements keep the pool level while sessions stay pinned.",
              "R-ACQ-8 R-PLACE-1 R-SKEW-1", affinity_break_margin=0)
           .acquire("a", expect="s0").acquire(None, expect="s1").acquire(None, expect="s2")
           .acquire("a", expect="s0", path="kept").acquire(None, expect="s1"))


def _leases() -> Iterator[Scenario]:
    yield (_s("leases", "keyed_release_applies_once",
              "A release matching a current lease applies; a second one is unknown_lease.",
              "R-LEASE-2 R-LEASE-3 R-LEASE-6", lease_accounting=True)
           .acquire("a", expect="s0").release("s0", "a", result="applied")
           .release("s0", "a", result="unknown_lease")
           .check("servers", status_keys=LEASE_STATUS))
    yield (_s("leases", "release_without_id_does_not_match_keyed",
              "A release without a request id does not settle a keyed lease.",
              "R-LEASE-3", lease_accounting=True)
           .acquire("a", expect="s0").release("s0", result="unknown_lease")
           .assert_loads(s0=1).check("servers", status_keys=LEASE_STATUS))
    yield (_s("leases", "stale_lease_after_readd",
              "A late release from before a remove/re-add is stale: the fresh count stays.",
              "R-LEASE-3 R-LEASE-4 R-LEASE-5 R-HAZ-1", lease_accounting=True)
           .acquire("a", expect="s0").remove("s0").add("s0")
           .acquires("b", "c", "d").assert_loads(s0=1, s1=1, s2=1)
           .release("s0", "a", result="stale_lease").assert_loads(s0=1)
           .release("s0", "d", result="applied").check("servers", status_keys=LEASE_STATUS))
    yield (_s("leases", "add_active_keeps_count",
              "Adding an active server keeps its count and epoch under lease accounting.",
              "R-LEASE-4 R-POOL-2 R-LEASE-5", lease_accounting=True)
           .acquire("a", expect="s0").acquire("a", path="kept").add("s0")
           .assert_loads(s0=2).release("s0", "a", result="applied")
           .release("s0", "a", result="applied").release("s0", "a", result="unknown_lease")
           .check("servers", status_keys=LEASE_STATUS))
    yield (_s("leases", "unkeyed_leases_settle_without_id",
              "Unkeyed requests hold leases under the null key.",
              "R-LEASE-2 R-LEASE-3", lease_accounting=True)
           .acquire(None, expect="s0").release("s0", result="applied")
           .release("s0", result="unknown_lease"))
    yield (_s("leases", "release_on_inactive_server_is_unknown_lease",
              "In lease mode a release for an unknown server is unknown_lease.",
              "R-LEASE-3 R-LEASE-6", lease_accounting=True)
           .release("s9", "x", result="unknown_lease")
           .check(status_keys=LEASE_STATUS))
    yield (_s("leases", "leases_off_is_legacy_release",
              "With lease accounting off, release is verl's: double releases clamp at 0.",
              "R-LEASE-1 R-RLS-1")
           .acquire("a", expect="s0").release("s0", "a", result="applied")
           .release("s0", "a", result="at_zero"))


STATUS_KEYS = ("servers", "total_inflight", "active_servers", "registered_handles",
               "affinity_break_margin", "affinity_kept", "affinity_broken", "policy",
               "tie_break", "hash_mode", "full_determinism", "sticky_entries",
               "lease_accounting", "external_loads")


def _observations() -> Iterator[Scenario]:
    yield (_s("observations", "every_outcome_kind",
              "One trace producing every outcome kind with every optional field "
              "(previous, evicted, ignored), then checking every state component and the "
              "full status view.",
              "R-OUT-3 R-OUT-1 R-ST-1 R-EV-1 R-STAT-1", affinity_break_margin=0,
              max_cache_size=2)
           .acquire("a", expect="s0", path="new").acquire("a", expect="s1", path="broken")
           .acquire("b", expect="s2").acquire("c", expect="s0", evicted="a").remove("s0")
           .acquire("c", expect="s1", path="reselected").release("s1", result="applied")
           .observe(s2=4, s9=1)
           .check("servers", "lru", "affinity_kept", "affinity_broken", "external",
                  status_keys=STATUS_KEYS)
           .clear(cleared=2).remove("s1", "s2").reject("x", reason="no_servers")
           .add("s0").check())
    yield (_s("observations", "external_load_steers_placement",
              "observe_loads sets external load; placement compares in-flight + external.",
              "R-OBS-1 R-OBS-2")
           .observe(s0=5).acquire("a", expect="s1").acquire("b", expect="s2")
           .check("servers", "external", status_keys=("external_loads", "total_inflight")))
    yield (_s("observations", "observation_below_inflight_is_zero",
              "An observed load below the in-flight count sets external load 0.",
              "R-OBS-1")
           .acquire("a").acquire("b").observe(s0=0, s1=3).assert_external(s1=2)
           .assert_loads(s0=1, s1=1).check("servers", "external"))
    yield (_s("observations", "inactive_servers_are_ignored",
              "Observations of inactive servers are listed as ignored.",
              "R-OBS-1")
           .observe(s9=3, s1=2).assert_external(s1=2).check("external"))
    yield (_s("observations", "margin_sees_external_load",
              "The margin compares effective load: external load breaks the pin.",
              "R-OBS-2 R-KEEP-1", affinity_break_margin=1)
           .acquire("a", expect="s0").observe(s0=5).acquire("a", expect="s1", path="broken"))
    yield (_s("observations", "add_resets_external_load",
              "add_servers on an active server zeroes its count and its external load.",
              "R-OBS-2 R-POOL-2")
           .observe(s0=3).add("s0").check("external").acquire("a", expect="s0"))
    yield (_s("observations", "release_clamp_ignores_external",
              "A release concerns in-flight counts only: at_zero despite external load.",
              "R-OBS-2 R-CONS-1")
           .observe(s0=3).release("s0", result="at_zero").check("servers", "external"))
    yield (_s("observations", "conservation_with_observations",
              "Observations never move total_inflight.",
              "R-OBS-3 R-CONS-2")
           .acquires("a", "b").observe(s0=4, s1=4).acquire("c", expect="s2")
           .check("servers", status_keys=("total_inflight",)))
    yield (_s("observations", "remove_drops_external_load",
              "remove_servers drops the external load with the server.",
              "R-OBS-2 R-POOL-3")
           .observe(s0=2).remove("s0").add("s0").assert_external()
           .assert_pool("s1", "s2", "s0").check("servers", "external"))
