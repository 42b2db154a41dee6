"""The pr7435 presets keep their calibration: legacy hit rates within the PR's +-2 points.

A cheap guard on three evaluation seeds per workload (the recorded 30-seed run is in
sim/studies/README.md). Calibration itself used seeds 1000-1007.
"""

from __future__ import annotations

import statistics

import pytest
from affinity_sim.presets import preset
from affinity_sim.routing import parse_policy
from affinity_sim.simulate import simulate_step
from affinity_sim.workload import plan_step, plan_summary

CONTEXT = {"ctx2k": 2200, "ctx9k": 8700, "ctx20k": 19800, "ctx9k-bigkv": 8700}


@pytest.mark.parametrize("workload", preset("pr7435").workloads, ids=lambda w: w.name)
def test_baseline_hit_rate_and_context_match_the_pr(workload: object) -> None:
    from affinity_sim.workload import Workload

    assert isinstance(workload, Workload) and workload.target_hit_rate is not None
    legacy = parse_policy("legacy")
    hits = [simulate_step(workload, legacy, seed).prefix_hit_rate for seed in range(3)]
    assert abs(statistics.fmean(hits) - workload.target_hit_rate) <= 0.02, hits
    context = statistics.fmean(
        plan_summary(plan_step(workload, seed))["mean_final_context"] for seed in range(3))
    assert abs(context - CONTEXT[workload.name]) <= 0.05 * CONTEXT[workload.name]
