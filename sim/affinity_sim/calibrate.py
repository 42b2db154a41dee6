"""Calibration of a workload: output lengths to a mean context, KV pool to a hit rate.

Theory of operation
-------------------
The issue allows exactly two knobs per preset, set against the PR's *baseline*
observations only:

1. :func:`fit_output_median` scales the median of the per-turn output distribution until
   the mean final context of the drawn trajectories matches a target (the PR's
   "approximate context"). It needs no simulation: the plans alone give the context.
   Mean context grows monotonically with the median, so bisection on the median works.
2. :func:`fit_kv_capacity` bisects ``kv_capacity_tokens`` (on a log scale) until the
   *legacy* policy's mean prefix hit rate over the calibration seeds is within
   ``tolerance`` of the target. Hit rate rises with pool size (more blocks survive
   between turns), so bisection converges.

Calibration uses seeds 1000.. by default, disjoint from the evaluation seeds 0..29, so
the reported hit rates are out-of-sample. No policy other than legacy is ever run here:
the policies' results play no part in calibration.

Run ``python -m affinity_sim.calibrate`` to redo the pr7435 calibration; it prints the
values that go into :mod:`affinity_sim.presets`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import attrs

from .costmodel import QWEN25_32B_TP4_H200
from .distributions import Distribution
from .routing import parse_policy
from .simulate import simulate_step
from .workload import Workload, plan_step, plan_summary

__all__ = ["fit_kv_capacity", "fit_output_median", "legacy_hit_rate", "mean_context"]

CALIBRATION_SEEDS = tuple(range(1000, 1008))


def _with_median(dist: Distribution, median: float) -> Distribution:
    params = tuple((k, median if k == "median" else v) for k, v in dist.params)
    return attrs.evolve(dist, params=params)


def mean_context(workload: Workload, seeds: Sequence[int] = CALIBRATION_SEEDS) -> float:
    return statistics.fmean(
        plan_summary(plan_step(workload, s))["mean_final_context"] for s in seeds
    )


def fit_output_median(workload: Workload, target_context: float,
                      seeds: Sequence[int] = CALIBRATION_SEEDS) -> tuple[Workload, float]:
    """The workload with the output median that gives ``target_context`` (within 1%)."""
    if workload.output_tokens.kind != "lognormal":
        raise ValueError("fit_output_median needs a lognormal output_tokens distribution")
    low, high = 1.0, float(workload.max_context)
    fitted = workload
    achieved = 0.0
    for _ in range(40):
        mid = math.sqrt(low * high)
        fitted = attrs.evolve(workload, output_tokens=_with_median(workload.output_tokens, mid))
        achieved = mean_context(fitted, seeds)
        if abs(achieved - target_context) <= 0.01 * target_context:
            break
        if achieved < target_context:
            low = mid
        else:
            high = mid
    return fitted, achieved


def _legacy_hit(args: tuple[Workload, int]) -> float:
    workload, seed = args
    return simulate_step(workload, parse_policy("legacy"), seed).prefix_hit_rate


def legacy_hit_rate(workload: Workload, seeds: Sequence[int] = CALIBRATION_SEEDS,
                    workers: int = 2) -> float:
    jobs = [(workload, s) for s in seeds]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return statistics.fmean(pool.map(_legacy_hit, jobs))
    return statistics.fmean(map(_legacy_hit, jobs))


def fit_kv_capacity(workload: Workload, target: float, *, tolerance: float = 0.01,
                    seeds: Sequence[int] = CALIBRATION_SEEDS, workers: int = 2,
                    log: bool = True) -> tuple[Workload, float]:
    """Bisect the KV pool (tokens) until legacy's hit rate is within ``tolerance``."""
    low = workload.max_context + 2 * workload.model.block_size  # smallest valid pool
    high = workload.model.kv_capacity_tokens
    fitted = workload
    achieved = legacy_hit_rate(workload, seeds, workers)
    if achieved < target - tolerance:
        return fitted, achieved  # even the given pool is too small: report, don't grow it
    for _ in range(30):
        if abs(achieved - target) <= tolerance or high - low <= 1024:
            break
        mid = int(math.sqrt(low * high))
        fitted = attrs.evolve(workload, model=workload.model.with_capacity(mid))
        achieved = legacy_hit_rate(fitted, seeds, workers)
        if log:
            print(f"  {workload.name}: kv={mid:>9,} tokens -> legacy hit {achieved:.3%}",
                  file=sys.stderr)
        if achieved < target:
            low = mid
        else:
            high = mid
    return fitted, achieved


def main(argv: Sequence[str] | None = None) -> int:
    from .presets import preset

    parser = argparse.ArgumentParser(
        prog="python -m affinity_sim.calibrate",
        description="Refit the pr7435 workloads' output medians and KV pools.")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--only", default=None, help="one workload name")
    args = parser.parse_args(argv)
    contexts = {"ctx2k": 2200, "ctx9k": 8700, "ctx20k": 19800, "ctx9k-bigkv": 8700}
    for workload in preset("pr7435").workloads:
        if args.only and workload.name != args.only:
            continue
        target_hit = workload.target_hit_rate
        assert target_hit is not None
        fitted, context = fit_output_median(workload, contexts[workload.name])
        median = dict(fitted.output_tokens.params)["median"]
        # Search from the physical pool down (the presets hold the already-fitted pools).
        fitted = attrs.evolve(fitted, model=QWEN25_32B_TP4_H200)
        fitted, hit = fit_kv_capacity(fitted, target_hit, tolerance=0.005,
                                      workers=args.workers)
        print(f"{workload.name}: output median {median:,.0f} -> mean context {context:,.0f}; "
              f"kv_capacity_tokens {fitted.model.kv_capacity_tokens:,} -> legacy hit "
              f"{hit:.2%} (target {target_hit:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
