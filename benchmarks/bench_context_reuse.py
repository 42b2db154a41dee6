"""What ``affinity serve --context-reuse`` costs: router CPU per request, option off vs on.

Theory of operation
-------------------
One ``affinity_vllm.stub`` backend (no delay, 64 batch slots) and, in turn, routers
started as separate processes with the same band options (margin 2, T = 100, cap 4):

* ``off`` -- the router without ``--context-reuse`` (the hot path the option must not
  slow down);
* ``on`` -- with ``--context-reuse``: every kept 200 response also leaves a bounded copy of
  its end, parsed once the response is finished;
* ``baseline`` (only with ``--baseline DIR``) -- the same router from an older source tree
  (``DIR`` holds an ``affinity_vllm`` package, e.g. ``git archive <commit>
  adapters/affinity_vllm | tar -x -C /tmp/base`` and ``--baseline /tmp/base/adapters``),
  to check that ``off`` costs what the code before the option cost.

Each round runs every variant once, in the same order, on the same keyed workload (64
sessions, token-id prompts, eight concurrent clients; most turns are kept, so ``on``
parses nearly every response): 200 warm-up requests, then ``--requests`` measured ones.
The figure is the router process's user+system CPU time per measured request (from
``/proc``; less sensitive to the rest of the machine than latency, but the clock has 10 ms
ticks, so use thousands of requests). ``--stream`` asks for SSE with
``stream_options.include_usage``. Reported: the median over rounds per variant, the
ratios to ``off``, and ``uptime`` at the start and the end.

Run: ``python benchmarks/bench_context_reuse.py [--requests 10000] [--rounds 3]
[--stream] [--baseline DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import aiohttp

BAND = ["--margin", "2", "--affinity-break-tokens", "100", "--affinity-break-band-cap", "4",
        "--log-level", "WARNING"]
CLIENTS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_ready(url: str) -> None:
    for _ in range(400):
        try:
            async with aiohttp.ClientSession() as client, client.get(url + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not become ready")


async def drive(url: str, count: int, stream: bool) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CLIENTS)) as client:
        async def one(i: int) -> None:
            body: dict[str, object] = {"model": "tiny", "max_tokens": 4,
                                       "prompt": list(range(1, 40 + (i // 64) % 8))}
            if stream:
                body.update(stream=True, stream_options={"include_usage": True})
            async with client.post(url + "/v1/completions", json=body,
                                   headers={"x-session-id": f"k{i % 64}"}) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"request {i} got {resp.status}")

        async def worker(first: int) -> None:
            for i in range(first, count, CLIENTS):
                await one(i)

        await asyncio.gather(*(worker(w) for w in range(CLIENTS)))


async def measure(backend: str, extra: list[str], env: dict[str, str], args: argparse.Namespace
                  ) -> float:
    port = free_port()
    router = subprocess.Popen(
        [sys.executable, "-m", "affinity_cli.main", "serve", "--backend", backend, *BAND,
         "--port", str(port), *extra], env={**os.environ, **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url)
        await drive(url, 200, args.stream)
        before = cpu_seconds(router.pid)
        await drive(url, args.requests, args.stream)
        return (cpu_seconds(router.pid) - before) / int(args.requests) * 1e6
    finally:
        router.terminate()
        router.wait()


async def main_async(args: argparse.Namespace) -> int:
    variants: dict[str, tuple[list[str], dict[str, str]]] = {"off": ([], {}),
                                                             "on": (["--context-reuse"], {})}
    if args.baseline is not None:
        variants["baseline"] = ([], {"PYTHONPATH": str(args.baseline)})
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-m", "affinity_vllm.stub", "--port", str(port),
                             "--max-num-seqs", "64"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results: dict[str, list[float]] = {name: [] for name in variants}
    start_load = os.getloadavg()
    try:
        backend = f"http://127.0.0.1:{port}"
        await wait_ready(backend)
        for _ in range(args.rounds):
            for name, (extra, env) in variants.items():
                results[name].append(await measure(backend, extra, env, args))
    finally:
        stub.terminate()
        stub.wait()
    end_load = os.getloadavg()
    off = statistics.median(results["off"])
    print(f"router CPU per request, {args.requests} {'SSE' if args.stream else 'JSON'} "
          f"requests x {args.rounds} rounds; load average (1/5/15 min) "
          f"{'/'.join(f'{x:.2f}' for x in start_load)} at the start, "
          f"{'/'.join(f'{x:.2f}' for x in end_load)} at the end\n")
    print("| variant | median µs/request | rounds | ratio to off |\n|---|---:|---|---:|")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.1f} | {', '.join(f'{v:.1f}' for v in values)} | "
              f"{median / off:.3f} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="a directory holding an older affinity_vllm package")
    args = parser.parse_args()
    if args.requests < 1000 or args.rounds < 1:
        parser.error(f"--requests must be >= 1000 (10 ms CPU ticks) and --rounds >= 1, got "
                     f"{args.requests} and {args.rounds}")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
