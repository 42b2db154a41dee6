"""Suite ``margin``: PR #7435's ``affinity_break_margin`` (SPEC section 7.2).

The cases follow the PR's own behaviours (upstream-verl.md section 9.5, numbers in the
descriptions), with loads reached through events instead of by setting counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from affinity_conformance.scenario import Scenario

SUITE = "margin"


def _s(case: str, description: str, reqs: str, margin: int, **options: Any) -> Scenario:
    return Scenario(SUITE, case, description, requirements=reqs.split(),
                    affinity_break_margin=margin, **options)


def _spread(run: Scenario) -> int:
    return run.state.pool.max_load - run.state.pool.min_load


def cases() -> Iterator[Scenario]:
    yield (_s("six_new_ids_spread_two_per_server",
              "(1) Six new ids spread two per server; the margin plays no part in placement.",
              "R-PLACE-1 R-TIE-1 R-TIE-2 R-CNT-3", 2)
           .acquire("r0", expect="s0").acquire("r1", expect="s1").acquire("r2", expect="s2")
           .acquire("r3", expect="s0").acquire("r4", expect="s1").acquire("r5", expect="s2"))
    yield (_s("self_count_breaks_past_margin",
              "(3) Repeats stay while the pin is within min + 2 (inclusive); the session's "
              "own unreleased turns push it past the band and it moves.",
              "R-KEEP-1 R-KEEP-2 R-BREAK-1 R-HAZ-1", 2)
           .acquire("a", expect="s0").acquire("a", expect="s0", path="kept")
           .acquire("a", expect="s0", path="kept").acquire("a", expect="s1", path="broken")
           .assert_loads(s0=3, s1=1, s2=0).check())
    yield (_s("pin_far_above_margin_moves",
              "(8) Margin 2, pin 10 above the minimum: the hit breaks to s1.",
              "R-KEEP-1 R-BREAK-1 R-PLACE-1 R-SKEW-1", 2)
           .acquire("a", expect="s0").fill(s0=10, s1=0, s2=0)
           .acquire("a", expect="s1", path="broken").assert_pinned("a", "s1").check())
    yield (_s("pin_within_margin_stays",
              "(9) Margin 5, pin 4 above the minimum: kept.",
              "R-KEEP-1 R-KEEP-4", 5)
           .acquire("a", expect="s0").fill(s0=4, s1=0, s2=0)
           .acquire("a", expect="s0", path="kept"))
    yield (_s("boundary_is_inclusive",
              "(10) Margin 3: a pin at exactly min + 3 is kept (loads read before the "
              "increment); at min + 4 it moves. A '<' comparison breaks one step early.",
              "R-KEEP-1 R-KEEP-2 R-KEEP-4 R-BREAK-1", 3)
           .acquire("a", expect="s0").fill(s0=3, s1=0, s2=0)
           .acquire("a", expect="s0", path="kept").acquire("a", expect="s1", path="broken"))
    yield (_s("margin0_moves_then_follows_new_pin",
              "(11) Margin 0, loads 5/0/5: the hit moves to s1; with s1 back at 0 the next "
              "turn stays on s1.",
              "R-BREAK-1 R-BREAK-2 R-SKEW-5", 0)
           .acquire("a", expect="s0").fill(s0=5, s1=0, s2=5)
           .acquire("a", expect="s1", path="broken").release("s1")
           .acquire("a", expect="s1", path="kept"))
    yield (_s("margin0_follows_unique_idle_server",
              "(12) Margin 0: the session follows the unique idle server as it rotates.",
              "R-BREAK-1 R-BREAK-2 R-SKEW-5", 0)
           .acquire("a", expect="s0").fill(s0=1, s1=1, s2=0)
           .acquire("a", expect="s2", path="broken").release("s1")
           .acquire("a", expect="s1", path="broken"))
    yield (_s("old_server_releases_do_not_pull_back",
              "(15) After a move, releases on the old server do not pull the session back: "
              "it is judged against its new pin.",
              "R-BREAK-2", 1)
           .acquire("a", expect="s0").fill(s0=4, s1=0, s2=0)
           .acquire("a", expect="s1", path="broken")
           .release("s0").release("s0").release("s0").release("s0")
           .assert_loads(s0=0, s1=1, s2=0).acquire("a", expect="s1", path="kept"))
    yield (_s("break_rewrites_entry_without_eviction",
              "A break overwrites the session's own entry and makes it newest; a full map "
              "evicts nothing.",
              "R-BREAK-1 R-LRU-3", 0, max_cache_size=2)
           .acquire("a", expect="s0").acquire("b", expect="s1")
           .acquire("a", expect="s2", path="broken").check("lru"))
    yield (_s("no_starvation_with_an_idle_server",
              "With an idle server present nothing lands above load m.",
              "R-KEEP-3 R-SKEW-1", 1)
           .acquire("a", expect="s0").acquire("a", expect="s0", path="kept")
           .acquire("a", expect="s1", path="broken"))
    for margin, path, server in ((0, "broken", "s1"), (1, "kept", "s0"), (2, "kept", "s0")):
        yield (_s(f"band_margin{margin}_{path}",
                  f"Monotonicity: the same hit (pin 1 above the minimum) at margin {margin} "
                  f"is {path}.",
                  "R-KEEP-1 R-KEEP-4", margin)
               .acquire("a", expect="s0").acquire("a", expect=server, path=path))
    yield (_s("removed_pin_reselects",
              "(5) Removing the pinned server re-selects elsewhere; not counted.",
              "R-ACQ-3 R-CNT-3", 2)
           .acquire("a", expect="s0").remove("s0")
           .acquire("a", expect="s1", path="reselected").check())
    yield (_s("pin_tied_for_minimum_is_kept_at_margin0",
              "Margin 0 keeps a pin that is tied for the minimum.",
              "R-KEEP-1 R-SKEW-5", 0)
           .acquires("a", "b", "c").acquire("a", expect="s0", path="kept"))
    yield (_s("margin0_two_servers_always_on_minimum",
              "Margin 0: every acquire, hit or not, lands on a least-loaded server.",
              "R-SKEW-5 R-SKEW-1 R-BREAK-2", 0, servers=("s0", "s1"))
           .acquire("a", expect="s0").acquire("a", expect="s1", path="broken")
           .acquire("b", expect="s0").acquire("a", expect="s1", path="kept")
           .acquire("b", expect="s0", path="kept").acquire("b", expect="s1", path="broken")
           .release("s0").release("s0").release("s0")
           .acquire("a", expect="s0", path="broken"))
    arrivals = _s("arrivals_only_spread_stays_within_m_plus_1",
                  "Arrivals only (no releases) from an idle pool keep max - min <= m + 1.",
                  "R-SKEW-2 R-SKEW-1", 1)
    for rid in "abcdabcdabcdaabb":
        arrivals.acquire(rid).assert_spread(2)
    yield arrivals
    wide = _s("admissions_above_band_never_widen_spread",
              "With max - min > m + 1, no acquire increases max - min.",
              "R-SKEW-3 R-SKEW-5", 0)
    wide.acquire("a").acquire("b").fill(s0=6, s1=1, s2=0)
    for rid in ("a", "b", "x1", "a", "x2", "b", "x3", "x4"):
        before = _spread(wide)
        wide.acquire(rid).assert_spread(before)
    yield wide
    yield (_s("empty_pool_rejects_with_margin",
              "Removing every server makes a hit on a removed pin a no_servers rejection.",
              "R-ACQ-5 R-ACQ-6", 1)
           .acquire("a").remove("s0", "s1", "s2").reject("a", reason="no_servers")
           .check())
