"""What ``prompt_ids`` on the acquire costs per Ray call (context band).

Theory of operation
-------------------
With ``affinity_break_tokens`` set, ``AffinityLoadBalancer.require_acquire_fields()``
returns ``["prompt_ids"]`` and verl 0.9.1's ``LLMServerClient`` then serialises the whole
prompt into every ``acquire_server`` call, although the balancer reads only its length.
This benchmark measures that price on a real local Ray cluster, through verl's own
client code (``LLMServerClient._acquire_server`` from the installed wheel, loaded without
torch by :mod:`affinity_verl.testing.verl_client`), in one run:

* ``none``: a margin-only balancer; it declares nothing, so the client sends only the
  request id (verl's default path, the baseline of every ratio);
* ``2K`` / ``20K`` / ``100K``: a band balancer; the client sends that many token ids,
  drawn uniformly from a 151,936-token vocabulary (Qwen2's), so their pickle size is
  realistic (ids >= 65,536 take 5 bytes, smaller ones 3);
* ``int`` (raw call): the band balancer called directly with one extra integer keyword
  (``prompt_len``), the transport cost of the cheaper field proposed for verl (the
  balancer ignores it today); ``none (raw call)`` is its baseline.

A client actor (``num_cpus=0``) times each awaited acquire with ``time.perf_counter``;
the release is fire-and-forget, as in verl, and not timed. Request ids cycle over 64
sessions, so almost every acquire is a sticky hit. Variants alternate in rounds (order
rotated each round) so machine noise hits all of them alike; every sample is kept and the
median and p90 are reported, with the ratio of medians to ``none``. The load average
(``os.getloadavg``) is printed at the start and the end: the machine is shared.

Run: ``RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/bench_ray_prompt_ids.py``
(about a minute on 2 cores). ``--write`` replaces the section "## prompt_ids on the
acquire (bench_ray_prompt_ids.py)" of benchmarks/README.md with the table.
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray
from affinity_verl import AffinityLoadBalancer

SERVERS = {f"10.0.0.{i}:8000": None for i in range(8)}
SESSIONS = 64
VOCAB = 151_936
SIZES = {"2K": 2_000, "20K": 20_000, "100K": 100_000}
MARGIN = {"affinity_break_margin": 1}
BAND = {**MARGIN, "affinity_break_tokens": 4096, "affinity_break_band_cap": 4}
README = Path(__file__).resolve().parent / "README.md"
SECTION = "## prompt_ids on the acquire (bench_ray_prompt_ids.py)"


def token_ids(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(count)]


class BenchClientImpl:
    """Owns one real ``LLMServerClient`` per balancer and times acquires."""

    def __init__(self, balancers: dict[str, Any]) -> None:
        from affinity_verl.testing.verl_client import load_real_llm_server_module
        from omegaconf import OmegaConf

        module = load_real_llm_server_module()
        config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
            "name": "vllm", "full_determinism": False}}})
        self._balancers = balancers
        self._clients = {name: module.LLMServerClient(config=config, load_balancer_handle=lb)
                         for name, lb in balancers.items()}
        self._prompts = {name: token_ids(n, seed=n) for name, n in SIZES.items()}

    async def _one(self, variant: str, rid: str) -> float:
        """One timed acquire (seconds) and its untimed fire-and-forget release."""
        raw = variant.endswith("(raw call)")
        balancer_name = "margin" if variant.startswith("none") else "band"
        client = self._clients[balancer_name]
        balancer = self._balancers[balancer_name]
        begin = time.perf_counter()
        if not raw:
            prompt = self._prompts.get(variant, [1, 2, 3])
            server_id, _ = await client._acquire_server(rid, prompt_ids=prompt)
        elif variant.startswith("int"):
            server_id, _ = await balancer.acquire_server.remote(
                request_id=rid, prompt_len=SIZES["100K"])
        else:
            server_id, _ = await balancer.acquire_server.remote(request_id=rid)
        elapsed = time.perf_counter() - begin
        if raw:
            balancer.release_server.remote(server_id=server_id)
        else:
            client._release_server(server_id, request_id=rid)
        return elapsed

    async def _barrier(self, variant: str) -> None:
        name = "margin" if variant.startswith("none") else "band"
        await self._balancers[name].get_total_inflight.remote()  # every release applied

    async def timed(self, variant: str, calls: int, start: int) -> list[float]:
        """``calls`` sequential acquires of ``variant``; their latencies in seconds."""
        samples = [await self._one(variant, f"session-{i % SESSIONS}")
                   for i in range(start, start + calls)]
        await self._barrier(variant)
        return samples

    async def rate(self, variant: str, calls: int, inflight: int) -> float:
        """Acquires per second with ``inflight`` concurrent callers (``calls`` in all)."""
        import asyncio

        async def caller(k: int) -> None:
            for i in range(k, calls, inflight):
                await self._one(variant, f"session-{i % SESSIONS}")

        begin = time.perf_counter()
        await asyncio.gather(*(caller(k) for k in range(inflight)))
        await self._barrier(variant)
        return calls / (time.perf_counter() - begin)


VARIANTS = ("none", "2K", "20K", "100K", "none (raw call)", "int (raw call)")
INFLIGHT = 8  # concurrent acquires for the calls/s column (one balancer actor serves all)


def measure(rounds: int, calls: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    balancers: dict[str, Any] = {
        "margin": ray.remote(AffinityLoadBalancer).options(num_cpus=0).remote(
            servers=dict(SERVERS), **MARGIN),
        "band": ray.remote(AffinityLoadBalancer).options(num_cpus=0).remote(
            servers=dict(SERVERS), **BAND),
    }
    declared = {name: ray.get(lb.require_acquire_fields.remote())
                for name, lb in balancers.items()}
    assert declared == {"margin": [], "band": ["prompt_ids"]}, declared
    client: Any = ray.remote(num_cpus=0)(BenchClientImpl).remote(balancers)
    try:
        for variant in VARIANTS:  # warm-up: field query, code paths, connections
            ray.get(client.timed.remote(variant, 5, 0))
        samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for round_index in range(rounds):
            shift = round_index % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                samples[variant] += ray.get(client.timed.remote(
                    variant, calls, round_index * calls))
                rates[variant].append(ray.get(client.rate.remote(variant, calls, INFLIGHT)))
        status = ray.get(balancers["band"].get_status.remote())
        assert status["total_inflight"] == 0, status
    finally:
        for handle in (client, *balancers.values()):
            ray.kill(handle)
    return samples, rates


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _payload(variant: str) -> str:
    if variant in SIZES:
        ids = token_ids(SIZES[variant], seed=SIZES[variant])
        return f"{len(pickle.dumps(ids, protocol=5)) / 1024:,.0f} KiB"
    if variant.startswith("int"):
        return f"{len(pickle.dumps(SIZES['100K'], protocol=5))} B"
    return "-"


def render(samples: dict[str, list[float]], rates: dict[str, list[float]],
           load_start: tuple[float, ...], load_end: tuple[float, ...], wall: float) -> str:
    base = {"client": statistics.median(samples["none"]),
            "raw": statistics.median(samples["none (raw call)"])}
    lines = [
        f"Measured by `benchmarks/bench_ray_prompt_ids.py` on {platform.machine()} "
        f"({os.cpu_count()} CPUs, shared with other jobs), Python "
        f"{platform.python_version()}, Ray {ray.__version__}, verl 0.9.1's "
        f"`LLMServerClient`; {wall:.0f} s in one run; load average (1/5/15 min) "
        f"{'/'.join(f'{x:.1f}' for x in load_start)} at the start, "
        f"{'/'.join(f'{x:.1f}' for x in load_end)} at the end. "
        f"{len(samples['none'])} timed sequential acquires per variant; calls/s is the "
        f"median (min-max) over the rounds with {INFLIGHT} acquires in flight. Ratios are "
        "medians against `none` (client rows) or `none (raw call)` (raw rows); latency: "
        "lower is better, calls/s: higher is better.",
        "",
        "| Variant | sent with the acquire | pickled size | median µs | p90 µs | latency "
        f"ratio | calls/s, {INFLIGHT} in flight | calls/s ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    sent = {"none": "request id only (verl's default)",
            "2K": "2,000 prompt ids", "20K": "20,000 prompt ids",
            "100K": "100,000 prompt ids",
            "none (raw call)": "request id only",
            "int (raw call)": "request id + one int (`prompt_len`)"}
    for variant in VARIANTS:
        values = samples[variant]
        median = statistics.median(values)
        baseline = "none (raw call)" if variant.endswith("(raw call)") else "none"
        ratio = median / base["raw" if variant.endswith("(raw call)") else "client"]
        rate = statistics.median(rates[variant])
        rate_ratio = rate / statistics.median(rates[baseline])
        lines.append(f"| {variant} | {sent[variant]} | {_payload(variant)} | "
                     f"{median * 1e6:,.0f} | {_percentile(values, 0.9) * 1e6:,.0f} | "
                     f"{ratio:.2f} | {rate:,.0f} ({min(rates[variant]):,.0f}-"
                     f"{max(rates[variant]):,.0f}) | {rate_ratio:.2f} |")
    return "\n".join(lines) + "\n"


def write_section(table: str) -> None:
    text = README.read_text(encoding="utf-8")
    start = text.find(SECTION)
    if start < 0:
        raise SystemExit(f"{README}: no section {SECTION!r}; add it first")
    body_start = start + len(SECTION) + 1
    end = text.find("\n## ", body_start)
    end = len(text) if end < 0 else end + 1
    marker = "<!-- table -->"
    section = text[body_start:end]
    if section.count(marker) != 2:
        raise SystemExit(f"{README}: section {SECTION!r} needs two {marker} lines")
    before, _, rest = section.partition(marker)
    _, _, after = rest.partition(marker)
    new = before + marker + "\n" + table + marker + after
    README.write_text(text[:body_start] + new + text[end:], encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=40, help="acquires per round and variant")
    parser.add_argument("--write", action="store_true",
                        help="replace the table in benchmarks/README.md")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    began = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024,
             log_to_driver=False)
    try:
        samples, rates = measure(args.rounds, args.calls)
    finally:
        ray.shutdown()
    table = render(samples, rates, load_start, os.getloadavg(), time.monotonic() - began)
    sys.stdout.write(table)
    if args.write:
        write_section(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
