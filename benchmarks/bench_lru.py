"""Sticky-map benchmark: StickyLru's operations against verl's cachetools.LRUCache.

Theory of operation
-------------------
verl 0.9.1 keeps its sticky map in a ``cachetools.LRUCache`` and mutates it in place;
the core keeps a persistent :class:`affinity_engine.StickyLru` and gets a new map from every
write. This script times, in one process and on the same keys, the four operations the
core's hot path uses, each against the LRUCache operation that does the same thing:

* ``touch`` of a random present key (a sticky hit): ``cache[key]`` (a lookup refreshes);
* ``put`` of a new key into a full map (an eviction): ``cache[key] = server``;
* ``peek`` (``lru.peek(key)``, no refresh): ``cache.peek(key)`` is not there, so the
  baseline is ``key in cache``, which does not refresh either; and ``key in lru``.

Then, for context, a whole sticky hit through the core: ``step`` of a kept hit on a
random key of a 16-server state with ``--entries`` pins plus the ``step`` of its release
(``kept_pair``), against PR #7435's class (benchmarks/bench_core.py's ``pr7435_class``
on verl 0.9.1's) doing the same acquire and release (``pr7435_kept_pair``).

Memory (``tracemalloc``, bytes per entry): the growth while ``--entries`` keys are put
(``mem_after_puts``) and the peak, sampled every 500 operations, over ``3 x --entries``
random touches after that (``mem_touching``): superseded records stay in the map's log
until it is compacted, so the second is the steady-state cost. The LRUCache gets the same
puts and touches.

Each time is the best of ``--repeat`` runs of ``--ops`` operations on a map of ``--entries``
entries, in nanoseconds of this process's CPU time per operation (``time.process_time``),
including the Python loop that drives it (``loop`` is that loop alone). The touch and put
runs start from the same map every repeat; for the persistent map that is an old version
after the first repeat, so its first write re-derives a private copy (once per repeat).

Run: ``python benchmarks/bench_lru.py [--json OUT]`` times the installed build;
prefix ``AFFINITY_BUILD=pure`` for the source, or put a compiled build first on
``PYTHONPATH`` (benchmarks/README.md, "Builds").
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import platform
import random
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from cachetools import LRUCache

import affinity_engine
from affinity_conformance.upstream import load_upstream_balancer
from affinity_engine import (
    Config,
    StickyLru,
    acquire_event,
    initial_state,
    release_event,
    step,
)


def _best(run: Callable[[], object], ops: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best / ops * 1e9


def measure(entries: int, ops: int, repeat: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    keys = [f"req-{i:07d}-{rng.randrange(10**9)}" for i in range(entries)]
    servers = [f"http://10.0.0.{i}:8000" for i in range(16)]
    items = tuple((k, servers[i % 16]) for i, k in enumerate(keys))
    hits = [rng.choice(keys) for _ in range(ops)]
    fresh = [f"new-{i}" for i in range(ops)]
    lru = StickyLru.from_items(entries, items)
    cache: LRUCache[str, str] = LRUCache(maxsize=entries)
    for key, server in items:
        cache[key] = server

    def loop() -> None:
        for _ in hits:
            pass

    def lru_touch() -> None:
        m = lru
        for key in hits:
            m = m.touch(key)

    def lru_put() -> None:
        m = lru
        for key in fresh:
            m = m.put(key, "s")

    def lru_peek() -> None:
        for key in hits:
            lru.peek(key)

    def lru_in() -> None:
        for key in hits:
            _ = key in lru

    def cache_touch() -> None:
        for key in hits:
            _ = cache[key]

    def cache_put() -> None:  # a copy per repeat, so every put evicts
        c: LRUCache[str, str] = LRUCache(maxsize=entries)
        c.update(cache)
        start = time.process_time()
        for key in fresh:
            c[key] = "s"
        cache_put_time.append(time.process_time() - start)

    def cache_in() -> None:
        for key in hits:
            _ = key in cache

    cache_put_time: list[float] = []
    out = {name: _best(run, ops, repeat) for name, run in (
        ("loop", loop), ("touch", lru_touch), ("verl_touch", cache_touch),
        ("put_evict", lru_put), ("peek", lru_peek), ("in", lru_in),
        ("verl_in", cache_in))}
    for _ in range(repeat):
        cache_put()
    out["verl_put_evict"] = min(cache_put_time) / ops * 1e9
    out.update(_kept_pairs(keys, hits, repeat))
    out.update(_memory(entries, seed))
    return out


def _memory(entries: int, seed: int) -> dict[str, float]:
    """Bytes per entry after the puts, and the peak while touching (module docstring)."""
    rng = random.Random(seed)
    keys = [f"mem-{i:07d}-{rng.randrange(10**9)}" for i in range(entries)]
    touches = [rng.choice(keys) for _ in range(3 * entries)]
    servers = [f"http://10.0.0.{i}:8000" for i in range(16)]  # shared, as pool ids are
    out: dict[str, float] = {}
    for name in ("lru", "verl"):
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        holder: list[Any] = []
        if name == "lru":
            m = StickyLru(entries)
            for i, key in enumerate(keys):
                m = m.put(key, servers[i % 16])
        else:
            cache: LRUCache[str, str] = LRUCache(maxsize=entries)
            for i, key in enumerate(keys):
                cache[key] = servers[i % 16]
        out[f"{name}_mem_after_puts"] = (tracemalloc.get_traced_memory()[0] - base) / entries
        peak = 0
        for n, key in enumerate(touches):
            if name == "lru":
                m = m.touch(key)
            else:
                _ = cache[key]
            if n % 500 == 0:
                peak = max(peak, tracemalloc.get_traced_memory()[0])
        out[f"{name}_mem_touching"] = (peak - base) / entries
        tracemalloc.stop()
        holder.clear()
    return out


def _kept_pairs(keys: list[str], hits: list[str], repeat: int) -> dict[str, float]:
    """Kept sticky hits on random keys, acquire + release, core ``step`` vs PR #7435."""
    servers = {f"http://10.0.0.{i}:8000": None for i in range(16)}
    config = Config(max_cache_size=len(keys), affinity_break_margin=2)
    state = initial_state(config, list(servers))
    # bench_core sits beside this script (sys.path[0] when it is run as a script)
    pr7435_class = importlib.import_module("bench_core").pr7435_class
    pr = pr7435_class(load_upstream_balancer())(servers=servers, max_cache_size=len(keys),
                                                affinity_break_margin=2)
    for rid in keys:  # pin every key; every load goes back to 0
        t = step(config, state, acquire_event(rid))
        state = step(config, t.state, release_event(t.outcome.server_id)).state  # type: ignore[union-attr]
        pr.release_server(pr.acquire_server(rid)[0])
    holder = [state]

    def core() -> None:
        s = holder[0]
        for rid in hits:
            t = step(config, s, acquire_event(rid))
            s = step(config, t.state, release_event(t.outcome.server_id)).state  # type: ignore[union-attr]
        holder[0] = s  # go on from the newest state: no re-derivation between repeats

    def baseline() -> None:
        for rid in hits:
            pr.release_server(pr.acquire_server(rid)[0])

    out = {"kept_pair": _best(core, len(hits), repeat),
           "pr7435_kept_pair": _best(baseline, len(hits), repeat)}
    assert holder[0].affinity_kept >= len(hits) and holder[0].affinity_broken == 0
    return out


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f}/{five:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args(argv)
    for name in ("entries", "ops", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    load_before = _load()
    result = measure(args.entries, args.ops, args.repeat, args.seed)
    load_after = _load()
    print(f"affinity_engine build: {affinity_engine.BUILD}; Python {platform.python_version()}; "
          f"{args.entries} entries, {args.ops} ops, best of {args.repeat}; "
          f"load average (1/5 min) {load_before} -> {load_after}")
    print("ns per operation (Python loop included; 'loop' alone is "
          f"{result['loop']:.0f} ns)")
    for op, base in (("touch", "verl_touch"), ("put_evict", "verl_put_evict"),
                     ("in", "verl_in"), ("peek", "verl_in")):
        print(f"  {op:10s} StickyLru {result[op]:7.0f}   LRUCache {result[base]:7.0f}   "
              f"ratio {result[op] / result[base]:5.2f}")
    print(f"  kept hit, acquire+release: core step {result['kept_pair']:7.0f}   "
          f"PR #7435 class {result['pr7435_kept_pair']:7.0f}   "
          f"ratio {result['kept_pair'] / result['pr7435_kept_pair']:5.2f}")
    print(f"  bytes per entry after the puts: StickyLru {result['lru_mem_after_puts']:.0f}, "
          f"LRUCache {result['verl_mem_after_puts']:.0f}; peak while touching: StickyLru "
          f"{result['lru_mem_touching']:.0f}, LRUCache {result['verl_mem_touching']:.0f}")
    if args.json:
        record: dict[str, Any] = {"build": affinity_engine.BUILD, "entries": args.entries,
                                  "ops": args.ops, "repeat": args.repeat,
                                  "load_before": load_before, "load_after": load_after,
                                  "ns": {k: round(v, 1) for k, v in result.items()}}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
