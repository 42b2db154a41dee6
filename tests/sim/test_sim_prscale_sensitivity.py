"""The sensitivity runs of pr7435-scale: one input moved, everything else the preset's.

Output dispersion and turn count (the contexts held), step size and the KV pool."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import attrs
import pytest
from affinity_sim.presets import preset
from affinity_sim.prscale import CONTEXTS, scale_workloads
from affinity_sim.prscale_dispersion import (
    DISPERSION_MEDIANS,
    DISPERSIONS,
    FIT_SEEDS,
    dispersed,
    dispersion_workloads,
)
from affinity_sim.prscale_pool import ORDINARY_ROWS, UTILIZATIONS
from affinity_sim.prscale_stepsize import STEP_PROMPTS
from affinity_sim.prscale_turns import (
    TURN_MEDIANS,
    TURN_RATIOS,
    turn_workloads,
    with_turn_ratio,
)
from affinity_sim.routing import parse_policy
from affinity_sim.simulate import simulate_step
from affinity_sim.workload import Workload, plan_step


def _final_contexts(w: Workload, seeds: tuple[int, ...] = FIT_SEEDS) -> list[int]:
    return [p.final_context for s in seeds for p in plan_step(w, s)]


def test_dispersed_splits_the_log_variance_evenly() -> None:
    base = scale_workloads(prompts=2)[0]
    for sigma in (0.5, 1.4):
        w = dispersed(base, sigma, 300.0)
        within = dict(w.output_tokens.params)["sigma"]
        assert math.isclose(within**2 + w.difficulty_sigma**2, sigma**2)
        assert math.isclose(within, w.difficulty_sigma)
        assert dict(w.output_tokens.params)["median"] == 300.0


def test_recorded_medians_hold_each_rows_context() -> None:
    # Plans only, as the fit itself: every (row, sigma) gives the PR's context within 1%.
    base = {w.name: w for w in scale_workloads()}
    seen = {}
    for w in dispersion_workloads():
        row, _, label = w.name.partition("/sigma-")
        sigma = float(label)
        assert sigma in DISPERSIONS
        assert dict(w.output_tokens.params)["median"] == DISPERSION_MEDIANS[(row, sigma)]
        key = (w.max_context, DISPERSION_MEDIANS[(row, sigma)], sigma)
        if key not in seen:
            seen[key] = statistics.fmean(_final_contexts(w))
        assert abs(seen[key] - CONTEXTS[row]) <= 0.01 * CONTEXTS[row], (w.name, seen[key])
        # every input but the output shape is the preset's
        assert attrs.evolve(w, name=row, description=base[row].description,
                            output_tokens=base[row].output_tokens,
                            difficulty_sigma=base[row].difficulty_sigma) == base[row]


def test_the_spread_of_final_contexts_grows_with_sigma() -> None:
    # The knob does what it claims: at a held mean, a wider sigma spreads trajectories more.
    ctx9k = scale_workloads()[1]
    spread = []
    for sigma in DISPERSIONS:
        w = dispersed(ctx9k, sigma, DISPERSION_MEDIANS[("ctx9k", sigma)])
        contexts = _final_contexts(w, (FIT_SEEDS[0],))
        spread.append(statistics.pstdev(contexts) / statistics.fmean(contexts))
    assert spread == sorted(spread) and spread[-1] > 1.2 * spread[0]  # the limit caps it


def test_the_preset_runs_legacy_and_margin_2_on_every_row_and_sigma() -> None:
    sweep = preset("pr7435-scale-dispersion")
    assert [p.name for p in sweep.policies] == ["legacy", "margin-2"]
    assert sweep.seeds == 10
    assert len(sweep.workloads) == 4 * len(DISPERSIONS)
    assert 0.8 not in DISPERSIONS  # the preset's own value is the prediction's record
    assert sweep.reference == preset("pr7435-scale").reference


def test_bad_input_names_the_value_and_the_range() -> None:
    w = scale_workloads(prompts=1)[0]
    with pytest.raises(ValueError, match=r"sigma must be a log-sigma > 0, got 0"):
        dispersed(w, 0, 100.0)
    with pytest.raises(ValueError, match=r"median must be a number of tokens > 0, got -1"):
        dispersed(w, 0.8, -1)


def test_the_step_size_preset_changes_only_the_number_of_prompts() -> None:
    sweep = preset("pr7435-scale-step-size")
    assert [p.name for p in sweep.policies] == ["legacy", "margin-2"]
    assert sweep.seeds == 10 and 512 not in STEP_PROMPTS
    assert sweep.reference == preset("pr7435-scale").reference
    base = {w.name: w for w in scale_workloads()}
    assert len(sweep.workloads) == 4 * len(STEP_PROMPTS)
    for w in sweep.workloads:
        row, _, prompts = w.name.partition("/prompts-")
        assert w.prompts == int(prompts) and w.trajectories == 16 * int(prompts)
        assert attrs.evolve(w, name=row, prompts=512,
                            description=base[row].description) == base[row]


def test_turn_ratio_is_a_truncated_geometric_law() -> None:
    base = scale_workloads(prompts=2)[0]
    for q in (0.25, 2.0):
        turns = dict(with_turn_ratio(base, q).turns.params)
        assert turns["values"] == [1, 2, 3, 4, 5]
        assert turns["weights"] == [q**k for k in range(5)]
    with pytest.raises(ValueError, match=r"q must be a turn-count ratio > 0, got 0"):
        with_turn_ratio(base, 0)


def test_turn_medians_hold_each_rows_context_and_move_the_turn_count() -> None:
    base = {w.name: w for w in scale_workloads()}
    turns: dict[float, float] = {}
    for w in turn_workloads():
        row, _, label = w.name.partition("/q-")
        q = float(label)
        assert q in TURN_RATIOS
        assert dict(w.output_tokens.params)["median"] == TURN_MEDIANS[(row, q)]
        contexts = _final_contexts(w)
        assert abs(statistics.fmean(contexts) - CONTEXTS[row]) <= 0.01 * CONTEXTS[row]
        if row == "ctx9k":
            plans = plan_step(w, FIT_SEEDS[0])
            turns[q] = statistics.fmean(len(p.outputs) for p in plans)
        # every input but the turn law and the output median is the preset's
        assert attrs.evolve(w, name=row, description=base[row].description,
                            turns=base[row].turns,
                            output_tokens=base[row].output_tokens) == base[row]
    # q < 1: mostly single-turn; q > 1: mostly five turns (the limit cuts a few)
    assert turns[0.25] < 1.4 < turns[0.5] < 2.0 < 3.5 < turns[2.0]


def test_the_pool_preset_changes_only_the_ordinary_rows_pools() -> None:
    sweep = preset("pr7435-scale-pool")
    assert [p.name for p in sweep.policies] == ["legacy", "margin-2"]
    assert sweep.seeds == 10 and 0.5 not in UTILIZATIONS
    base = {w.name: w for w in scale_workloads()}
    assert len(sweep.workloads) == len(ORDINARY_ROWS) * len(UTILIZATIONS)
    pools = {}
    for w in sweep.workloads:
        row, _, label = w.name.partition("/util-")
        assert row in ORDINARY_ROWS  # the large-pool row is not re-run
        pools[float(label)] = w.model.kv_capacity_tokens
        assert attrs.evolve(w, name=row, description=base[row].description,
                            model=base[row].model) == base[row]
        assert attrs.evolve(w.model, kv_capacity_tokens=base[row].model.kv_capacity_tokens
                            ) == base[row].model
    # the pool follows from the model: 4 x 141 GB of HBM per unit of utilization, at
    # 64 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 262,144 bytes a token
    slope = (pools[0.7] - pools[0.3]) / 0.4
    assert abs(slope - 4 * 141e9 / 262_144) < 5
    # monotone in the utilization, around the preset's 0.5 pool and below the 0.9 one
    preset_pool = base["ctx9k"].model.kv_capacity_tokens
    large_pool = base["ctx9k-bigkv"].model.kv_capacity_tokens
    assert pools[0.3] < pools[0.4] < preset_pool < pools[0.7] < large_pool


def _legacy_hit(workload: Workload) -> float:
    return simulate_step(workload, parse_policy("legacy"), 0).prefix_hit_rate


def test_the_cliffs_the_configuration_explanations_rest_on() -> None:
    # sim/studies/README.md explains ctx2k's miss by its pool and the large pool's hit rate by its
    # step size: each rests on the cache crossing a cliff. One legacy step, seed 0, each.
    ctx2k = next(w for w in preset("pr7435-scale").workloads if w.name == "ctx2k")
    small_pool = next(w for w in preset("pr7435-scale-pool").workloads
                      if w.name == "ctx2k/util-0.3")
    assert _legacy_hit(ctx2k) > 0.8 and _legacy_hit(small_pool) < 0.2
    bigkv = next(w for w in preset("pr7435-scale-step-size").workloads
                 if w.name == "ctx9k-bigkv/prompts-256")
    assert _legacy_hit(bigkv) > 0.9  # 3% at the preset's 512 prompts


def _rounded(value: Any) -> Any:
    """The record's JSON keeps 7 significant digits: compare at 5."""
    if isinstance(value, float):
        return float(f"{value:.5g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


@pytest.mark.parametrize("run", ["context-per-request", "dispersion", "step-size", "turns",
                                 "pool", "replication"])
def test_each_recorded_run_is_its_preset_as_defined_now(run: str) -> None:
    path = Path(__file__).resolve().parents[2] / "sim" / f"pr7435-scale-{run}.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    sweep = preset(f"pr7435-scale-{run}")
    described = json.loads(json.dumps([w.describe() for w in sweep.workloads]))
    assert _rounded(described) == _rounded(record["workloads"])
    assert [p["name"] for p in record["policies"]] == [p.name for p in sweep.policies]
    assert record["seeds"] == sweep.seed_list()
    # every (workload, policy, seed) step is in the record, once
    steps = sorted((r["workload"], r["policy"], r["seed"]) for r in record["results"])
    assert steps == sorted((w.name, p.name, s) for w in sweep.workloads
                           for p in sweep.policies for s in sweep.seed_list())


def test_the_replication_reruns_the_explaining_cells_unchanged_on_fresh_seeds() -> None:
    from affinity_sim.prscale_replication import CELLS, REPORTED_APART

    sweep = preset("pr7435-scale-replication")
    defined = {w.name: w for run in ("pr7435-scale-step-size", "pr7435-scale-pool")
               for w in preset(run).workloads}
    assert [w.name for w in sweep.workloads] == [c for c, _ in (*CELLS, *REPORTED_APART)]
    for w in sweep.workloads:  # the same workload as in its run, description aside
        assert attrs.evolve(w, description="") == attrs.evolve(defined[w.name], description="")
    assert [p.name for p in sweep.policies] == ["legacy", "margin-2"]
    earlier = set(range(10)) | {1000, 1001}  # the sensitivity runs' seeds and the fit seeds
    assert len(sweep.seed_list()) == 100 and not earlier & set(sweep.seed_list())


def test_a_variant_is_read_against_its_rows_pr_numbers() -> None:
    sweep = preset("pr7435-scale-replication")
    assert sweep.reference_for("ctx20k/prompts-128") == sweep.reference_for("ctx20k")
    assert sweep.reference_for("ctx20k")["change"] == pytest.approx(-0.101)
    assert sweep.reference_for("ctx9k-bigkv/prompts-256")["hit_rate"] == pytest.approx(0.997)
    assert sweep.reference_for("agent-80k") == {}
