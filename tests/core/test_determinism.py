"""``full_determinism``: caller and stable hash modes (R-DET-1..4, R-ACQ-9).

Caller mode is verl's ``list(servers)[hash(request_id) % n]`` with the hash supplied on
the event; stable mode is PR #7667's ``sorted(servers)[crc32(request_id) % n]``.
Expectations are computed here from those formulas, with ``zlib`` directly.
"""

from __future__ import annotations

import zlib

import pytest

from affinity_engine import DualThreshold

from .driver import Run


def crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


@pytest.mark.parametrize(("request_hash", "server"),
                         [(0, "s0"), (4, "s1"), (-1, "s2"), (-7, "s2"), (2**64, "s1")])
def test_caller_mode_indexes_pool_by_hash_mod_n_ignoring_load(request_hash: int,
                                                             server: str) -> None:
    """R-DET-2, R-ACQ-4: pool[request_hash mod n] (Python's non-negative mod), whatever
    the loads."""
    run = Run.of(full_determinism=True).set_loads(s0=9, s1=30, s2=3)
    run.acquire("x", request_hash=request_hash, expect=server, path="new")
    assert run.lru[-1] == ("x", server)


def test_caller_mode_uses_pool_order_after_re_add() -> None:
    """R-DET-2, R-POOL-1: the index runs over insertion order, so a re-add shifts it."""
    run = Run.of(full_determinism=True).remove("s0").add("s0")
    run.acquire("x", request_hash=0, expect="s1").acquire("y", request_hash=2, expect="s0")


def test_sticky_map_is_read_first() -> None:
    """R-DET-1: a pinned id keeps its server after a pool change moves its hash slot,
    and a later turn's hash is not consulted."""
    run = Run.of(full_determinism=True).acquire("x", request_hash=0, expect="s0")
    run.remove("s1").add("s3")
    run.acquire("x", request_hash=1, expect="s0", path="kept")
    assert run.counters == (1, 0)


def test_removed_pin_is_re_placed_by_hash_not_by_load() -> None:
    """R-DET-1, R-ACQ-3: under full_determinism a re-selection uses the hash too."""
    run = Run.of(full_determinism=True).acquire("x", request_hash=1, expect="s1")
    run.set_loads(s2=20).remove("s1")
    run.acquire("x", request_hash=1, expect="s2", path="reselected", previous="s1")


@pytest.mark.parametrize("rid", ["det-0", "det-1", "det-2", "det-3", "det-4", "det-5"])
def test_stable_mode_indexes_sorted_ids_by_crc32(rid: str) -> None:
    """R-DET-3, R-HASH-1: sorted(pool)[crc32(rid) mod n]; no request_hash needed."""
    pool = ("s2", "s0", "s1")
    run = Run.of(pool, full_determinism=True, hash_mode="stable")
    run.acquire(rid, expect=sorted(pool)[crc(rid) % 3], path="new")


def test_stable_mode_is_independent_of_insertion_order() -> None:
    """R-DET-3: two pools with the same ids in different orders route 50 ids identically
    (while caller mode, indexing pool order, does not)."""
    orders = (("a", "b", "c", "d"), ("d", "b", "a", "c"))
    routes = []
    for order in orders:
        run = Run.of(order, full_determinism=True, hash_mode="stable")
        for i in range(50):
            run.acquire(f"det-{i}").release(run.lru[-1][1], result="applied")
        routes.append(run.lru)
    assert routes[0] == routes[1]
    assert len({sid for _, sid in routes[0]}) == 4
    caller = [Run.of(order, full_determinism=True).acquire("r", request_hash=0).lru
              for order in orders]
    assert caller[0] != caller[1]


@pytest.mark.parametrize("policy", [{"affinity_break_margin": 0},
                                    {"dual_threshold": DualThreshold(1, 1)}])
def test_policies_are_ignored_and_kept_still_counts(policy: dict[str, object]) -> None:
    """R-DET-4, R-CNT-1: margin and gate never break a pin under full_determinism."""
    run = Run.of(full_determinism=True, **policy).acquire("x", request_hash=0, expect="s0")
    run.set_loads(s0=100)
    for _ in range(3):
        run.acquire("x", request_hash=0, expect="s0", path="kept")
    assert run.counters == (3, 0)
    assert run.allowed("x", request_hash=0) == {"s0"}


def test_missing_request_id_is_invalid_for_config() -> None:
    """R-ACQ-9, R-OUT-2: full_determinism rejects an unkeyed acquire, changing nothing."""
    for mode in ("caller", "stable"):
        run = Run.of(full_determinism=True, hash_mode=mode)
        before = run.state
        run.reject(None, request_hash=0, reason="invalid_for_config")
        assert run.state == before
        assert run.allowed(None, request_hash=0) == frozenset()


def test_missing_request_hash_is_invalid_in_caller_mode_only() -> None:
    """R-ACQ-9: caller mode needs request_hash even on a sticky hit and even with an
    empty pool (validation comes first); stable mode does not need it."""
    run = Run.of(full_determinism=True).acquire("x", request_hash=0, expect="s0")
    before = run.state
    run.reject("x", reason="invalid_for_config")
    assert run.state == before
    Run.of((), full_determinism=True).reject("x", reason="invalid_for_config")
    Run.of((), full_determinism=True).reject("x", request_hash=3, reason="no_servers")
    Run.of(full_determinism=True, hash_mode="stable").acquire("x", path="new")
