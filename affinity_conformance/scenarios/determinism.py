"""Suite ``determinism``: ``full_determinism`` in both hash modes (SPEC section 9).

``caller`` mode takes ``request_hash`` from the event (verl: ``hash(request_id)`` under a
fixed PYTHONHASHSEED; ``affinity check`` supplies the IMPL's own in-process hash).
``stable`` mode is CRC-32 over the sorted pool (PR #7667). Hand expectations for stable
mode are computed here with :func:`zlib.crc32` and :func:`sorted`, independently of the
core's code path.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from affinity_conformance.scenario import Scenario
from affinity_engine import DualThreshold

SUITE = "determinism"


def _s(case: str, description: str, reqs: str, **options: Any) -> Scenario:
    return Scenario(SUITE, case, description, requirements=reqs.split(),
                    full_determinism=True, **options)


def stable_choice(request_id: str, pool: Sequence[str]) -> str:
    """R-DET-3 written out: sorted(pool)[crc32(utf-8 bytes) mod n]."""
    return sorted(pool)[zlib.crc32(request_id.encode("utf-8")) % len(pool)]


def _stable_run(case: str, servers: Sequence[str], ids: Sequence[str]) -> Scenario:
    run = _s(case, f"stable hash over servers given in the order {list(servers)}: the "
             "placements depend only on the id and the set of servers.",
             "R-DET-1 R-DET-3 R-HASH-1 R-PURE-1", servers=servers, hash_mode="stable")
    for rid in ids:
        run.acquire(rid, expect=stable_choice(rid, servers), path="new")
    return run


def cases() -> Iterator[Scenario]:
    yield (_s("caller_hash_indexes_pool_order",
              "caller mode: pool[request_hash mod n] in pool order, ignoring load; "
              "the modulus is floored (-1 mod 3 = 2).",
              "R-DET-1 R-DET-2 R-ACQ-4")
           .acquire("a", request_hash=4, expect="s1").acquire("b", request_hash=4, expect="s1")
           .acquire("c", request_hash=-1, expect="s2").acquire("d", request_hash=3, expect="s0")
           .assert_loads(s0=1, s1=2, s2=1))
    yield (_s("caller_sticky_survives_pool_change",
              "The sticky map is read first: a pinned id keeps its server after an add; "
              "after its server is removed it is re-placed by the hash over the new pool.",
              "R-DET-1 R-DET-2 R-ACQ-3")
           .acquire("a", request_hash=0, expect="s0").add("s3")
           .acquire("a", request_hash=1, expect="s0", path="kept").remove("s0")
           .acquire("a", request_hash=1, expect="s2", path="reselected"))
    yield (_s("caller_readd_moves_the_index",
              "Re-adding a server moves it to the end of the pool, changing the mapping.",
              "R-DET-2 R-POOL-1")
           .remove("s0").add("s0").acquire("x", request_hash=2, expect="s0")
           .acquire("y", request_hash=0, expect="s1"))
    yield (_s("caller_needs_request_hash",
              "caller mode without request_hash is rejected before the lookup, even for "
              "an id that would be a sticky hit.",
              "R-ACQ-9 R-OUT-2")
           .acquire("a", request_hash=0, expect="s0").reject("a", reason="invalid_for_config")
           .reject("b", reason="invalid_for_config").needs("core_events").check())
    yield (_s("caller_eviction_replaces_by_hash",
              "An evicted id is placed anew by its hash, not by load.",
              "R-DET-1 R-LRU-3", max_cache_size=1)
           .acquire("a", request_hash=0, expect="s0")
           .acquire("b", request_hash=1, expect="s1", evicted="a")
           .acquire("a", request_hash=2, expect="s2", path="new", evicted="b"))
    yield (_s("caller_margin_is_ignored",
              "Under full_determinism the margin is ignored: a pin far above the minimum "
              "is kept.",
              "R-DET-4 R-CNT-1", affinity_break_margin=0)
           .acquire("a", request_hash=0, expect="s0").fill(s0=5)
           .acquire("a", request_hash=0, expect="s0", path="kept"))
    yield (_s("caller_gate_is_ignored",
              "Under full_determinism the dual-threshold gate is ignored too.",
              "R-DET-4", dual_threshold=DualThreshold(1))
           .acquire("a", request_hash=0, expect="s0").fill(s0=5)
           .acquire("a", request_hash=0, expect="s0", path="kept"))
    yield _stable_run("stable_hash_over_sorted_pool", ("s2", "s0", "s1"),
                      ("a", "b", "conv-1", "é", "y"))
    yield _stable_run("stable_order_invariance_sorted", ("s0", "s1", "s2"),
                      ("a", "b", "c", "d", "e", "x", "y", "z"))
    yield _stable_run("stable_order_invariance_rotated", ("s1", "s2", "s0"),
                      ("a", "b", "c", "d", "e", "x", "y", "z"))
    yield (_s("stable_after_remove",
              "Removing a server changes the sorted pool and the modulus.",
              "R-DET-3 R-HASH-1", hash_mode="stable")
           .remove("s1").acquire("a", expect=stable_choice("a", ("s0", "s2")))
           .acquire("b", expect=stable_choice("b", ("s0", "s2")))
           .acquire("d", expect=stable_choice("d", ("s0", "s2"))))
    yield (_s("stable_sticky_first",
              "A pinned id keeps its server when the pool grows.",
              "R-DET-1 R-DET-3", hash_mode="stable")
           .acquire("a", expect=stable_choice("a", ("s0", "s1", "s2"))).add("s3")
           .acquire("a", expect=stable_choice("a", ("s0", "s1", "s2")), path="kept"))
    yield (_s("stable_rejects_unkeyed",
              "Under full_determinism an unkeyed acquire is rejected (needs a request id).",
              "R-ACQ-9 R-OUT-2", hash_mode="stable")
           .acquire("a").reject(None, reason="invalid_for_config").check())
    yield (_s("caller_empty_pool",
              "An empty pool rejects with no_servers also under full_determinism.",
              "R-ACQ-5 R-DET-2", servers=())
           .reject("a", reason="no_servers", request_hash=7).add("s0", "s1")
           .acquire("a", request_hash=7, expect="s1"))
