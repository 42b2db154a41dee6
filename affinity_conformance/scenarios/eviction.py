"""Suite ``eviction``: the sticky map's LRU rules (cachetools ``LRUCache``, SPEC section 6).

Small ``max_cache_size`` values force evictions; the cases are built so that the
*observable* routing (which server a request gets) depends on which entry the LRU rules
evict, so an implementation with wrong recency fails on a server choice, not only on an
internal check.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from affinity_conformance.scenario import Scenario

SUITE = "eviction"


def _s(case: str, description: str, reqs: str, **options: Any) -> Scenario:
    return Scenario(SUITE, case, description, requirements=reqs.split(), **options)


def cases() -> Iterator[Scenario]:
    yield (_s("worked_example_capacity_two",
              "SPEC section 6 example: a, b, a (hit refreshes a), c evicts b; b then "
              "evicts a.",
              "R-LRU-2 R-LRU-3 R-LRU-5 R-ACQ-7", max_cache_size=2)
           .acquire("a", expect="s0").acquire("b", expect="s1")
           .acquire("a", expect="s0", path="kept")
           .acquire("c", expect="s2", evicted="b").check("lru")
           .acquire("b", expect="s1", path="new", evicted="a"))
    yield (_s("refresh_decides_which_session_survives",
              "The hit on a makes b the oldest entry, so c evicts b and a keeps its "
              "server; an LRU whose lookups do not refresh would evict a and re-place it.",
              "R-LRU-2 R-LRU-3", servers=("s0", "s1"), max_cache_size=2)
           .acquire("a", expect="s0").acquire("b", expect="s1")
           .acquire("a", expect="s0", path="kept").acquire("c", expect="s1", evicted="b")
           .release("s1").release("s1").acquire("a", expect="s0", path="kept"))
    yield (_s("capacity_one_alternates",
              "Capacity 1: each new id evicts the previous one, which is then placed anew.",
              "R-LRU-3 R-LRU-5 R-CNT-3", max_cache_size=1)
           .acquire("a", expect="s0").acquire("b", expect="s1", evicted="a")
           .acquire("a", expect="s2", path="new", evicted="b").check())
    yield (_s("reselect_frees_its_slot",
              "A hit on a removed server deletes the entry before the re-insert, so a "
              "full map evicts nothing.",
              "R-ACQ-3 R-LRU-3 R-LRU-4 R-POOL-3", max_cache_size=2)
           .acquire("a", expect="s0").acquire("b", expect="s1").remove("s0")
           .acquire("a", expect="s2", path="reselected").check("lru"))
    yield (_s("evicted_session_is_placed_anew",
              "An evicted session loses its pin and goes to the least-loaded server.",
              "R-LRU-3 R-PLACE-1 R-CNT-3", max_cache_size=2)
           .acquire("a", expect="s0").acquire("b", expect="s1")
           .acquire("c", expect="s2", evicted="a").release("s1")
           .acquire("a", expect="s1", path="new", evicted="b"))
    yield (_s("clear_then_refill_without_eviction",
              "After clear_sticky_cache the map has room again.",
              "R-LRU-4 R-LRU-5 R-CLR-1", max_cache_size=2)
           .acquires("a", "b").clear(cleared=2).acquire("c", expect="s2")
           .acquire("d", expect="s0").check("lru"))
    yield (_s("hits_reorder_recency",
              "Hits on a and b leave c the oldest of three; d evicts c.",
              "R-LRU-2 R-LRU-3", max_cache_size=3)
           .acquires("a", "b", "c").acquire("a", path="kept").acquire("b", path="kept")
           .acquire("d", expect="s2", evicted="c").check("lru")
           .acquire("c", expect="s0", path="new", evicted="a"))
    yield (_s("removed_hit_is_reinserted_newest",
              "A removed-server hit deletes and re-inserts the id as the newest entry.",
              "R-ACQ-3 R-LRU-2 R-LRU-3", max_cache_size=3)
           .acquires("a", "b", "c").remove("s1")
           .acquire("b", expect="s0", path="reselected").check("lru"))
    yield (_s("entry_for_removed_server_can_be_evicted",
              "Entries for removed servers stay until looked up or evicted.",
              "R-LRU-3 R-POOL-3 R-HAZ-1", max_cache_size=2)
           .acquire("a", expect="s0").acquire("b", expect="s1").remove("s0").check("lru")
           .acquire("c", expect="s2", evicted="a").check("lru"))
