"""The sticky map's cachetools LRU rules (upstream-verl.md section 7), seen through step.

Each rule R-LRU-1..5 is checked as the recency order (``state.lru.items()``, oldest
first) that a literal event sequence leaves behind, plus the ``evicted`` field of the
outcome that caused an eviction.
"""

from __future__ import annotations

from affinity_engine import Acquire, StickyCacheCleared, allowed, classify

from .driver import Run


def test_worked_example_maxsize_2() -> None:
    """R-LRU-2, R-LRU-3: a, b, a (hit refreshes a), then c evicts b: the cache is {a, c}."""
    run = Run.of(max_cache_size=2)
    run.acquire("a", expect="s0", path="new").acquire("b", expect="s1", path="new")
    run.acquire("a", expect="s0", path="kept")
    assert run.lru == (("b", "s1"), ("a", "s0"))
    run.acquire("c", expect="s2", path="new", evicted="b")
    assert run.lru == (("a", "s0"), ("c", "s2"))
    # b lost its pin: its next turn is a first placement, not a hit.
    run.acquire("b", path="new", evicted="a")
    assert run.counters == (1, 0)


def test_membership_and_queries_do_not_refresh() -> None:
    """R-LRU-1: membership, peek, classify and allowed leave the recency order alone."""
    run = Run.of(max_cache_size=2).acquire("a").acquire("b")
    order = run.lru
    assert "a" in run.state.lru
    assert run.state.lru.peek("a") == "s0"
    classify(run.config, run.state, "a")
    allowed(run.config, run.state, Acquire(request_id="a"))
    assert run.lru == order
    # so a is still the oldest and is the one a new key evicts
    run.acquire("c", evicted="a")


def test_sticky_hit_refreshes_recency() -> None:
    """R-LRU-2: a kept hit moves its key to most recent without changing its value."""
    run = Run().acquire("a").acquire("b").acquire("c")
    run.acquire("a", expect="s0", path="kept")
    assert run.lru == (("b", "s1"), ("c", "s2"), ("a", "s0"))


def test_break_overwrites_in_place_without_eviction() -> None:
    """R-LRU-3, R-BREAK-1: a re-pin writes an existing key: new value, most recent, no
    eviction even in a full map."""
    run = Run.of(max_cache_size=2, affinity_break_margin=0)
    run.acquire("a", expect="s0").acquire("b", expect="s1").set_loads(s0=3, s1=3)
    run.acquire("a", expect="s2", path="broken", previous="s0", evicted=None)
    assert run.lru == (("b", "s1"), ("a", "s2"))


def test_new_key_into_full_map_evicts_least_recent_first() -> None:
    """R-LRU-3: each new key into a full map evicts exactly the least recent one."""
    run = Run.of(max_cache_size=3)
    for rid in ("a", "b", "c"):
        run.acquire(rid, evicted=None)
    run.acquire("b")  # refresh: order a, c, b
    run.acquire("d", evicted="a").acquire("e", evicted="c")
    assert [rid for rid, _ in run.lru] == ["b", "d", "e"]


def test_reselection_reinserts_without_eviction() -> None:
    """R-LRU-3, R-LRU-4, R-ACQ-3: the stale entry is deleted before the re-insert, so a
    re-selection in a full map evicts nobody."""
    run = Run.of(max_cache_size=2).acquire("a", expect="s0").acquire("b", expect="s1")
    run.remove("s0")
    run.acquire("a", expect="s2", path="reselected", previous="s0", evicted=None)
    assert run.lru == (("b", "s1"), ("a", "s2"))


def test_clear_empties_the_map_and_keeps_loads_and_counters() -> None:
    """R-LRU-4, R-CLR-1, R-CNT-2, R-OUT-3: clear returns the entry count and the loads, empties
    the map, and leaves loads and counters alone; the next turn is a new placement."""
    run = Run().acquire("a").acquire("a").acquire("b")
    loads, counters = run.loads, run.counters
    run.clear(cleared=2)
    assert run.last == StickyCacheCleared(2, (("s0", 2), ("s1", 1), ("s2", 0)))
    assert run.lru == ()
    assert (run.loads, run.counters) == (loads, counters) == ({"s0": 2, "s1": 1, "s2": 0},
                                                              (1, 0))
    run.acquire("a", expect="s2", path="new")
    assert run.counters == (1, 0)  # R-CNT-3: placements after a clear are not counted
    run.clear(cleared=1).clear(cleared=0)


def test_size_never_exceeds_capacity() -> None:
    """R-LRU-5, R-ST-2: 20 distinct ids through a map of 3 keep exactly the newest 3."""
    run = Run.of(max_cache_size=3)
    for i in range(20):
        run.acquire(f"r{i}")
        assert len(run.state.lru) == min(i + 1, 3)
    assert [rid for rid, _ in run.lru] == ["r17", "r18", "r19"]
    assert run.status()["sticky_entries"] == 3


def test_max_cache_size_1_keeps_only_the_latest_id() -> None:
    """R-CFG-4, R-LRU-3: capacity 1 works (verl's 0 would fail every acquire): only the
    most recent id is sticky, so alternating ids never hit."""
    run = Run.of(max_cache_size=1)
    run.acquire("a", expect="s0").acquire("a", expect="s0", path="kept")
    run.acquire("b", expect="s1", evicted="a").acquire("a", expect="s2", path="new",
                                                        evicted="b")
    assert run.lru == (("a", "s2"),)
    assert run.counters == (1, 0)
