"""The lockstep reads the spec's state before stepping it, never after.

A stepped state's sticky map is no longer the tip of its shared log, and the next read of
it re-derives the whole map (affinity_engine/lru.py, "a non-tip version"): O(size) per
read. The lockstep runs once per event of every conformance trace, so it must take what
it needs from the pre-state (the eviction victim, the tie draw that picks the
implementation's server) before it steps it. This counts the re-derivations while the
adapter is checked on a trace with hits, misses, evictions and ties: none in the exact
mode, and in ``any`` mode exactly one per tie the implementation broke differently from
the core's draw (that acquire is stepped again, from the pre-state, with the draw that
picks the implementation's server).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from affinity_conformance.check import Checker
from affinity_conformance.impl_loader import load_impl
from affinity_engine import BUILD, Acquire, Config, Event, Release, StickyLru

pytestmark = pytest.mark.skipif(
    BUILD == "compiled", reason="counts calls by patching a method of the pure source")


@pytest.mark.parametrize("tie_mode", ["first", "any"])
def test_the_lockstep_never_rederives_a_stepped_state(
        tie_mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]
    original = StickyLru._own

    def counted(self: StickyLru) -> Any:
        calls[0] += 1
        return original(self)

    monkeypatch.setattr(StickyLru, "_own", counted)
    impl = load_impl("affinity_verl:AffinityLoadBalancer")
    checker = Checker(impl, tie_mode=tie_mode, seed=7)
    servers = ["s0", "s1", "s2", "s3"]
    config = Config(affinity_break_margin=1, max_cache_size=6)
    rng = random.Random(16)
    events: list[Event] = []
    outstanding: list[str] = []
    for _ in range(400):  # releases name servers that hold requests, so loads move
        if outstanding and rng.random() < 0.45:
            events.append(Release(server_id=outstanding.pop(rng.randrange(len(outstanding)))))
        else:
            events.append(Acquire(request_id=f"r{rng.randrange(12)}"))
            outstanding.append(servers[rng.randrange(len(servers))])
    divergence, lockstep = checker.run(config, servers, events, "old-states")
    assert divergence is None
    assert lockstep is not None and len(lockstep.fed) == len(events)
    assert lockstep._evicted  # a cache of 6 over 12 ids evicts: the victim read ran
    if tie_mode == "first":
        assert calls[0] == 0
    else:
        # one re-derivation per acquire whose tie the adapter broke differently, no more
        assert calls[0] == lockstep.random_ties > 0
