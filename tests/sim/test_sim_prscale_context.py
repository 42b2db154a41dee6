"""The per-request context reading of pr7435-scale: the fit on the drawn plans alone."""

from __future__ import annotations

import statistics

import attrs
import pytest
from affinity_sim.calibrate import _with_median
from affinity_sim.distributions import parse
from affinity_sim.presets import preset
from affinity_sim.prscale import CONTEXTS, scale_workloads
from affinity_sim.prscale_context import (
    FIT_SEEDS,
    PER_REQUEST_MEDIANS,
    fit_per_request,
    mean_request_prompt,
    per_request_workloads,
)
from affinity_sim.workload import TrajectoryPlan, Workload, plan_step


def _plans_mean(workload: Workload, median: float, seeds: tuple[int, ...] = FIT_SEEDS) -> float:
    """Independent of the fit's own helper: draw the plans, average their request prompts."""
    w = attrs.evolve(workload, output_tokens=_with_median(workload.output_tokens, median))
    return statistics.fmean(mean_request_prompt(plan_step(w, s)) for s in seeds)


def test_mean_request_prompt_by_hand() -> None:
    three = TrajectoryPlan(0, 0, "a", 100, (10, 20, 30), (5, 6), (0.0, 0.0))
    one = TrajectoryPlan(1, 0, "b", 50, (7,), (), ())
    # turn prompts: 100, 100 + 10 + 5 = 115, 115 + 20 + 6 = 141; and 50
    assert mean_request_prompt([three, one]) == pytest.approx((100 + 115 + 141 + 50) / 4)
    rewound = attrs.evolve(three, rewinds=(4, 0))
    assert mean_request_prompt([rewound]) == pytest.approx((100 + 111 + 137) / 3)
    with pytest.raises(ValueError, match="at least one turn"):
        mean_request_prompt([])


def test_fit_hits_a_reachable_target_on_the_drawn_plans() -> None:
    small = scale_workloads(prompts=32)[0]  # ctx2k's shape, 512 trajectories
    fit = fit_per_request(small, 1_000.0)
    assert fit.reachable and fit.maximum >= 1_000
    assert abs(_plans_mean(small, fit.median) - 1_000) <= 10  # within 1%
    assert fit.mean_request_prompt == pytest.approx(_plans_mean(small, fit.median))
    assert fit.mean_final_context > fit.mean_request_prompt  # later turns see more context


def test_unreachable_target_stops_at_the_maximum_under_the_limit() -> None:
    small = scale_workloads(prompts=32)[0]
    fit = fit_per_request(small, 2_200.0)
    assert not fit.reachable and fit.maximum < 2_200
    assert fit.mean_request_prompt == fit.maximum
    # a maximum: neither a shorter nor a longer output median gives more
    for factor in (0.7, 0.9, 1.1, 1.4):
        assert _plans_mean(small, fit.median * factor) <= fit.maximum
    # past the maximum the limit cuts the conversations short and the mean prompt falls
    assert _plans_mean(small, small.max_context) < 0.8 * fit.maximum


def test_recorded_medians_are_the_maximum_and_below_the_targets() -> None:
    # python -m affinity_sim.prscale_context printed these maxima (seeds 1000-1001)
    recorded = {"ctx2k": 1_448, "ctx9k": 4_809, "ctx20k": 9_291, "ctx9k-bigkv": 4_809}
    base = {w.name: w for w in scale_workloads()}
    for w in per_request_workloads():
        assert dict(w.output_tokens.params)["median"] == PER_REQUEST_MEDIANS[w.name]
        achieved = _plans_mean(w, PER_REQUEST_MEDIANS[w.name])
        assert abs(achieved - recorded[w.name]) <= 0.005 * recorded[w.name]
        assert achieved < CONTEXTS[w.name]  # unreachable under the row's response limit
        for factor in (0.9, 1.1):
            assert _plans_mean(w, PER_REQUEST_MEDIANS[w.name] * factor) <= achieved * 1.002
        # every other input is the preset's
        assert attrs.evolve(w, output_tokens=base[w.name].output_tokens,
                            description=base[w.name].description) == base[w.name]


def test_the_preset_runs_legacy_and_margin_2_on_the_four_rows() -> None:
    sweep = preset("pr7435-scale-context-per-request")
    assert [p.name for p in sweep.policies] == ["legacy", "margin-2"]
    assert sweep.seeds == 10
    assert [w.name for w in sweep.workloads] == ["ctx2k", "ctx9k", "ctx20k", "ctx9k-bigkv"]
    assert sweep.reference == preset("pr7435-scale").reference


def test_bad_input_names_the_value_and_the_range() -> None:
    w = scale_workloads(prompts=1)[0]
    with pytest.raises(ValueError, match=r"target must be a number of tokens > 0, got -5"):
        fit_per_request(w, -5)
    with pytest.raises(ValueError, match=r"tolerance must be in \(0, 1\), got 2"):
        fit_per_request(w, 100, tolerance=2)
    flat = attrs.evolve(w, output_tokens=parse("output_tokens",
                                               {"dist": "constant", "value": 10}))
    with pytest.raises(ValueError, match="lognormal output_tokens distribution, got 'constant'"):
        fit_per_request(flat, 100)
