"""Sensitivity of ``pr7435-scale`` to what the PR's "approximate context" means.

Theory of operation
-------------------
The ``pr7435-scale`` preset reads each row's "approximate context" (2.2K / 8.7K / 19.8K)
as the mean *final* context of a trajectory: prompt plus every turn's output and tool
response. A second reading has an equally concrete source. The PR read its baseline hit
rate from vLLM's metrics, and vLLM also exports each request's prompt length
(``vllm:request_prompt_tokens``, one request per turn); the mean over a step's requests
is the natural "context" next to a hit rate. Under it, turn ``k``'s prompt
(``P + o_1 + t_1 + ... + o_{k-1} + t_{k-1}``) averages the PR's number over all turns of
all trajectories (:func:`mean_request_prompt`).

This is a **sensitivity analysis, decided after the prediction missed**, not a new
prediction: it says how much of the misses the ambiguity of one input can explain.
Nothing else changes: every other input of every row is the preset's.

The fit (:func:`fit_per_request`) works on the drawn plans alone, as
:func:`~affinity_sim.prscale.fit_contexts` does, with no simulation. Unlike the final
context, the mean request prompt is **not monotone** in the output median: the
response limit (``max_context``) cuts a long output and ends its trajectory, so past
some median the extra turns vanish and the mean prompt falls back towards ``P``. The
fit therefore first finds the median that maximizes the mean prompt (a log-spaced grid,
then golden-section refinement). If the target is above that maximum it is
**unreachable under the row's response limit**: the fit says so and stops at the
maximizing median, the closest the limit allows. Otherwise it bisects on the rising
branch below the maximum until the mean is within ``tolerance``.

The medians the module's ``__main__`` fits are recorded in :data:`PER_REQUEST_MEDIANS`;
``tests/sim/test_sim_prscale_context.py`` checks that they still give what is recorded.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

import attrs

from .calibrate import _with_median
from .prscale import CONTEXTS, scale_workloads, sensitivity_sweep
from .sweep import Sweep
from .workload import TrajectoryPlan, Workload, plan_step

__all__ = ["PER_REQUEST_MEDIANS", "ContextFit", "fit_per_request", "mean_request_prompt",
           "per_request_sweep", "per_request_workloads"]

FIT_SEEDS = (1000, 1001)  # the preset's fit seeds, disjoint from the evaluation seeds 0..
_GOLDEN = (math.sqrt(5) - 1) / 2


def mean_request_prompt(plans: Iterable[TrajectoryPlan]) -> float:
    """Mean prompt tokens per request (one request per turn), over every turn of every plan.

    Turn ``k``'s prompt is the conversation before it: the prompt plus the earlier
    turns' outputs and tool responses, less any rewinds (as ``simulate.py`` sends it).
    """
    total = 0
    requests = 0
    for plan in plans:
        context = plan.prompt_tokens
        for turn, output in enumerate(plan.outputs):
            total += context
            requests += 1
            context += output
            if turn < len(plan.tool_tokens):
                context += plan.tool_tokens[turn]
            if turn < len(plan.rewinds):
                context -= plan.rewinds[turn]
    if requests == 0:
        raise ValueError("mean_request_prompt needs at least one turn, got no plans")
    return total / requests


@attrs.frozen
class ContextFit:
    """One row's fit: the median, what it gives, and whether the target was reachable."""

    median: float
    mean_request_prompt: float
    mean_final_context: float
    reachable: bool
    # The largest mean request prompt any median gives under the row's response limit.
    maximum: float


def _evaluate(workload: Workload, median: float, seeds: Sequence[int]) -> float:
    fitted = attrs.evolve(workload, output_tokens=_with_median(workload.output_tokens, median))
    return statistics.fmean(mean_request_prompt(plan_step(fitted, s)) for s in seeds)


def _maximize(workload: Workload, seeds: Sequence[int]) -> tuple[float, float]:
    """(median, mean request prompt) at the maximum over medians in [1, max_context]."""
    top = math.log(workload.max_context)
    grid = [top * i / 24 for i in range(25)]
    values = [_evaluate(workload, math.exp(x), seeds) for x in grid]
    best = max(range(len(grid)), key=values.__getitem__)
    low, high = grid[max(0, best - 1)], grid[min(len(grid) - 1, best + 1)]
    a = high - _GOLDEN * (high - low)
    b = low + _GOLDEN * (high - low)
    fa, fb = _evaluate(workload, math.exp(a), seeds), _evaluate(workload, math.exp(b), seeds)
    while high - low > 0.005:  # medians within 0.5% of each other
        if fa < fb:
            low, a, fa = a, b, fb
            b = low + _GOLDEN * (high - low)
            fb = _evaluate(workload, math.exp(b), seeds)
        else:
            high, b, fb = b, a, fa
            a = high - _GOLDEN * (high - low)
            fa = _evaluate(workload, math.exp(a), seeds)
    candidates = [(values[best], grid[best]), (fa, a), (fb, b)]
    value, x = max(candidates)
    return math.exp(x), value


def fit_per_request(workload: Workload, target: float, seeds: Sequence[int] = FIT_SEEDS,
                    tolerance: float = 0.01) -> ContextFit:
    """The output median whose plans' mean request prompt is ``target`` (within ``tolerance``).

    If no median reaches ``target`` under ``workload.max_context``, the result has
    ``reachable=False`` and the median of the maximum.
    """
    if workload.output_tokens.kind != "lognormal":
        raise ValueError("fit_per_request needs a lognormal output_tokens distribution, got "
                         f"{workload.output_tokens.kind!r}")
    if not (isinstance(target, (int, float)) and target > 0):
        raise ValueError(f"target must be a number of tokens > 0, got {target!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}")
    peak_median, peak = _maximize(workload, seeds)
    median, achieved = peak_median, peak
    reachable = peak >= target * (1 - tolerance)
    if reachable and abs(peak - target) > tolerance * target:
        low, high = 1.0, peak_median  # the rising branch
        for _ in range(60):
            median = math.sqrt(low * high)
            achieved = _evaluate(workload, median, seeds)
            if abs(achieved - target) <= tolerance * target:
                break
            low, high = (median, high) if achieved < target else (low, median)
    fitted = attrs.evolve(workload, output_tokens=_with_median(workload.output_tokens, median))
    final = statistics.fmean(
        statistics.fmean(p.final_context for p in plan_step(fitted, s)) for s in seeds)
    return ContextFit(median, achieved, final, reachable, peak)


# Recorded by ``python -m affinity_sim.prscale_context`` (seeds 1000-1001). No row's
# target is reachable under its response limit (4,096 / 16,384 / 32,768 tokens), so each
# is the median of the maximum mean request prompt; ctx9k-bigkv draws ctx9k's plans.
PER_REQUEST_MEDIANS = {"ctx2k": 1_367.0, "ctx9k": 5_833.0, "ctx20k": 12_438.0,
                       "ctx9k-bigkv": 5_833.0}


def per_request_workloads() -> tuple[Workload, ...]:
    """The preset's rows with the output medians of :data:`PER_REQUEST_MEDIANS`."""
    return tuple(attrs.evolve(
        w, output_tokens=_with_median(w.output_tokens, PER_REQUEST_MEDIANS[w.name]),
        description=f"{w.description}; context read as the mean prompt per request")
        for w in scale_workloads())


def per_request_sweep() -> Sweep:
    """Legacy and margin 2 on the four rows under the per-request reading, 10 seeds."""
    return sensitivity_sweep("pr7435-scale-context-per-request", per_request_workloads(),
                             "sensitivity: pr7435-scale with the PR's context read as the "
                             "mean prompt per request (decided after the prediction missed)")


if __name__ == "__main__":
    for w in scale_workloads():
        fit = fit_per_request(w, CONTEXTS[w.name])
        verdict = "reached" if fit.reachable else (
            f"UNREACHABLE under the {w.max_context:,}-token limit (maximum {fit.maximum:,.0f})")
        print(f"{w.name}: target {CONTEXTS[w.name]:,} -> output median {fit.median:,.0f}: "
              f"mean request prompt {fit.mean_request_prompt:,.0f}, mean final context "
              f"{fit.mean_final_context:,.0f}; {verdict}")
