"""Tie-breaking among the least-loaded servers: first, draw and hashed (R-TIE-1..4).

Expected servers are computed here from the spec's definitions (pool-order tie set, an
index into it, CRC-32 via ``zlib`` directly), never by calling the core's helpers.
"""

from __future__ import annotations

import zlib

import pytest

from affinity_engine import stable_hash

from .driver import Run


def crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def test_tie_set_is_the_minimum_servers_in_pool_order() -> None:
    """R-TIE-1, R-REL-1: the tie set follows pool order, also after a re-add."""
    run = Run().acquire(None, expect="s0").remove("s1").add("s1")
    assert run.servers == ("s0", "s2", "s1")
    assert run.state.pool.least_loaded_all() == ("s2", "s1")
    assert run.allowed("x") == {"s1", "s2"}


def test_first_takes_index_zero() -> None:
    """R-TIE-2: first picks the first tied server; the draw is ignored."""
    run = Run().acquire("a", expect="s0")
    run.acquire("b", expect="s1", tie_draw=1).acquire("c", expect="s2", tie_draw=7)


@pytest.mark.parametrize(("draw", "idle_pick", "pick_of_two"),
                         [(0, "s0", "s1"), (1, "s1", "s2"), (4, "s1", "s1"), (5, "s2", "s2")])
def test_draw_takes_index_draw_mod_ties(draw: int, idle_pick: str, pick_of_two: str) -> None:
    """R-TIE-3: index tie_draw mod t: of 3 idle servers, then of the 2 left at zero."""
    Run.of(tie_break="draw").acquire("x", tie_draw=draw, expect=idle_pick)
    run = Run.of(tie_break="draw").acquire(None, expect="s0", tie_draw=0)
    run.acquire("y", tie_draw=draw, expect=pick_of_two)


def test_draw_after_re_add_follows_pool_order() -> None:
    """R-TIE-3, R-POOL-1: after remove/re-add of s0 the idle ties are (s1, s2, s0)."""
    run = Run.of(tie_break="draw").remove("s0").add("s0")
    run.acquire("x", tie_draw=2, expect="s0")


@pytest.mark.parametrize("rid", [f"h{i}" for i in range(8)])
def test_hashed_takes_crc32_mod_ties(rid: str) -> None:
    """R-TIE-4, R-HASH-1: index crc32(rid) mod t over the tie set; tie_draw is ignored."""
    Run.of(tie_break="hashed").acquire(rid, tie_draw=1, expect=f"s{crc(rid) % 3}")
    run = Run.of(tie_break="hashed").acquire(None, tie_draw=0, expect="s0")
    run.acquire(rid, tie_draw=1, expect=("s1", "s2")[crc(rid) % 2])


def test_hashed_unkeyed_falls_back_to_the_draw() -> None:
    """R-TIE-4, R-ACQ-8: an unkeyed request has no id to hash: the draw decides."""
    run = Run.of(tie_break="hashed")
    run.acquire(None, tie_draw=2, expect="s2").acquire(None, tie_draw=1, expect="s1")


def test_hashed_spreads_new_sessions_where_first_avalanches() -> None:
    """R-TIE-4, R-HAZ-1: 64 sessions, each released before the next, on 4 idle servers:
    hashed uses all four, first puts all 64 on s0."""
    servers = ("s0", "s1", "s2", "s3")
    used: dict[str, set[str]] = {}
    for mode in ("hashed", "first"):
        run = Run.of(servers, tie_break=mode)
        for i in range(64):
            rid = f"session-{i}"
            expected = servers[crc(rid) % 4] if mode == "hashed" else "s0"
            run.acquire(rid, expect=expected, path="new").release(expected, result="applied")
        used[mode] = {sid for _, sid in run.lru}
    assert used == {"hashed": set(servers), "first": {"s0"}}


def test_stable_hash_is_crc32_of_utf8() -> None:
    """R-HASH-1: the CRC-32 check value, and UTF-8 (not Latin-1) bytes for non-ASCII."""
    assert stable_hash("123456789") == 0xCBF43926
    assert stable_hash("") == 0
    assert stable_hash("é") == zlib.crc32(b"\xc3\xa9") != zlib.crc32(b"\xe9")
