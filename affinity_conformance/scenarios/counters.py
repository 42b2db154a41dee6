"""Suite ``counters``: ``affinity_kept`` / ``affinity_broken`` (SPEC section 7.4).

Every case checks the counters through the status view, so an implementation must report
them (feature ``counters``; verl 0.9.1 does not, PR #7435 does).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from affinity_conformance.scenario import Scenario
from affinity_engine import DualThreshold

SUITE = "counters"
COUNTERS = ("affinity_kept", "affinity_broken")


def _s(case: str, description: str, reqs: str, **options: Any) -> Scenario:
    return Scenario(SUITE, case, description, requirements=reqs.split(), **options)


def cases() -> Iterator[Scenario]:
    yield (_s("first_placement_then_hit",
              "(13) Counters are (0, 0) after a first placement and (1, 0) after a hit.",
              "R-CNT-1 R-CNT-3 R-STAT-1", affinity_break_margin=1)
           .acquire("a").assert_counters(0, 0).check(status_keys=COUNTERS)
           .acquire("a", path="kept").assert_counters(1, 0).check(status_keys=COUNTERS))
    yield (_s("six_hits_sum_to_six",
              "(20) Margin 1, six hits: kept + broken == 6 (4 kept, 2 broken).",
              "R-CNT-1 R-CNT-2 R-KEEP-1", affinity_break_margin=1)
           .acquire("a", expect="s0").acquire("a", expect="s0", path="kept")
           .acquire("a", expect="s1", path="broken").acquire("a", expect="s1", path="kept")
           .acquire("a", expect="s2", path="broken").acquire("a", expect="s2", path="kept")
           .acquire("a", expect="s2", path="kept").assert_counters(4, 2)
           .check(status_keys=COUNTERS))
    yield (_s("legacy_counts_every_hit_as_kept",
              "With margin null every sticky hit on an active server counts as kept.",
              "R-CNT-1 R-STAT-1")
           .acquires("a", "a", "b", "a", "b").assert_counters(3, 0)
           .check(status_keys=(*COUNTERS, "affinity_break_margin")))
    yield (_s("clear_and_pool_changes_do_not_reset",
              "clear_sticky_cache, add and remove never reset the counters; placements "
              "after a clear are not counted.",
              "R-CNT-2 R-CNT-3 R-CLR-1", affinity_break_margin=0)
           .acquire("a", expect="s0").acquire("a", expect="s1", path="broken")
           .acquire("b", expect="s2").acquire("b", expect="s2", path="kept")
           .clear(cleared=2).add("s3").remove("s2").assert_counters(1, 1)
           .acquire("a", path="new").assert_counters(1, 1).check(status_keys=COUNTERS))
    yield (_s("not_counted_paths",
              "Reselections, placements after eviction and rejected acquires are not "
              "counted.",
              "R-CNT-3 R-CNT-1", affinity_break_margin=1, max_cache_size=1)
           .acquire("a", expect="s0").acquire("b", expect="s1", evicted="a")
           .acquire("a", path="new").remove("s2").acquire("a", path="reselected")
           .remove("s0", "s1").reject("b", reason="no_servers").assert_counters(0, 0)
           .check(status_keys=COUNTERS))
    yield (_s("full_determinism_counts_kept",
              "Under full_determinism every hit is kept and counted kept (margin ignored).",
              "R-CNT-1 R-DET-4", affinity_break_margin=0, full_determinism=True)
           .acquire("a", request_hash=0, expect="s0").fill(s0=3)
           .acquire("a", request_hash=0, path="kept").acquire("a", request_hash=0, path="kept")
           .assert_counters(2, 0).check(status_keys=COUNTERS))
    yield (_s("gate_policy_counts_too",
              "The dual-threshold policy counts kept and broken hits like the margin.",
              "R-CNT-1 R-GATE-1", dual_threshold=DualThreshold(2))
           .acquire("a", expect="s0").acquire("a", path="kept").fill(s0=5, s1=0, s2=0)
           .acquire("a", expect="s1", path="broken").assert_counters(1, 1)
           .check(status_keys=COUNTERS))
    yield (_s("counters_move_at_most_one_per_step",
              "Each step moves kept + broken by at most one.",
              "R-CNT-2", affinity_break_margin=0, servers=("s0", "s1"))
           .acquire("a").check(status_keys=COUNTERS).acquire("a", path="broken")
           .check(status_keys=COUNTERS).acquire("a", path="kept")
           .check(status_keys=COUNTERS))
