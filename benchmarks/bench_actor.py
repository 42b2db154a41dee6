"""Actor benchmark: ``AffinityLoadBalancer`` vs verl 0.9.1's ``GlobalRequestLoadBalancer``.

Theory of operation
-------------------
Both classes run as Ray actors exactly as verl creates them (``ray.remote(cls)``, default
options), on one local cluster, in one run, on the same workload: 8 servers, request ids
drawn from 256 sessions (mostly sticky hits, as in multi-turn rollout). Measured:

1. **acquire RPC latency** -- the driver times ``ray.get(lb.acquire_server.remote(rid))``
   one call at a time (the release that follows is not timed); median and p99. The
   variants alternate in rounds so machine noise hits all of them alike.
2. **calls per second** with 1, 4 and 8 concurrent client actors, each sending awaited
   acquires and fire-and-forget releases (verl's pattern, via
   :class:`affinity_verl.testing.load.SessionClient`) until a final awaited barrier.
3. **in-process cost per decision** (no Ray): one acquire+release pair on the plain class,
   including the decision log's write of two records, with about 256, 1,256 and 10,000
   sticky entries (the periodic full-state digest of the log is linear in them).

Variants: ``verl`` (upstream class, loaded from the wheel without torch), ``affinity``
(our defaults: verl's routing), ``affinity+log`` (decision log on). Ratios are
affinity / verl. ``--write`` replaces the "## Actor (bench_actor.py)" section of
benchmarks/README.md with the table; other sections are left alone.

Run: ``RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/bench_actor.py [--write]``
(about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray
from affinity_verl import AffinityLoadBalancer
from affinity_verl.testing.load import SessionClient

from affinity_conformance.upstream import load_upstream_balancer
from affinity_runtime.decision_log import DecisionLogWriter

SERVERS = {f"10.0.0.{i}:8000": None for i in range(8)}
SESSIONS = 256
README = Path(__file__).resolve().parent / "README.md"
SECTION = "## Actor (bench_actor.py)"

Factory = Callable[[], Any]


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _actor_factories(log_dir: Path) -> dict[str, Factory]:
    upstream_cls = load_upstream_balancer()
    counter = iter(range(1_000_000))
    return {
        "verl": lambda: ray.remote(upstream_cls).remote(servers=dict(SERVERS)),
        "affinity": lambda: ray.remote(AffinityLoadBalancer).remote(servers=dict(SERVERS)),
        "affinity+log": lambda: ray.remote(AffinityLoadBalancer).remote(
            servers=dict(SERVERS), decision_log=str(log_dir / f"lb-{next(counter)}.ndjson")),
    }


def measure_latency(actors: dict[str, Any], calls: int, rounds: int) -> dict[str, list[float]]:
    rng = random.Random(0)
    samples: dict[str, list[float]] = {name: [] for name in actors}
    for round_index in range(rounds):
        order = list(actors) if round_index % 2 == 0 else list(reversed(actors))
        for name in order:
            lb = actors[name]
            for _ in range(calls // rounds):
                rid = f"session-{rng.randrange(SESSIONS)}"
                started = time.perf_counter()
                server_id, _ = ray.get(lb.acquire_server.remote(request_id=rid))
                samples[name].append(time.perf_counter() - started)
                ray.get(lb.release_server.remote(server_id=server_id))
    return samples


def measure_throughput(
    actors: dict[str, Any], workers: list[Any], levels: tuple[int, ...], pairs: int, rounds: int
) -> dict[tuple[str, int], list[float]]:
    """Calls/s per (variant, clients), one sample per round; variants alternate."""
    rates: dict[tuple[str, int], list[float]] = {}
    for round_index in range(rounds):
        for clients in levels:
            names = list(actors) if round_index % 2 == 0 else list(reversed(actors))
            per_client = max(100, pairs // clients)
            for name in names:
                active = workers[:clients]
                ray.get([w.run.remote(10, SESSIONS // clients, 1, 0.0, actors[name])
                         for w in active])  # switch to this balancer and warm up
                started = time.perf_counter()
                ray.get([w.run.remote(per_client, SESSIONS // clients, 1, 0.0) for w in active])
                elapsed = time.perf_counter() - started
                rates.setdefault((name, clients), []).append(2 * clients * per_client / elapsed)
    return rates


def _filled_balancers(log_dir: Path, entries: int) -> dict[str, Any]:
    upstream_cls = load_upstream_balancer()
    out: dict[str, Any] = {}
    for name in ("verl", "affinity", "affinity+log"):
        lb: Any = (upstream_cls(servers=dict(SERVERS)) if name == "verl"
                   else AffinityLoadBalancer(dict(SERVERS), seed=0))
        for i in range(entries):  # fill the sticky map, leaving the pool idle
            server_id, _ = lb.acquire_server(f"filler-{i}")
            lb.release_server(server_id)
        if name == "affinity+log":
            # Attach the log after the fill (filling through the log would take minutes
            # at 10,000 entries); what follows is exactly what decision_log=... does.
            writer = DecisionLogWriter(log_dir / f"inproc-{entries}.ndjson")
            lb._driver.attach_log(writer, configured=SERVERS, warm=False)
        out[name] = lb
    return out


def measure_in_process(log_dir: Path, entries: int, rounds: int = 7,
                       batch_s: float = 0.1) -> dict[str, float]:
    """Microseconds per acquire+release pair with ``entries`` filler entries (plus up to
    ``SESSIONS`` session entries) in the sticky map; ``sticky_entries`` reports the total.

    Variants alternate in short batches; the fastest batch counts (the least disturbed
    by other jobs on a shared machine).
    """
    balancers = _filled_balancers(log_dir, entries)
    rng = random.Random(1)
    rids = [f"session-{rng.randrange(SESSIONS)}" for _ in range(4096)]
    best = dict.fromkeys(balancers, float("inf"))
    for round_index in range(rounds):
        names = list(balancers) if round_index % 2 == 0 else list(reversed(balancers))
        for name in names:
            lb = balancers[name]
            done, started = 0, time.perf_counter()
            while done < 5 or (time.perf_counter() - started < batch_s and done < len(rids)):
                server_id, _ = lb.acquire_server(rids[done])
                lb.release_server(server_id)
                done += 1
            best[name] = min(best[name], (time.perf_counter() - started) / done * 1e6)
    best["sticky_entries"] = balancers["affinity"].get_status()["sticky_entries"]
    return best


def render(latency: dict[str, list[float]], throughput: dict[tuple[str, int], list[float]],
           in_process: dict[int, dict[str, float]], wall: float,
           load: tuple[float, float]) -> str:
    names = list(latency)
    lines = [
        SECTION,
        "",
        f"Measured by `benchmarks/bench_actor.py` on {platform.machine()} "
        f"({os.cpu_count()} CPUs, shared with other jobs), Python "
        f"{platform.python_version()}, Ray {ray.__version__}; {wall:.0f} s in one run; 1-minute "
        f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end. "
        "`verl` is verl 0.9.1's `GlobalRequestLoadBalancer` from the wheel; `affinity` is "
        "`AffinityLoadBalancer` with verl's defaults; `affinity+log` adds the decision log. "
        "Ratios are affinity / verl (latency: lower is better; calls/s: higher is better).",
        "",
        "| Metric | " + " | ".join(names) + " | affinity / verl | affinity+log / verl |",
        "|---|" + "---:|" * (len(names) + 2),
    ]

    def row(label: str, values: dict[str, float], fmt: str,
            spread: dict[str, list[float]] | None = None) -> None:
        base = values["verl"]
        cells = [format(values[n], fmt) for n in names]
        if spread is not None:
            cells = [f"{c} ({min(spread[n]):{fmt}}–{max(spread[n]):{fmt}})"
                     for c, n in zip(cells, names, strict=True)]
        ratios = [f"{values['affinity'] / base:.2f}", f"{values['affinity+log'] / base:.2f}"]
        lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")

    row("acquire RPC median (ms)",
        {n: statistics.median(s) * 1e3 for n, s in latency.items()}, ".3f")
    row("acquire RPC p99 (ms)", {n: _percentile(s, 0.99) * 1e3 for n, s in latency.items()}, ".3f")
    for clients in sorted({k for _, k in throughput}):
        row(f"calls/s, {clients} client{'s' if clients > 1 else ''}",
            {n: statistics.median(throughput[(n, clients)]) for n in names}, ".0f",
            {n: throughput[(n, clients)] for n in names})
    for _, values in sorted(in_process.items()):
        row(f"in-process µs per acquire+release, {values['sticky_entries']:,.0f} sticky entries",
            values, ".1f")
    lines.append("")
    lines.append("| Decision log, cost per decision | " + " | ".join(
        f"{v['sticky_entries']:,.0f} sticky entries" for _, v in sorted(in_process.items()))
        + " |")
    lines.append("|---|" + "---:|" * len(in_process))
    lines.append("| µs per logged event (in-process) | " + " | ".join(
        f"{(v['affinity+log'] - v['affinity']) / 2:.0f}" for _, v in sorted(in_process.items()))
        + " |")
    ratio = statistics.median(latency["affinity"]) / statistics.median(latency["verl"])
    lines += [
        "",
        "Target: median acquire RPC latency within 10% of verl's class -- "
        + ("**met**" if ratio <= 1.10 else "**not met**") + f" ({ratio:.2f}x). The Ray round "
        "trip dominates: the in-process rows show the CPU each decision costs on its own.",
        "",
        f"Latency: {len(latency['verl'])} sequential driver calls per variant, alternating "
        "variants in rounds. Calls/s: median (min–max) of rounds; in each, awaited acquires plus "
        "fire-and-forget releases from N client actors until a final awaited barrier. "
        "The in-process rows are the CPU cost of one acquire+release pair without Ray "
        "(fastest of 7 alternating batches). The decision log's cost per logged event is "
        "half the difference between the affinity+log and affinity columns: every record "
        "carries the event, the outcome and a constant-size state summary; a SHA-256 digest "
        "of the whole state (linear in the sticky map) is added on each file's first record "
        "and every 1,024 records, so its cost is amortized.",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    existing = README.read_text(encoding="utf-8") if README.exists() else "# Benchmarks\n\n"
    start = existing.find(SECTION)
    if start < 0:
        updated = existing.rstrip("\n") + "\n\n" + text
    else:
        end = existing.find("\n## ", start + len(SECTION))
        tail = "" if end < 0 else existing[end + 1:]
        updated = existing[:start] + text + ("\n" + tail if tail else "")
    README.write_text(updated, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--latency-calls", type=int, default=1500)
    parser.add_argument("--pairs", type=int, default=800,
                        help="acquire/release pairs per calls/s sample, split over the clients")
    parser.add_argument("--rounds", type=int, default=5, help="calls/s samples per cell")
    parser.add_argument("--write", action="store_true", help="update benchmarks/README.md")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024,
             log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            log_dir = Path(tmp)
            factories = _actor_factories(log_dir)
            actors = {name: make() for name, make in factories.items()}
            ray.get([a.get_status.remote() for a in actors.values()])
            measure_latency(actors, 150, 1)  # warm up
            latency = measure_latency(actors, args.latency_calls, rounds=6)
            workers = [SessionClient.remote(None, f"c{i}", seed=i) for i in range(8)]
            throughput = measure_throughput(actors, workers, (1, 4, 8), args.pairs, args.rounds)
            for (name, clients), rates in sorted(throughput.items()):
                print(f"  calls/s {name:13s} {clients} clients: "
                      + " ".join(f"{r:.0f}" for r in rates), file=sys.stderr)
            for actor in [*workers, *actors.values()]:
                ray.kill(actor)
            in_process = {n: measure_in_process(log_dir, n) for n in (0, 1000, 10000)}
    finally:
        ray.shutdown()
    text = render(latency, throughput, in_process, time.perf_counter() - started,
                  (load_at_start, os.getloadavg()[0]))
    print(text)
    if args.write:
        write_section(text)
        print(f"wrote {README}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
