"""Suite ``legacy``: verl's balancer with margin null (upstream-verl.md sections 2-5, 10).

Every case here uses only verl 0.9.1's API (keyed requests, margin null), so verl 0.9.1's
own class must pass them with ``affinity check --tie-break any``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from affinity_conformance.scenario import Scenario

SUITE = "legacy"


def _s(case: str, description: str, reqs: str, **options: Any) -> Scenario:
    return Scenario(SUITE, case, description, requirements=reqs.split(), **options)


def cases() -> Iterator[Scenario]:
    yield (_s("three_new_ids_cover_three_servers",
              "Three new ids on an idle pool go to s0, s1, s2 (first tie, least loaded).",
              "R-ACQ-1 R-ACQ-4 R-ACQ-7 R-PLACE-1 R-TIE-1 R-TIE-2 R-LEG-1 R-EV-1")
           .acquire("a", expect="s0", path="new").acquire("b", expect="s1", path="new")
           .acquire("c", expect="s2", path="new").assert_loads(s0=1, s1=1, s2=1))
    yield (_s("repeat_keeps_server_and_self_counts",
              "A session's repeated turns stay on its server and count its own load "
              "(self-count hazard); margin null never looks at load.",
              "R-ACQ-2 R-LRU-2 R-SKEW-4 R-HAZ-1 R-LEG-1")
           .acquire("a", expect="s0", path="new").acquire("a", expect="s0", path="kept")
           .acquire("a", expect="s0", path="kept").assert_loads(s0=3, s1=0, s2=0))
    yield (_s("new_id_after_hits_goes_to_idle",
              "After a x3 and b, a new id d lands on the only idle server s2.",
              "R-PLACE-1 R-ACQ-4 R-LEG-1")
           .acquires("a", "a", "a").acquire("b", expect="s1")
           .acquire("d", expect="s2", path="new"))
    yield (_s("pairs_differ_after_releases",
              "r0 and r1 differ; after both are released r2 and r3 differ again.",
              "R-RLS-1 R-PLACE-1 R-TIE-2", servers=("s0", "s1"))
           .acquire("r0", expect="s0").acquire("r1", expect="s1")
           .release("s0", result="applied").release("s1", result="applied")
           .acquire("r2", expect="s0").acquire("r3", expect="s1"))
    yield (_s("release_unknown_or_idle_is_ignored",
              "Releasing an unknown server or one at count 0 changes nothing (clamp).",
              "R-RLS-1 R-CONS-1 R-OUT-1")
           .release("s9", result="unknown_server").release("s0", result="at_zero")
           .acquire("a", expect="s0").release("s0", result="applied")
           .release("s0", result="at_zero").assert_loads(s0=0, s1=0, s2=0))
    yield (_s("release_request_id_is_ignored",
              "Without lease accounting release ignores its request_id and never touches "
              "the sticky map.",
              "R-RLS-1 R-LEASE-1")
           .acquire("a", expect="s0").release("s0", "zzz", result="applied")
           .release("s0", "a", result="at_zero").acquire("a", expect="s0", path="kept"))
    yield (_s("acquire_release_acquire_keeps_server",
              "acquire, release, acquire of the same id returns the same server.",
              "R-ACQ-2 R-RLS-1 R-LEG-1")
           .acquire("a", expect="s0").release("s0").acquire("b", expect="s0")
           .acquire("a", expect="s0", path="kept"))
    yield (_s("added_server_starts_at_zero",
              "An added server shows count 0 in status and takes the next new id.",
              "R-POOL-1 R-POOL-2 R-STAT-1")
           .acquires("a", "b", "c").add("s3")
           .check("servers", status_keys=("servers", "total_inflight", "active_servers",
                                          "registered_handles"))
           .acquire("d", expect="s3", path="new"))
    yield (_s("sticky_hit_ignores_load",
              "With margin null a pin is kept at any load (no per-decision bound).",
              "R-SKEW-4 R-ACQ-2 R-LEG-1 R-KEEP-1")
           .acquire("a", expect="s0").fill(s0=6, s1=0, s2=0)
           .acquire("a", expect="s0", path="kept").assert_loads(s0=7, s1=0, s2=0))
    yield (_s("first_tie_avalanche",
              "tie_break first: acquire/release cycles on an idle pool all land on s0.",
              "R-HAZ-1 R-TIE-2")
           .acquire("a", expect="s0").release("s0").acquire("b", expect="s0").release("s0")
           .acquire("c", expect="s0").release("s0").acquire("d", expect="s0"))
    yield (_s("draw_picks_kth_tie",
              "tie_break draw (verl 0.9.1 with the draw supplied): index tie_draw mod t.",
              "R-TIE-1 R-TIE-3 R-REL-1 R-REL-2 R-LEG-1", tie_break="draw")
           .acquire("a", draw=2, expect="s2").acquire("b", draw=5, expect="s1")
           .acquire("c", draw=7, expect="s0").acquire("d", draw=4, expect="s1"))
    yield (_s("draw_ignored_on_sticky_hit",
              "A tie draw is irrelevant on a sticky hit.",
              "R-TIE-3 R-ACQ-2", tie_break="draw")
           .acquire("a", draw=1, expect="s1").acquire("a", draw=2, expect="s1", path="kept")
           .acquire("b", draw=2, expect="s0").acquire("c", draw=3, expect="s2"))
    yield (_s("draw_cycles_spread",
              "Random ties spread acquire/release cycles (PR #7613's motivation).",
              "R-TIE-3 R-HAZ-1", tie_break="draw")
           .acquire("a", draw=1, expect="s1").release("s1").acquire("b", draw=2, expect="s2")
           .release("s2").acquire("c", draw=0, expect="s0").release("s0")
           .acquire("d", draw=4, expect="s1"))
    yield (_s("status_view_verl_keys",
              "get_status: servers in pool order, total_inflight, active_servers, "
              "registered_handles.",
              "R-STAT-1")
           .acquire("a").acquire("b").release("s1").assert_loads(s0=1, s1=0, s2=0)
           .check("servers", status_keys=("servers", "total_inflight", "active_servers",
                                          "registered_handles")))
    yield (_s("clear_returns_loads_then_replaces",
              "clear_sticky_cache returns cleared_entries and server_loads, keeps loads; "
              "cleared sessions are placed anew.",
              "R-CLR-1 R-LRU-4 R-CNT-3")
           .acquire("a", expect="s0").acquire("b", expect="s1").release("s0")
           .clear(cleared=2).check()
           .acquire("a", expect="s0", path="new").acquire("b", expect="s2", path="new"))
    yield (_s("clear_twice_reports_zero",
              "A second clear reports 0 entries and the same loads.",
              "R-CLR-1 R-LRU-4")
           .acquires("a", "b").clear(cleared=2).clear(cleared=0))
    yield (_s("empty_pool_then_add",
              "An empty initial pool rejects with verl's message; after add_servers it "
              "routes.",
              "R-CFG-2 R-ACQ-5 R-OUT-2 R-POOL-1", servers=())
           .reject("a", reason="no_servers").add("s0")
           .acquire("a", expect="s0", path="new"))
    yield (_s("single_server_takes_everything",
              "One server: every new id and every hit goes to it.",
              "R-ACQ-4 R-ACQ-2", servers=("s0",))
           .acquire("a", expect="s0").acquire("b", expect="s0")
           .acquire("a", expect="s0", path="kept").assert_loads(s0=3))
    yield (_s("pool_order_decides_ties",
              "Ties follow pool order, which add/remove changes: [s0,s2,s3,s1].",
              "R-POOL-1 R-TIE-1 R-TIE-2")
           .remove("s1").add("s3", "s1")
           .acquire("d", expect="s0").acquire("e", expect="s2").acquire("f", expect="s3")
           .acquire("g", expect="s1"))
    yield (_s("least_loaded_after_uneven_releases",
              "Placement follows the counts the releases left behind.",
              "R-PLACE-1 R-RLS-1 R-TIE-1")
           .acquires("a", "b", "c", "d", "e", "f").release("s1").release("s1")
           .release("s2").acquire("g", expect="s1").acquire("h", expect="s1")
           .acquire("i", expect="s2"))
