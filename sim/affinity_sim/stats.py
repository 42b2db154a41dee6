"""Paired statistics: every policy against the baseline, seed by seed.

Theory of operation
-------------------
For one workload and seed, every policy replays the same trajectories, so step times
pair up by seed. For policy ``p`` and seed ``s`` the change is

    change[s] = (t_p[s] - t_baseline[s]) / t_baseline[s]

The summary reports the median change (the PR's "paired median change"), a
distribution-free confidence interval for that median from order statistics (the
interval ``[x_(k), x_(n+1-k)]`` with the largest ``k`` such that
``P(Binomial(n, 1/2) < k) <= alpha/2``; for n = 30 at 95% that is ``[x_(10), x_(21)]``),
and the two-sided Wilcoxon signed-rank p-value of the paired step times
(``scipy.stats.wilcoxon``). A policy identical to the baseline on every seed gets
p = 1.

The other columns are means over seeds of per-step quantities: prefix hit rate, breaks
(``affinity_broken``) per step, replica idle fraction, queue skew, preemptions.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from .simulate import StepResult

__all__ = ["PolicySummary", "median_ci", "summarize", "wilcoxon_p"]


@attrs.frozen(kw_only=True)
class PolicySummary:
    workload: str
    policy: str
    seeds: int
    median_change: float  # fraction; -0.05 is 5% faster than the baseline
    ci_low: float
    ci_high: float
    p_value: float | None  # None for the baseline itself
    faster_steps: int  # seeds on which the policy beat the baseline
    median_step_time_s: float
    prefix_hit_rate: float
    breaks_per_step: float
    idle_fraction: float
    queue_skew: float
    preemptions_per_step: float
    self_count_per_step: float

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def median_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Order-statistic confidence interval for the median (see the module docstring)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median_ci needs at least one value")
    alpha = 1.0 - confidence
    k = 0
    cumulative = 0.0
    # cumulative = P(Binomial(n, 1/2) <= j); k is the largest j+1 with P(B <= j) <= alpha/2.
    for j in range(n):
        cumulative += math.comb(n, j) / 2.0**n
        if cumulative > alpha / 2:
            break
        k = j + 1
    if k == 0:
        return ordered[0], ordered[-1]  # too few seeds for the level: the full range
    return ordered[k - 1], ordered[n - k]


def wilcoxon_p(policy: Sequence[float], baseline: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired samples; 1.0 if all pairs tie."""
    if len(policy) != len(baseline):
        raise ValueError(f"paired samples differ in length: {len(policy)} vs {len(baseline)}")
    if all(a == b for a, b in zip(policy, baseline, strict=True)):
        return 1.0
    from scipy.stats import wilcoxon  # imported here: scipy is slow to import

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small-sample and tie notices
        result = wilcoxon(policy, baseline, alternative="two-sided")
    return float(result.pvalue)


def summarize(results: Iterable[StepResult], baseline: str = "legacy") -> list[PolicySummary]:
    """One summary per (workload, policy), in first-seen order."""
    table: dict[tuple[str, str], dict[int, StepResult]] = defaultdict(dict)
    for r in results:
        table[(r.workload, r.policy)][r.seed] = r
    summaries: list[PolicySummary] = []
    for (workload, policy), by_seed in table.items():
        base = table.get((workload, baseline))
        if base is None:
            raise ValueError(f"no {baseline!r} results for workload {workload!r}")
        seeds = sorted(set(by_seed) & set(base))
        if not seeds:
            raise ValueError(f"no seeds shared by {policy!r} and {baseline!r} on {workload!r}")
        mine = [by_seed[s].step_time_s for s in seeds]
        theirs = [base[s].step_time_s for s in seeds]
        changes = [(a - b) / b for a, b in zip(mine, theirs, strict=True)]
        low, high = median_ci(changes)
        runs = [by_seed[s] for s in seeds]
        summaries.append(PolicySummary(
            workload=workload,
            policy=policy,
            seeds=len(seeds),
            median_change=statistics.median(changes),
            ci_low=low,
            ci_high=high,
            p_value=None if policy == baseline else wilcoxon_p(mine, theirs),
            faster_steps=sum(1 for c in changes if c < 0),
            median_step_time_s=statistics.median(mine),
            prefix_hit_rate=statistics.fmean(r.prefix_hit_rate for r in runs),
            breaks_per_step=statistics.fmean(r.breaks for r in runs),
            idle_fraction=statistics.fmean(r.idle_fraction for r in runs),
            queue_skew=statistics.fmean(r.queue_skew for r in runs),
            preemptions_per_step=statistics.fmean(r.preemptions for r in runs),
            self_count_per_step=statistics.fmean(r.self_count_acquires for r in runs),
        ))
    return summaries
