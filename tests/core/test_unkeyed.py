"""Unkeyed requests (``request_id=None``): least-loaded, never pinned (R-ACQ-8)."""

from __future__ import annotations

import pytest

from .driver import Run


@pytest.mark.parametrize("options", [{}, {"affinity_break_margin": 0}, {"tie_break": "hashed"}])
def test_unkeyed_goes_to_the_least_loaded_server(options: dict[str, object]) -> None:
    """R-ACQ-8, R-PLACE-1: with loads 2/0/1 an unkeyed request goes to s1, in every policy."""
    run = Run.of(**options).set_loads(s0=2, s1=0, s2=1)
    run.acquire(None, expect="s1", path="unkeyed", previous=None, evicted=None)
    run.acquire(None, expect="s1", path="unkeyed")  # s1 and s2 tie at 1: pool order
    assert run.loads == {"s0": 2, "s1": 2, "s2": 1}


def test_unkeyed_never_reads_or_writes_the_sticky_map() -> None:
    """R-ACQ-8, R-LRU-5, R-CNT-3: a full map keeps its entries and recency order, no
    eviction, and the counters do not move."""
    run = Run.of(max_cache_size=2).acquire("a", expect="s0").acquire("b", expect="s1")
    lru, counters = run.lru, run.counters
    for _ in range(5):
        run.acquire(None, path="unkeyed", evicted=None)
        assert run.lru == lru
    assert run.counters == counters == (0, 0)
    run.acquire("c", evicted="a")  # a is still the oldest: the unkeyed turns touched nothing


def test_unkeyed_ties_use_the_draw() -> None:
    """R-ACQ-8, R-TIE-3: under draw, unkeyed ties are picked by tie_draw mod t."""
    run = Run.of(tie_break="draw")
    run.acquire(None, tie_draw=5, expect="s2").acquire(None, tie_draw=1, expect="s1")
    run.acquire(None, tie_draw=7, expect="s0")
