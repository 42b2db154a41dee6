"""Sticky-map benchmark: StickyLru's operations against verl's cachetools.LRUCache.

Theory of operation
-------------------
verl 0.9.1 keeps its sticky map in a ``cachetools.LRUCache`` and mutates it in place;
the core keeps a persistent :class:`affinity_core.StickyLru` and gets a new map from every
write. This script times, in one process and on the same keys, the four operations the
core's hot path uses, each against the LRUCache operation that does the same thing:

* ``touch`` of a random present key (a sticky hit): ``cache[key]`` (a lookup refreshes);
* ``put`` of a new key into a full map (an eviction): ``cache[key] = server``;
* ``peek`` (``lru.peek(key)``, no refresh): ``cache.peek(key)`` is not there, so the
  baseline is ``key in cache``, which does not refresh either; and ``key in lru``.

Each is the best of ``--repeat`` runs of ``--ops`` operations on a map of ``--entries``
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
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from cachetools import LRUCache

import affinity_core
from affinity_core import StickyLru


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
    print(f"affinity_core build: {affinity_core.BUILD}; Python {platform.python_version()}; "
          f"{args.entries} entries, {args.ops} ops, best of {args.repeat}; "
          f"load average (1/5 min) {load_before} -> {load_after}")
    print("ns per operation (Python loop included; 'loop' alone is "
          f"{result['loop']:.0f} ns)")
    for op, base in (("touch", "verl_touch"), ("put_evict", "verl_put_evict"),
                     ("in", "verl_in"), ("peek", "verl_in")):
        print(f"  {op:10s} StickyLru {result[op]:7.0f}   LRUCache {result[base]:7.0f}   "
              f"ratio {result[op] / result[base]:5.2f}")
    if args.json:
        record: dict[str, Any] = {"build": affinity_core.BUILD, "entries": args.entries,
                                  "ops": args.ops, "repeat": args.repeat,
                                  "load_before": load_before, "load_after": load_after,
                                  "ns": {k: round(v, 1) for k, v in result.items()}}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
