"""Suite ``group``: group pins (SPEC section 7.6, R-GRP-1..8), after PR #6122.

A *group* is the set of conversations sampled from one prompt (verl's ``uid``); an acquire
names it in ``group_id``. Hand expectations for ``full_determinism`` in ``stable`` mode and
for the ``hashed`` tie-break are computed here with :func:`zlib.crc32` and :func:`sorted`
over the *group* id (R-GRP-6), independently of the core's code path. Every case with
group stickiness on ends with a status check of the group map's size and counters
(``group_entries``, ``group_kept``, ``group_broken``: R-GRP-5, R-STAT-1).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from affinity_conformance.scenario import Scenario

__all__ = ["R_GRP_8", "SUITE", "cases", "stable_group_choice"]

SUITE = "group"
# R-GRP-8: PR #6122's GroupStickyLoadBalancer as a configuration (first ties, legacy
# policy, group map as large as the sticky map).
R_GRP_8: dict[str, Any] = {"group_stickiness": "only"}
_GROUP_STATUS = ("group_stickiness", "group_entries", "group_kept", "group_broken")


def stable_group_choice(group_id: str, pool: Sequence[str]) -> str:
    """R-GRP-6 with R-DET-3 written out: sorted(pool)[crc32(group id) mod n]."""
    return sorted(pool)[zlib.crc32(group_id.encode("utf-8")) % len(pool)]


def _s(case: str, description: str, reqs: str, **options: Any) -> Scenario:
    return Scenario(SUITE, case, description, requirements=reqs.split(), **options)


def _done(run: Scenario) -> Scenario:
    """The final check: pool, sticky map and counters, plus the group map's status."""
    if run.config.groups:
        run.check("servers", "lru", "affinity_kept", "affinity_broken",
                  status_keys=_GROUP_STATUS)
    return run


def _only(case: str, description: str, reqs: str, **options: Any) -> Scenario:
    return _s(case, description, f"R-GRP-8 {reqs}", **{**R_GRP_8, **options})


def _r_grp_8() -> Iterator[Scenario]:
    yield _done(_only(
        "only_siblings_share_the_group_pin",
        "R-GRP-8's configuration (PR #6122): the first sibling places the group on the "
        "least-loaded server; every later sibling follows the group pin (group_kept) "
        "whatever the load, since with the legacy policy and a null group_break_margin a "
        "group pin is never reconsidered; no sticky entry is written under \"only\".",
        "R-GRP-1 R-GRP-2 R-GRP-3 R-GRP-4 R-GRP-5")
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("a2", group="g", expect="s0", path="group_kept")
        .acquire("a3", group="g", expect="s0", path="group_kept")
        .acquire("b1", group="h", expect="s1", path="new")
        .acquire("a4", group="g", expect="s0", path="group_kept")
        .assert_group("g", "s0").assert_group("h", "s1").assert_loads(s0=4, s1=1, s2=0))
    yield _done(_only(
        "only_never_reads_the_request_map",
        "Under \"only\" the request id is not looked up: the same request id in two groups "
        "follows each group's pin, and a repeated request id of a group is a group hit.",
        "R-GRP-2 R-GRP-4")
        .acquire("a", group="g", expect="s0", path="new")
        .acquire("a", group="h", expect="s1", path="new")
        .acquire("a", group="g", expect="s0", path="group_kept")
        .release("s0", result="applied").release("s0", result="applied")
        .acquire("a", group="h", expect="s1", path="group_kept"))
    yield _done(_only(
        "only_group_lru_capacity_1_reports_evicted_group",
        "max_group_cache_size 1 (equal to max_cache_size, R-GRP-8): a second group evicts "
        "the first, reported as evicted_group; the first group's next sibling is a group "
        "miss placed anew on the least-loaded server.",
        "R-GRP-4 R-LRU-3", max_cache_size=1, max_group_cache_size=1)
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("b1", group="h", expect="s1", path="new", evicted_group="g")
        .acquire("a2", group="g", expect="s2", path="new", evicted_group="h")
        .assert_group("h", None))
    yield _done(_only(
        "only_group_hit_refreshes_recency",
        "max_group_cache_size 2: a group hit refreshes its group's recency (group recency "
        "touch), so the third group evicts the other one, not the group just hit.",
        "R-GRP-4 R-LRU-2 R-LRU-3", max_cache_size=2, max_group_cache_size=2)
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("b1", group="h", expect="s1", path="new")
        .acquire("a2", group="g", expect="s0", path="group_kept")
        .acquire("c1", group="k", expect="s2", path="new", evicted_group="h")
        .acquire("a3", group="g", expect="s0", path="group_kept")
        .acquire("b2", group="h", expect="s1", path="new", evicted_group="k")
        .assert_group("g", "s0"))
    yield _done(_only(
        "only_release_does_not_touch_the_group_map",
        "Releases lower loads only: the group pin stays where it is when its server "
        "drains (a new group is then placed there too, on the first tied server), and the "
        "next sibling still follows it.",
        "R-GRP-4 R-RLS-1")
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("a2", group="g", expect="s0", path="group_kept")
        .release("s0", result="applied").release("s0", result="applied")
        .acquire("b1", group="h", expect="s0", path="new")
        .acquire("a3", group="g", expect="s0", path="group_kept"))


def _fallback() -> Iterator[Scenario]:
    yield _done(_s(
        "fallback_own_pin_first",
        "\"fallback\": a conversation's own pin is read first, under today's rules; only a "
        "request id without an own entry reads the group map. Each grouped acquire also "
        "writes its own entry, so the sibling's second turn is a plain sticky hit (kept).",
        "R-GRP-1 R-GRP-2 R-GRP-4 R-ACQ-1 R-KEEP-3", group_stickiness="fallback")
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("a2", group="g", expect="s0", path="group_kept")
        .acquire("a1", group="g", expect="s0", path="kept")
        .assert_pinned("a2", "s0").assert_group("g", "s0").assert_counters(1, 0))
    yield _done(_s(
        "fallback_group_break_margin_null_uses_the_keep_rule",
        "group_break_margin null: the group's keep rule is the conversation's (R-GRP-3), here "
        "affinity_break_margin 1. A sibling arriving with the group's server two above the "
        "minimum breaks the group pin (group_broken, previous s0) and re-pins the group.",
        "R-GRP-3 R-GRP-4 R-GRP-5 R-KEEP-1", group_stickiness="fallback",
        affinity_break_margin=1)
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("a2", group="g", expect="s0", path="group_kept")
        .acquire("a3", group="g", expect="s1", path="group_broken", previous="s0")
        .assert_group("g", "s1")
        .acquire("a4", group="g", expect="s1", path="group_kept"))
    yield _done(_s(
        "fallback_group_break_margin_set_overrides_the_keep_rule",
        "group_break_margin 0 with affinity_break_margin 2: the group's pin is judged by "
        "L <= min + 0, so the second sibling already moves (group_broken) while a "
        "conversation's own pin at the same load would be kept.",
        "R-GRP-3 R-GRP-4 R-GRP-5", group_stickiness="fallback", affinity_break_margin=2,
        group_break_margin=0)
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("a2", group="g", expect="s1", path="group_broken", previous="s0")
        .acquire("a1", group="g", expect="s0", path="kept")
        .assert_group("g", "s1"))
    yield _done(_s(
        "fallback_group_pin_broken_then_repinned_and_kept",
        "A broken group pin is re-pinned to the least-loaded server; later siblings are "
        "judged against the new pin and kept there while it stays within the margin.",
        "R-GRP-3 R-GRP-4 R-GRP-5", group_stickiness="fallback", group_break_margin=1)
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("a2", group="g", expect="s0", path="group_kept")
        .acquire("a3", group="g", expect="s1", path="group_broken", previous="s0")
        .acquire("a4", group="g", expect="s1", path="group_kept")
        .acquire("a5", group="g", expect="s2", path="group_broken", previous="s1")
        .assert_group("g", "s2"))
    yield _done(_s(
        "fallback_group_on_removed_server_reselects",
        "A group pin on a removed server: the group entry is deleted, the sibling placed on "
        "the least-loaded active server (path reselected, previous = the removed server) and "
        "the group re-pinned there. Group entries are invalidated lazily (R-GRP-5).",
        "R-GRP-2 R-GRP-4 R-GRP-5 R-POOL-3 R-POOL-4", group_stickiness="fallback")
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("b1", group="h", expect="s1", path="new")
        .remove("s0").assert_group("g", "s0")
        .acquire("a2", group="g", expect="s2", path="reselected", previous="s0")
        .assert_group("g", "s2")
        .acquire("a3", group="g", expect="s2", path="group_kept"))
    yield _done(_only(
        "only_group_on_removed_server_reselects",
        "The same under R-GRP-8's configuration: a group hit on a removed server reselects "
        "and re-pins the group; the pin is kept afterwards whatever the load.",
        "R-GRP-2 R-GRP-4 R-POOL-4")
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("a2", group="g", expect="s0", path="group_kept")
        .remove("s0")
        .acquire("a3", group="g", expect="s1", path="reselected", previous="s0")
        .acquire("a4", group="g", expect="s1", path="group_kept"))
    yield _done(_s(
        "fallback_group_lru_capacity_2",
        "max_group_cache_size 2 (the sticky map keeps 10000): the third group evicts the "
        "least recent group (evicted_group); an evicted group's next new sibling is a group "
        "miss placed by load (here on s1), while a sibling with its own entry is still a plain "
        "sticky hit on its old server.",
        "R-GRP-1 R-GRP-4 R-LRU-3", group_stickiness="fallback", max_group_cache_size=2)
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("b1", group="h", expect="s1", path="new")
        .acquire("c1", group="k", expect="s2", path="new", evicted_group="g")
        .acquire("a1", group="g", expect="s0", path="kept")
        .acquire("a2", group="g", expect="s1", path="new", evicted_group="h")
        .assert_group("g", "s1"))
    yield _done(_s(
        "clear_sticky_cache_reports_cleared_groups",
        "clear_sticky_cache empties the group map too and reports its size before clearing "
        "as cleared_groups; afterwards a sibling is a group miss.",
        "R-GRP-5 R-CLR-1", group_stickiness="fallback")
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("b1", group="h", expect="s1", path="new")
        .acquire("a2", group="g", expect="s0", path="group_kept")
        .clear(cleared=3, cleared_groups=2)
        .acquire("a3", group="g", expect="s2", path="new"))
    yield _done(_s(
        "clear_with_no_groups_reports_no_cleared_groups",
        "A clear with group stickiness on but an empty group map reports no cleared_groups "
        "(the field appears only when non-zero, R-CODEC-1).",
        "R-GRP-5 R-CLR-1 R-CODEC-1", group_stickiness="fallback")
        .acquire("a").clear(cleared=1, cleared_groups=0))


def _determinism() -> Iterator[Scenario]:
    pool = ("s2", "s0", "s1")
    run = _s("stable_siblings_hash_the_group",
             "full_determinism with hash_mode stable: a grouped placement hashes the group id "
             "(R-GRP-6), so every sibling lands on sorted(pool)[crc32(group id) mod n] "
             "whatever the order they arrive in and whatever the load.",
             "R-GRP-6 R-DET-3 R-HASH-1 R-DET-4", servers=pool, group_stickiness="fallback",
             full_determinism=True, hash_mode="stable")
    for group in ("g", "prompt-7", "é"):
        target = stable_group_choice(group, pool)
        run.acquire(f"{group}-1", group=group, expect=target, path="new")
        for n in (2, 3):
            run.acquire(f"{group}-{n}", group=group, expect=target, path="group_kept")
    yield _done(run)
    only = _s("stable_only_group_evicted_lands_on_the_same_server",
              "Under \"only\" with stable hashing an evicted group's next sibling is placed by "
              "the same hash, so it lands where its siblings are.",
              "R-GRP-6 R-DET-3 R-LRU-3", group_stickiness="only", full_determinism=True,
              hash_mode="stable", max_group_cache_size=1)
    only.acquire("x", group="g", expect=stable_group_choice("g", ("s0", "s1", "s2")))
    only.acquire("y", group="h", expect=stable_group_choice("h", ("s0", "s1", "s2")),
                 evicted_group="g")
    only.acquire("z", group="g", expect=stable_group_choice("g", ("s0", "s1", "s2")),
                 path="new", evicted_group="h")
    yield _done(only)
    yield _done(_s(
        "caller_hash_is_the_groups",
        "full_determinism with hash_mode caller: request_hash is the caller's hash of the "
        "placement key, the group id (R-GRP-6); a group hit is always kept (R-DET-4), "
        "even far above the minimum.",
        "R-GRP-6 R-DET-2 R-DET-4", group_stickiness="fallback", full_determinism=True,
        group_break_margin=0)
        .acquire("a1", group="g", request_hash=1, expect="s1", path="new")
        .acquire("a2", group="g", request_hash=7, expect="s1", path="group_kept")
        .acquire("a3", group="g", request_hash=7, expect="s1", path="group_kept")
        .acquire("b1", group="h", request_hash=2, expect="s2", path="new"))


def _ties_and_defaults() -> Iterator[Scenario]:
    ties = ("s0", "s1", "s2")
    run = _s("hashed_tie_break_hashes_the_group",
             "tie_break hashed: a grouped placement's tie is decided by the group id's hash "
             "(R-GRP-6), crc32(group id) mod the number of tied servers.",
             "R-GRP-6 R-TIE-3", group_stickiness="only", tie_break="hashed")
    run.acquire("r1", group="g", expect=ties[zlib.crc32(b"g") % 3], path="new")
    yield _done(run)
    yield _done(_s(
        "unkeyed_acquire_ignores_its_group",
        "An unkeyed acquire is never grouped (R-GRP-2, R-ACQ-8): it is placed on the "
        "least-loaded server and neither reads nor writes the group map.",
        "R-GRP-2 R-ACQ-8", group_stickiness="fallback")
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire(None, group="g", expect="s1", path="unkeyed")
        .acquire(None, group="h", expect="s2", path="unkeyed")
        .assert_group("h", None)
        .acquire("a2", group="g", expect="s0", path="group_kept"))
    yield _done(_s(
        "acquires_without_group_ids_are_unchanged",
        "With group stickiness on, an acquire without group_id has exactly its transition "
        "with the option off (R-GRP-7): sticky hits, breaks and placements under the "
        "margin, no group entry written.",
        "R-GRP-7 R-KEEP-1 R-BREAK-1", group_stickiness="fallback", affinity_break_margin=0)
        .acquire("a", expect="s0", path="new").acquire("b", expect="s1", path="new")
        .acquire("c", expect="s2", path="new")
        .acquire("a", expect="s0", path="kept")
        .acquire("a", expect="s1", path="broken", previous="s0")
        .assert_counters(1, 1))
    yield _done(_s(
        "acquires_without_group_ids_are_unchanged_only",
        "Under \"only\" too an acquire without group_id reads and writes the sticky map as "
        "without groups (R-GRP-7): the group map is not read.",
        "R-GRP-7 R-ACQ-1", group_stickiness="only")
        .acquire("a1", group="g", expect="s0", path="new")
        .acquire("b", expect="s1", path="new")
        .acquire("b", expect="s1", path="kept")
        .assert_pinned("b", "s1").assert_pinned("a1", None))
    yield (_s("off_ignores_group_ids",
              "group_stickiness off (the default): the acquire's group_id is never read "
              "(R-GRP-1); siblings spread by load as distinct conversations.",
              "R-GRP-1 R-GRP-7")
           .acquire("a1", group="g", expect="s0", path="new")
           .acquire("a2", group="g", expect="s1", path="new")
           .acquire("a1", group="g", expect="s0", path="kept"))


def cases() -> Iterator[Scenario]:
    yield from _r_grp_8()
    yield from _fallback()
    yield from _determinism()
    yield from _ties_and_defaults()
