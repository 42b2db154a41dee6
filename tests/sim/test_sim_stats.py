"""Paired statistics: order-statistic CI, Wilcoxon p, pairing by seed."""

from __future__ import annotations

import attrs
import pytest
from affinity_sim.simulate import StepResult
from affinity_sim.stats import median_ci, summarize, wilcoxon_p


def result(policy: str, seed: int, step: float, **changes: object) -> StepResult:
    fields: dict[str, object] = {
        "workload": "w", "policy": policy, "seed": seed, "step_time_s": step,
        "prefix_hit_rate": 0.5, "query_tokens": 100, "hit_tokens": 50,
        "preempted_query_tokens": 0, "preempted_hit_tokens": 0, "prefill_tokens": 50,
        "breaks": 0, "kept": 0, "placements": 1, "turns": 1, "preemptions": 0,
        "evicted_blocks": 0, "idle_fraction": 0.1, "queue_skew": 1.0, "mean_queue": 1.0,
        "self_count_acquires": 0, "ignored_releases": 0,
    }
    fields.update(changes)
    return StepResult(**fields)  # type: ignore[arg-type]


def test_median_ci_order_statistics() -> None:
    values = [float(v) for v in range(1, 31)]
    assert median_ci(values) == (10.0, 21.0)  # n = 30: the 10th and 21st
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few for 95%: the range
    assert median_ci([float(v) for v in range(1, 7)]) == (1.0, 6.0)
    with pytest.raises(ValueError):
        median_ci([])


def test_wilcoxon_direction_and_ties() -> None:
    base = [100.0 + i for i in range(30)]
    faster = [b * 0.95 for b in base]
    assert wilcoxon_p(faster, base) < 1e-6
    assert wilcoxon_p(base, base) == 1.0
    mixed = [b * (0.99 if i % 2 else 1.01) for i, b in enumerate(base)]
    assert wilcoxon_p(mixed, base) > 0.05


def test_summary_pairs_by_seed() -> None:
    rows = []
    for seed in range(10):
        base = 100.0 + 10 * seed
        rows.append(result("legacy", seed, base))
        # 10% faster on every seed, more breaks, lower idle
        rows.append(result("margin-2", seed, base * 0.9, breaks=4, idle_fraction=0.05))
    rows.append(result("margin-2", 99, 1.0))  # no baseline for seed 99: ignored
    by_policy = {s.policy: s for s in summarize(rows)}
    margin = by_policy["margin-2"]
    assert margin.seeds == 10
    assert margin.median_change == pytest.approx(-0.10)
    assert margin.ci_low == pytest.approx(-0.10) and margin.ci_high == pytest.approx(-0.10)
    assert margin.faster_steps == 10
    assert margin.p_value is not None and margin.p_value < 0.01
    assert margin.breaks_per_step == 4 and margin.idle_fraction == pytest.approx(0.05)
    assert by_policy["legacy"].p_value is None
    assert by_policy["legacy"].median_change == 0.0


def test_summary_needs_the_baseline() -> None:
    with pytest.raises(ValueError, match="no 'legacy' results"):
        summarize([result("margin-2", 0, 1.0)])
    assert attrs.asdict(result("legacy", 0, 1.0))["step_time_s"] == 1.0
