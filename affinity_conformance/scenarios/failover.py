"""Suite ``failover``: remove, add and re-add servers (SPEC sections 11 and 17).

Includes the inherited hazards a conforming implementation must reproduce in legacy
mode: stale stickiness after a re-add, late-release drift and the add-on-active reset.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from affinity_conformance.scenario import Scenario

SUITE = "failover"


def _s(case: str, description: str, reqs: str, **options: Any) -> Scenario:
    return Scenario(SUITE, case, description, requirements=reqs.split(), **options)


def cases() -> Iterator[Scenario]:
    yield (_s("remove_pinned_server_reselects",
              "A session pinned to a removed server is re-placed (path reselected).",
              "R-ACQ-3 R-POOL-3 R-POOL-4 R-CNT-3")
           .acquire("a", expect="s0").remove("s0")
           .acquire("a", expect="s1", path="reselected").check())
    yield (_s("remove_ignores_unknown_and_repeats",
              "remove_servers ignores unknown ids and repeated ids.",
              "R-POOL-3 R-EV-1")
           .acquire("a").remove("s9").remove("s1", "s1").check("servers")
           .acquire("b", expect="s2"))
    yield (_s("readd_appends_to_the_end",
              "A removed and re-added server moves to the end of the pool order.",
              "R-POOL-1 R-TIE-2")
           .remove("s0").add("s0").check("servers")
           .acquire("a", expect="s1").acquire("b", expect="s2").acquire("c", expect="s0"))
    yield (_s("add_active_server_resets_count",
              "Adding an already active server keeps its position and zeroes its count.",
              "R-POOL-1 R-POOL-2 R-HAZ-1 R-CONS-2")
           .acquire("a", expect="s0").acquire("a", path="kept").acquire("b", expect="s1")
           .add("s0").check("servers").acquire("c", expect="s0"))
    yield (_s("stale_stickiness_after_readd",
              "An entry for a removed server becomes a valid hit again after a re-add.",
              "R-HAZ-1 R-POOL-3 R-ACQ-2")
           .acquire("a", expect="s0").acquire("b", expect="s1").remove("s0").add("s0")
           .acquire("a", expect="s0", path="kept").check())
    yield (_s("late_release_drift",
              "After remove and re-add, a late release of an old request decrements the "
              "fresh count of a new one (clamped at 0).",
              "R-HAZ-1 R-CONS-2 R-RLS-1", servers=("s0", "s1"))
           .acquire("a", expect="s0").remove("s0").add("s0")
           .acquire("b", expect="s1").acquire("c", expect="s0")
           .release("s0", result="applied").release("s0", result="at_zero")
           .assert_loads(s0=0, s1=1).acquire("d", expect="s0"))
    yield (_s("all_removed_rejects_and_deletes_stale_entry",
              "With the pool empty, an acquire pinned to a removed server deletes the "
              "entry and is then rejected; after an add it is a plain new placement.",
              "R-ACQ-3 R-ACQ-5 R-ACQ-6 R-OUT-2")
           .acquire("a", expect="s0").acquire("b", expect="s1").remove("s0", "s1", "s2")
           .reject("a", reason="no_servers").check("lru").add("s1")
           .acquire("a", expect="s1", path="new").check())
    yield (_s("all_removed_unpinned_reject_changes_nothing",
              "A new id on an empty pool is rejected and the state is unchanged.",
              "R-ACQ-5 R-OUT-2")
           .acquire("a").remove("s0", "s1", "s2").reject("z", reason="no_servers").check())
    yield (_s("removal_discards_counts",
              "remove_servers discards the server's count; a re-add starts at 0.",
              "R-POOL-3 R-CONS-2 R-POOL-2")
           .acquires("a", "b", "c", "d").remove("s0")
           .check("servers", status_keys=("total_inflight",)).add("s0")
           .check("servers", status_keys=("total_inflight",)).acquire("e", expect="s0"))
    yield (_s("add_several_keeps_event_order",
              "add_servers appends new ids in event order and leaves active ones in place.",
              "R-POOL-1 R-POOL-2")
           .add("s4", "s3").add("s3", "s0").assert_pool("s0", "s1", "s2", "s4", "s3")
           .check("servers").acquire("a", expect="s0").acquire("b", expect="s1")
           .acquire("c", expect="s2").acquire("d", expect="s4").acquire("e", expect="s3")
           .check("servers"))
    yield (_s("release_on_removed_server_is_ignored",
              "A release for a removed server is an unknown_server no-op.",
              "R-RLS-1 R-POOL-3")
           .acquire("a", expect="s0").remove("s0").release("s0", result="unknown_server")
           .check())
    yield (_s("remove_and_readd_everything",
              "Removing every server and re-adding them in a new order reorders the pool "
              "and makes old pins valid again.",
              "R-POOL-1 R-HAZ-1 R-ACQ-2")
           .acquires("a", "b", "c").remove("s0", "s1", "s2").add("s2", "s1", "s0")
           .acquire("b", expect="s1", path="kept").acquire("d", expect="s2", path="new"))
