"""Prefix-cache hits, LRU eviction and block accounting on hand-computable cases."""

from __future__ import annotations

import random

import pytest
import simpy
from affinity_sim.kvcache import KvPool
from affinity_sim.replica import QueueTracker, Replica, Request

from .test_sim_replica import model, run

BLOCK = 16


def test_lookup_stops_at_the_shared_prefix_and_never_covers_the_last_token() -> None:
    pool = KvPool(capacity_blocks=20, block_size=BLOCK)
    group, traj = -1, 0
    pool.admit(group, 2, traj, own_blocks=3)  # 2 shared prompt blocks + 3 own
    pool.release(group, 2, traj, own_blocks=3, cached_own=2)
    assert (pool.pinned, pool.evictable) == (0, 4)
    # A prompt of 80 tokens: 5 blocks, but (80 - 1) // 16 = 4 may hit: 2 shared + 2 own.
    assert pool.lookup(group, 2, traj, 80) == 4
    # A prompt of exactly 64 tokens may hit only 3 blocks (the last token is recomputed).
    assert pool.lookup(group, 2, traj, 64) == 3
    # A sibling sample (another trajectory of the group) hits only the shared prompt.
    assert pool.lookup(group, 2, 1, 80) == 2


def test_eviction_takes_the_least_recently_freed_segment_tail_first() -> None:
    pool = KvPool(capacity_blocks=10, block_size=BLOCK)
    for traj in (0, 1):  # two conversations of 4 blocks each, freed in order 0, 1
        pool.admit(-1 - traj, 0, traj, own_blocks=4)
    pool.release(-1, 0, 0, own_blocks=4, cached_own=4)
    pool.release(-2, 0, 1, own_blocks=4, cached_own=4)
    pool.admit(-3, 0, 2, own_blocks=5)  # needs 5: 2 free, then 3 evicted from trajectory 0
    assert pool.evicted_blocks == 3
    assert dict(pool.lru) == {0: 1, 1: 4}
    assert pool.lookup(-1, 0, 0, 200) == 1  # trajectory 0 keeps its first block only
    pool.grow(2)  # trajectory 2 decodes into 2 more blocks: 1 from 0, then 1 from 1
    assert pool.evicted_blocks == 5
    assert dict(pool.lru) == {1: 3}
    assert pool.pinned + pool.evictable == pool.capacity


def test_shared_prompt_segment_is_pinned_while_any_sibling_runs() -> None:
    pool = KvPool(capacity_blocks=12, block_size=BLOCK)
    pool.admit(-1, 3, 0, own_blocks=2)
    assert pool.pin_cost(-1, 3, 1, own_blocks=2) == 2  # the group is already pinned
    pool.admit(-1, 3, 1, own_blocks=2)
    assert pool.pinned == 3 + 2 + 2
    pool.release(-1, 3, 0, own_blocks=2, cached_own=1)
    assert pool.pinned == 3 + 2  # still pinned by sample 1
    pool.release(-1, 3, 1, own_blocks=2, cached_own=1)
    assert (pool.pinned, pool.evictable) == (0, 5)
    assert list(pool.lru) == [0, 1, -1]  # freed order; the group goes after its last user
    assert pool.pin_cost(-1, 3, 2, own_blocks=2) == 5


def test_multi_turn_hits_on_one_replica() -> None:
    # First turn: prompt 40, output 9 -> 49 tokens, 48 with KV: 3 full blocks cached.
    # Second turn (after a 15-token tool response): prompt 64 may hit (64 - 1) // 16 = 3 blocks.
    finished, replica = run(model(), [(0.0, 0, 40, 9), (1.0, 0, 64, 2)])
    assert (replica.query_tokens, replica.hit_tokens) == (40 + 64, 48)
    assert replica.prefill_tokens == 40 + 16
    assert replica.kv.evicted_blocks == 0
    # The second turn prefills 16 tokens (sampling token 1), then decodes token 2 alone.
    A, B = 0.010, 0.001
    assert abs(finished[0] - (1.0 + (A + 16 * B) + (A + B))) < 1e-12


def test_thrash_turns_hits_into_misses() -> None:
    # An 8-block pool. Conversation 0 leaves 3 cached blocks (48 of its 49 tokens).
    # Conversation 1 (prompt 100 -> 7 blocks) finds 5 free and evicts 2 of them; decoding
    # past 112 tokens it needs an 8th block and evicts the last one. When conversation 0
    # returns (prompt 64 -> 5 blocks) nothing of it is left, and its admission evicts 4 of
    # conversation 1's 7 cached blocks: 2 + 1 + 4 = 7 evictions, 0 hits.
    finished, replica = run(model(kv_capacity_tokens=128),
                            [(0.0, 0, 40, 9), (0.5, 1, 100, 20), (1.0, 0, 64, 2)])
    assert finished[1] < 1.0  # conversation 1 was done before conversation 0 came back
    assert (replica.query_tokens, replica.hit_tokens) == (40 + 100 + 64, 0)
    assert replica.kv.evicted_blocks == 7
    assert dict(replica.kv.lru) == {1: 3, 0: 4}  # 64 tokens + 1 sampled, 64 computed


@pytest.mark.parametrize("seed", range(20))
def test_closed_form_decode_run_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    env = simpy.Environment()
    replica = Replica(env, 0, model(kv_capacity_tokens=16 * 400), QueueTracker(1))
    for traj in range(rng.randint(1, 9)):
        request = Request(env, traj, -1 - traj, 0, rng.randint(1, 200), 10_000)
        request.own_blocks = -(-request.tokens // BLOCK)
        replica.running.append(request)
        replica._start_decoding(request)
        replica.kv.pinned += request.own_blocks
    replica.kv.pinned = min(replica.kv.pinned, replica.kv.capacity - len(replica.running))
    limit = rng.choice([5, 50, 10_000])
    got = replica._largest_fitting_run(limit)
    available = replica.kv.available
    brute = 1
    while brute < limit and replica._growth(brute + 1) <= available:
        brute += 1
    assert got == brute
