"""Core benchmark: affinity_engine and its verl adapter against verl 0.9.1 and a PR #7435 class.

Theory of operation
-------------------
One recorded trace of multi-turn sessions is replayed through four implementations in the
same process, so they see the same requests in the same order:

* the trace draws turns from a universe of ``sessions`` conversations (each has 1-8
  turns) and keeps ``2 x replicas`` requests in flight: every acquire is paired with the
  release of the oldest outstanding request, so loads, ties and sticky hits look like a
  rollout step rather than an idle pool;
* ``pr7435``: PR #7435's rule as a small subclass of verl 0.9.1's real class
  (:func:`pr7435_class`, written here from the published rule, not copied): margin 2,
  ties to the first server in pool order -- the baseline every ratio is against;
* ``core``: ``affinity_engine.step`` at margin 2 with ``first`` ties, events built inside the
  timed loop, as an embedding caller builds them: with the positional builders
  ``acquire_event`` / ``release_event`` (the same validation as the keyword constructors,
  which cost ~0.4 us more per pair in the compiled build, called from Python);
* ``adapter``: ``AffinityLoadBalancer(affinity_break_margin=2, tie_break="first")``, the
  class verl would run, through its public ``acquire_server`` / ``release_server``
  (here the engine's compiled ``KeyedBalancer``, which the adapter binds in this
  configuration);
* ``verl``: verl 0.9.1's ``GlobalRequestLoadBalancer`` as it ships (no margin, seeded
  ``random.choice`` ties), for reference;
* each implementation releases the server it chose itself.

Reported per scale: microseconds of this process's CPU time per acquire+release pair
(``time.process_time``, so time spent descheduled on a shared machine does not count;
best of ``--repeat``, implementations alternate within each repeat so load spikes hit
all of them), memory per
sticky entry (``tracemalloc`` growth while placing ``fill`` new sessions, divided by the
entries created) for the core and verl, the ratios against ``pr7435`` (time) and ``verl``
(memory), which build of the core ran (``affinity_engine.BUILD``: ``pure`` or ``compiled``)
and the machine's load average before and after.

Run: ``python benchmarks/bench_core.py [--quick] [--json OUT]``; prefix with
``AFFINITY_BUILD=pure`` to time the pure source when a compiled build is installed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from typing import Any

from affinity_verl import AffinityLoadBalancer

import affinity_engine
from affinity_conformance.upstream import load_upstream_balancer, seeded_upstream_random
from affinity_engine import (
    Acquire,
    Config,
    Release,
    acquire_event,
    initial_state,
    release_event,
    step,
)

MARGIN = 2

SCALES = (
    # replicas, session universe, trace pairs, memory fill
    (16, 10_000, 40_000, 10_000),
    (256, 100_000, 40_000, 100_000),
    (4096, 100_000, 10_000, 100_000),
)

TARGETS = {  # replicas -> (core ratio, adapter ratio) upper bounds against pr7435
    16: (1.5, 1.5),  # the engine may cost at most half again the small class it replaces
    256: (0.6, 0.6),
    4096: (0.05, 0.05),  # at least 20x faster where a linear minimum scan dominates
}


def pr7435_class(base: type[Any]) -> type[Any]:
    """PR #7435's keep rule on verl 0.9.1's class: a sticky hit on an active server keeps
    its pin iff ``load[pin] <= min(loads) + margin``; otherwise it re-pins to a
    least-loaded server. Ties, for new placements too, go to the first server in pool
    order. Written from the rule in reference/upstream-verl.md section 9.1."""

    class MarginBalancer(base):  # type: ignore[misc]
        def __init__(self, servers: dict[str, Any], max_cache_size: int = 10_000,
                     full_determinism: bool = False,
                     affinity_break_margin: int | None = None) -> None:
            super().__init__(servers, max_cache_size, full_determinism)
            self._margin = affinity_break_margin
            self.affinity_kept = 0
            self.affinity_broken = 0

        def acquire_server(self, request_id: str) -> tuple[str, Any]:
            sticky, loads = self._request_id_to_server, self._inflight_requests
            if request_id in sticky:
                pinned = sticky[request_id]
                if pinned in loads:
                    margin = self._margin
                    if (margin is None or self._full_determinism
                            or loads[pinned] <= min(loads.values()) + margin):
                        self.affinity_kept += 1
                        loads[pinned] += 1
                        return pinned, self._servers[pinned]
                    self.affinity_broken += 1
                    chosen = min(loads, key=loads.__getitem__)
                    sticky[request_id] = chosen
                    loads[chosen] += 1
                    return chosen, self._servers[chosen]
                del sticky[request_id]
            if not loads or self._full_determinism:
                return super().acquire_server(request_id)  # type: ignore[no-any-return]
            chosen = min(loads, key=loads.__getitem__)
            sticky[request_id] = chosen
            loads[chosen] += 1
            return chosen, self._servers[chosen]

    return MarginBalancer


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


def _servers(replicas: int) -> dict[str, None]:
    return {f"s{i}": None for i in range(replicas)}


def _time_balancer(lb: Any, trace: list[str], window: int) -> float:
    acquire, release = lb.acquire_server, lb.release_server
    outstanding: deque[str] = deque()
    gc.collect()
    start = time.process_time()
    for rid in trace:
        outstanding.append(acquire(rid)[0])
        if len(outstanding) > window:
            release(outstanding.popleft())
    return (time.process_time() - start) / len(trace)


def run_verl(replicas: int, cache: int, trace: list[str], window: int) -> float:
    lb = load_upstream_balancer()(servers=_servers(replicas), max_cache_size=cache)
    with seeded_upstream_random(1):
        return _time_balancer(lb, trace, window)


def run_pr7435(replicas: int, cache: int, trace: list[str], window: int) -> float:
    cls = pr7435_class(load_upstream_balancer())
    lb = cls(_servers(replicas), max_cache_size=cache, affinity_break_margin=MARGIN)
    return _time_balancer(lb, trace, window)


def run_adapter(replicas: int, cache: int, trace: list[str], window: int) -> float:
    lb = AffinityLoadBalancer(_servers(replicas), max_cache_size=cache,
                              affinity_break_margin=MARGIN, tie_break="first")
    return _time_balancer(lb, trace, window)


def run_core(replicas: int, cache: int, trace: list[str], window: int) -> float:
    config = Config(max_cache_size=cache, affinity_break_margin=MARGIN)
    state = initial_state(config, list(_servers(replicas)))
    outstanding: deque[str] = deque()
    gc.collect()
    start = time.process_time()
    for rid in trace:
        t = step(config, state, acquire_event(rid))
        state = t.state
        outstanding.append(t.outcome.server_id)  # type: ignore[union-attr]
        if len(outstanding) > window:
            state = step(config, state, release_event(outstanding.popleft())).state
    return (time.process_time() - start) / len(trace)


RUNNERS: dict[str, Callable[[int, int, list[str], int], float]] = {
    "pr7435": run_pr7435, "core": run_core, "adapter": run_adapter, "verl": run_verl,
}


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


def fill_verl(replicas: int) -> Callable[[list[str]], Any]:
    def fill(ids: list[str]) -> Any:
        lb = load_upstream_balancer()(servers=_servers(replicas), max_cache_size=len(ids))
        with seeded_upstream_random(2):
            for rid in ids:
                lb.release_server(lb.acquire_server(rid)[0])
        return lb
    return fill


def fill_core(replicas: int) -> Callable[[list[str]], Any]:
    def fill(ids: list[str]) -> Any:
        config = Config(max_cache_size=len(ids), affinity_break_margin=MARGIN)
        state = initial_state(config, list(_servers(replicas)))
        for rid in ids:
            t = step(config, state, Acquire(request_id=rid))
            state = step(config, t.state, Release(server_id=t.outcome.server_id)).state  # type: ignore[union-attr]
        return state
    return fill


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f}/{five:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10x smaller traces and fills")
    parser.add_argument("--repeat", type=int, default=3, help="timing repeats (best is kept)")
    parser.add_argument("--scales", type=int, nargs="+", metavar="REPLICAS",
                        help="only these replica counts (of 16 256 4096)")
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    known = [s[0] for s in SCALES]
    for n in args.scales or ():
        if n not in known:
            parser.error(f"--scales takes replica counts among {known}, got {n}")
    shrink = 10 if args.quick else 1
    load_before = _load()
    print(f"affinity_engine build: {affinity_engine.BUILD}; Python {platform.python_version()} "
          f"on {platform.machine()}, {os.cpu_count()} CPUs; load average (1/5 min) "
          f"{load_before} at start")
    rows = []
    header = (f"{'replicas x sessions':>20} | {'pr7435 us':>9} | {'verl us':>8} | "
              f"{'core us':>8} | {'adapter us':>10} | {'core/pr':>7} | {'adapter/pr':>10} | "
              f"{'verl B/e':>8} | {'core B/e':>8} | {'mem ratio':>9}")
    print(header)
    print("-" * len(header))
    for replicas, sessions, pairs, fill in SCALES:
        if args.scales and replicas not in args.scales:
            continue
        trace = make_trace(sessions // shrink, pairs // shrink, seed=replicas)
        window = 2 * replicas
        cache = sessions // shrink
        best = dict.fromkeys(RUNNERS, float("inf"))
        for _ in range(args.repeat):
            for name, run in RUNNERS.items():
                best[name] = min(best[name], run(replicas, cache, trace, window))
        ids = [f"fill-{i}" for i in range(fill // shrink)]
        verl_mem = memory_per_entry(fill_verl(replicas), ids)
        core_mem = memory_per_entry(fill_core(replicas), ids)
        us = {k: v * 1e6 for k, v in best.items()}
        row = {"replicas": replicas, "sessions": sessions // shrink, "pairs": len(trace),
               "fill": len(ids), **{f"{k}_us": v for k, v in us.items()},
               "core_ratio": us["core"] / us["pr7435"],
               "adapter_ratio": us["adapter"] / us["pr7435"],
               "verl_bytes_per_entry": verl_mem, "core_bytes_per_entry": core_mem,
               "memory_ratio": core_mem / verl_mem,
               "targets": dict(zip(("core", "adapter"), TARGETS[replicas], strict=True))}
        rows.append(row)
        label = f"{replicas} x {sessions // shrink}"
        print(f"{label:>20} | {us['pr7435']:>9.2f} | {us['verl']:>8.2f} | {us['core']:>8.2f} | "
              f"{us['adapter']:>10.2f} | {row['core_ratio']:>7.2f} | "
              f"{row['adapter_ratio']:>10.2f} | {verl_mem:>8.0f} | {core_mem:>8.0f} | "
              f"{row['memory_ratio']:>9.2f}", flush=True)
    load_after = _load()
    print(f"load average (1/5 min) {load_after} at end")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"python": platform.python_version(), "build": affinity_engine.BUILD,
                       "margin": MARGIN, "load_before": load_before, "load_after": load_after,
                       "rows": rows}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
