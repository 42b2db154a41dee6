"""Suite ``prefix``: prefix-aware placement inside the band (SPEC section 8.1, R-PFX-1..7).

With ``placement_margin = m_place`` a load-aware choice (a placement, or the re-pin of a
break) is made among the *admissible* servers, ``L[s] <= min(L) + m_place`` and not the
pin being moved off; among them the one with the most cached prefix tokens (the acquire's
``cached_prefix``, absent counting 0) wins, then the lower load, then the tie-break. Every
expectation below was worked out by hand from that rule; hand choices for the ``hashed``
tie-break and ``stable`` hashing are computed here with :func:`zlib.crc32` and
:func:`sorted`, independently of the core's code path. Loads are set with filler requests
that carry no estimate, so they land exactly where least-loaded placement puts them.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

from affinity_conformance.scenario import Scenario

__all__ = ["SUITE", "cases"]

SUITE = "prefix"


def _s(case: str, description: str, reqs: str, **options: Any) -> Scenario:
    return Scenario(SUITE, case, description, requirements=reqs.split(), **options)


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def cases() -> Iterator[Scenario]:
    yield from _off()
    yield from _admissible()
    yield from _ties()
    yield from _paths()
    yield from _groups()


def _off() -> Iterator[Scenario]:
    yield (_s("off_ignores_the_estimate",
              "placement_margin null: cached_prefix is never read; placements are "
              "least-loaded with first ties, whatever the estimate says.",
              "R-PFX-1 R-TIE-2", affinity_break_margin=2)
           .acquire("a", cached={"s2": 1000}, expect="s0", path="new")
           .acquire("b", cached={"s0": 5, "s2": 5}, expect="s1", path="new")
           .acquire("c", cached={"s0": 9}, expect="s2", path="new").check())
    pool = ["s0", "s1", "s2"]
    expect = sorted(pool)[_crc("a") % len(pool)]
    yield (_s("full_determinism_ignores_the_placement_margin",
              "Under full_determinism (stable hashing) placement_margin is ignored like the "
              "margin: a new request lands on sorted(pool)[crc32(rid) mod n] whatever the "
              "estimate.",
              "R-PFX-5 R-DET-3", full_determinism=True, hash_mode="stable",
              placement_margin=2)
           .acquire("a", cached={"s1": 1000, "s2": 1000}, expect=expect, path="new")
           .acquire("a", cached={"s1": 1000}, expect=expect, path="kept").check())


def _admissible() -> Iterator[Scenario]:
    yield (_s("new_joins_the_cached_server_within_the_band",
              "m_place 2, loads s0=0 s1=1 s2=2: s2 is admissible (2 <= 0 + 2) and holds the "
              "most cached prefix, so a new request is placed there although s0 is idle.",
              "R-PFX-2 R-PFX-3 R-PFX-4", affinity_break_margin=2, placement_margin=2)
           .fill(s0=0, s1=1, s2=2)
           .acquire("a", cached={"s2": 1600, "s1": 800}, expect="s2", path="new")
           .assert_loads(s0=0, s1=1, s2=3).check())
    yield (_s("beyond_the_band_is_not_admissible",
              "m_place 2, loads s0=0 s1=1 s2=3: s2 (3 > 0 + 2) is not admissible however much "
              "it caches; the admissible s0 and s1 cache nothing, so the lower load wins.",
              "R-PFX-2 R-PFX-4 R-PFX-7", affinity_break_margin=2, placement_margin=2)
           .fill(s0=0, s1=1, s2=3)
           .acquire("a", cached={"s2": 100000}, expect="s0", path="new").check())
    yield (_s("margin_zero_stays_on_the_minimum",
              "m_place 0: the admissible set is the tie set, so a placement stays on the "
              "minimum whatever is cached above it; with the estimate equal on the tie set "
              "(here: absent) the choice is least-loaded placement's exactly.",
              "R-PFX-6 R-PLACE-1", affinity_break_margin=1, placement_margin=0)
           .fill(s0=0, s1=0, s2=1)
           .acquire("a", cached={"s2": 9999}, expect="s0", path="new")
           .acquire("b", cached={"s2": 9999}, expect="s1", path="new")
           .acquire("c", cached={"s1": 40, "s0": 40}, expect="s0", path="new")
           .check())
    yield (_s("inactive_servers_in_the_estimate_are_ignored",
              "An estimate for a removed server (s1) or an unknown one (s9) is ignored: the "
              "admissible servers s0 and s2 cache nothing, so the first of them wins.",
              "R-PFX-3 R-POOL-4", placement_margin=2)
           .remove("s1")
           .acquire("a", cached={"s1": 900, "s9": 900}, expect="s0", path="new").check())


def _ties() -> Iterator[Scenario]:
    yield (_s("most_cached_then_lower_load",
              "m_place 2, loads s0=0 s1=2 s2=1: s1 and s2 hold the most cached prefix (64 "
              "tokens each); of those the lower load wins, s2.",
              "R-PFX-3", affinity_break_margin=2, placement_margin=2)
           .fill(s0=0, s1=2, s2=1)
           .acquire("a", cached={"s0": 16, "s1": 64, "s2": 64}, expect="s2", path="new")
           .check())
    yield (_s("equal_cache_and_load_take_the_first_candidate",
              "m_place 1, loads s0=1 s1=0 s2=0: s1 and s2 cache 32 tokens at load 0, so the "
              "candidates are [s1, s2] and the first tie-break takes s1.",
              "R-PFX-3 R-TIE-2", placement_margin=1)
           .fill(s0=1, s1=0, s2=0)
           .acquire("a", cached={"s1": 32, "s2": 32}, expect="s1", path="new").check())
    yield (_s("draw_picks_among_the_candidates",
              "The draw tie-break indexes the candidate list, not the tie set: candidates "
              "[s1, s2] with draw 1 give s2; then loads 1, 0, 1 and an estimate of 8 on s0 "
              "and s2 give candidates [s0, s2] (both at load 1), draw 3 -> 3 mod 2 = 1: s2.",
              "R-PFX-3 R-TIE-3", placement_margin=1, tie_break="draw")
           .fill(s0=1, s1=0, s2=0)
           .acquire("a", draw=1, cached={"s1": 32, "s2": 32}, expect="s2", path="new")
           .acquire("b", draw=3, cached={"s0": 8, "s2": 8}, expect="s2", path="new")
           .check())
    candidates = ["s1", "s2"]
    yield (_s("hashed_hashes_the_request_id_over_the_candidates",
              "The hashed tie-break takes candidates[crc32(rid) mod t], t the number of "
              "candidates ([s1, s2] here).",
              "R-PFX-3 R-TIE-4", placement_margin=1, tie_break="hashed")
           .fill(s0=1, s1=0, s2=0)
           .acquire("a", cached={"s1": 32, "s2": 32},
                    expect=candidates[_crc("a") % len(candidates)], path="new").check())


def _paths() -> Iterator[Scenario]:
    yield (_s("broken_pin_is_never_a_candidate",
              "margin 0, m_place 3: a's pin s0 at load 2 over an idle pool breaks; s0 is "
              "within min + 3 and caches the most, but a re-pin moves off its pin, so the "
              "best of s1 and s2 (s2, 100 cached tokens) takes it.",
              "R-PFX-2 R-PFX-4 R-BREAK-1", affinity_break_margin=0, placement_margin=3)
           .acquire("a", expect="s0", path="new").fill(s0=2, s1=0, s2=0)
           .acquire("a", cached={"s0": 5000, "s2": 100}, expect="s2", path="broken",
                    previous="s0")
           .assert_pinned("a", "s2").check())
    yield (_s("kept_hit_ignores_the_estimate",
              "A kept hit stays on its pin: only load-aware choices read cached_prefix.",
              "R-PFX-2 R-KEEP-1", affinity_break_margin=2, placement_margin=2)
           .acquire("a", expect="s0", path="new")
           .acquire("a", cached={"s1": 999}, expect="s0", path="kept").check())
    yield (_s("reselection_uses_the_estimate",
              "A pin on a removed server is re-selected by the placement rule: s2 caches "
              "the most of the admissible s1 and s2.",
              "R-PFX-2 R-PFX-3 R-ACQ-3", placement_margin=2)
           .acquire("a", expect="s0", path="new").remove("s0")
           .acquire("a", cached={"s2": 50}, expect="s2", path="reselected", previous="s0")
           .check())
    yield (_s("unkeyed_placement_uses_the_estimate",
              "An unkeyed request is placed by the same rule and pins nothing.",
              "R-PFX-2 R-PFX-3 R-ACQ-8", placement_margin=1)
           .acquire(None, cached={"s1": 10}, expect="s1", path="unkeyed")
           .acquire(None, cached={"s1": 10}, expect="s1", path="unkeyed")
           .acquire(None, cached={"s1": 10}, expect="s0", path="unkeyed").check())


def _groups() -> Iterator[Scenario]:
    yield (_s("group_miss_and_group_break_use_the_estimate",
              "Group pins (fallback, group_break_margin 0) with m_place 2: the group's first "
              "sample is placed on s2, which caches its prompt; the second sample's group "
              "hit on s2 (load 1 > 0 + 0) breaks and the group re-pins off s2 to the best "
              "of s0 and s1 (both empty: s0).",
              "R-PFX-2 R-PFX-3 R-GRP-4", affinity_break_margin=1,
              group_stickiness="fallback", group_break_margin=0, placement_margin=2)
           .acquire("a1", group="g", cached={"s2": 100}, expect="s2", path="new")
           .acquire("a2", group="g", cached={"s2": 100}, expect="s0", path="group_broken",
                    previous="s2")
           .assert_group("g", "s0").check())
