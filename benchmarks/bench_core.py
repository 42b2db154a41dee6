"""Core benchmark: affinity_core.step against verl 0.9.1's real GlobalRequestLoadBalancer.

Theory of operation
-------------------
One recorded trace of multi-turn sessions is replayed through both implementations in
the same process, so they see the same requests in the same order:

* the trace draws turns from a universe of ``sessions`` conversations (each has 1-8
  turns) and keeps ``2 x replicas`` requests in flight: every acquire is paired with the
  release of the oldest outstanding request, so loads, ties and sticky hits look like a
  rollout step rather than an idle pool;
* upstream runs as verl ships it (``random.choice`` ties, seeded); the core runs in
  ``draw`` tie mode with draws from a seeded ``random.Random``, built into events the way
  an adapter builds them -- event construction and the draw are inside the timed loop;
* each implementation releases the server it chose itself.

Reported per scale: microseconds per acquire+release pair (best of ``--repeat``), memory
per sticky entry (``tracemalloc`` growth while placing ``fill`` new sessions, divided by
the entries created), and the ratio core/upstream for both. Scales: 16 x 10k, 256 x 100k
and 4096 x 1M sessions (the last with a shorter trace, and a 200k-entry fill for memory
because upstream's O(replicas) scan makes a 1M fill take minutes).

Run: ``python benchmarks/bench_core.py [--quick] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from typing import Any

from affinity_conformance.upstream import load_upstream_balancer, seeded_upstream_random
from affinity_core import Acquire, Config, Release, initial_state, step

SCALES = (
    # replicas, session universe, trace pairs, memory fill
    (16, 10_000, 40_000, 10_000),
    (256, 100_000, 40_000, 100_000),
    (4096, 1_000_000, 10_000, 200_000),
)


def make_trace(sessions: int, pairs: int, seed: int) -> list[str]:
    """Request ids in arrival order: interleaved multi-turn sessions."""
    rng = random.Random(seed)
    live: list[list[Any]] = []
    next_session = 0
    out: list[str] = []
    while len(out) < pairs:
        if next_session < sessions and (not live or rng.random() < 0.3):
            live.append([f"conv-{next_session}", rng.randint(1, 8)])
            next_session += 1
        i = rng.randrange(len(live))
        rid, left = live[i]
        out.append(rid)
        if left == 1:
            live[i] = live[-1]
            live.pop()
        else:
            live[i][1] = left - 1
    return out


def run_upstream(replicas: int, cache: int, trace: list[str], window: int) -> float:
    cls = load_upstream_balancer()
    lb = cls(servers={f"s{i}": None for i in range(replicas)}, max_cache_size=cache)
    acquire, release = lb.acquire_server, lb.release_server
    outstanding: deque[str] = deque()
    with seeded_upstream_random(1):
        gc.collect()
        start = time.perf_counter()
        for rid in trace:
            outstanding.append(acquire(rid)[0])
            if len(outstanding) > window:
                release(outstanding.popleft())
        elapsed = time.perf_counter() - start
    return elapsed / len(trace)


def run_core(replicas: int, cache: int, trace: list[str], window: int) -> float:
    config = Config(max_cache_size=cache, tie_break="draw")
    state = initial_state(config, [f"s{i}" for i in range(replicas)])
    draw = random.Random(1).getrandbits
    outstanding: deque[str] = deque()
    gc.collect()
    start = time.perf_counter()
    for rid in trace:
        t = step(config, state, Acquire(request_id=rid, tie_draw=draw(32)))
        state = t.state
        outstanding.append(t.outcome.server_id)  # type: ignore[union-attr]
        if len(outstanding) > window:
            state = step(config, state, Release(server_id=outstanding.popleft())).state
    elapsed = time.perf_counter() - start
    return elapsed / len(trace)


def memory_per_entry(fill: Callable[[list[str]], Any], ids: list[str]) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    keep = fill(ids)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del keep
    return (after - before) / len(ids)


def fill_upstream(replicas: int) -> Callable[[list[str]], Any]:
    def fill(ids: list[str]) -> Any:
        lb = load_upstream_balancer()(
            servers={f"s{i}": None for i in range(replicas)}, max_cache_size=len(ids))
        with seeded_upstream_random(2):
            for rid in ids:
                lb.release_server(lb.acquire_server(rid)[0])
        return lb
    return fill


def fill_core(replicas: int) -> Callable[[list[str]], Any]:
    def fill(ids: list[str]) -> Any:
        config = Config(max_cache_size=len(ids), tie_break="draw")
        state = initial_state(config, [f"s{i}" for i in range(replicas)])
        draw = random.Random(2).getrandbits
        for rid in ids:
            t = step(config, state, Acquire(request_id=rid, tie_draw=draw(32)))
            state = step(config, t.state, Release(server_id=t.outcome.server_id)).state  # type: ignore[union-attr]
        return state
    return fill


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10x smaller traces and fills")
    parser.add_argument("--repeat", type=int, default=3, help="timing repeats (best is kept)")
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    shrink = 10 if args.quick else 1
    rows = []
    header = (f"{'replicas x sessions':>20} | {'upstream us/pair':>16} | {'core us/pair':>12} | "
              f"{'time ratio':>10} | {'upstream B/entry':>16} | {'core B/entry':>12} | "
              f"{'mem ratio':>9}")
    print(header)
    print("-" * len(header))
    for replicas, sessions, pairs, fill in SCALES:
        trace = make_trace(sessions // shrink, pairs // shrink, seed=replicas)
        window = 2 * replicas
        cache = sessions // shrink
        up = min(run_upstream(replicas, cache, trace, window) for _ in range(args.repeat))
        core = min(run_core(replicas, cache, trace, window) for _ in range(args.repeat))
        ids = [f"fill-{i}" for i in range(fill // shrink)]
        up_mem = memory_per_entry(fill_upstream(replicas), ids)
        core_mem = memory_per_entry(fill_core(replicas), ids)
        row = {"replicas": replicas, "sessions": sessions // shrink, "pairs": len(trace),
               "fill": len(ids), "upstream_us": up * 1e6, "core_us": core * 1e6,
               "time_ratio": core / up, "upstream_bytes_per_entry": up_mem,
               "core_bytes_per_entry": core_mem, "memory_ratio": core_mem / up_mem}
        rows.append(row)
        label = f"{replicas} x {sessions // shrink}"
        print(f"{label:>20} | {up * 1e6:>16.2f} | {core * 1e6:>12.2f} | {core / up:>10.2f} | "
              f"{up_mem:>16.0f} | {core_mem:>12.0f} | {core_mem / up_mem:>9.2f}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"python": sys.version.split()[0], "rows": rows}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
