"""The context band in the simulator: policy, context_tokens on every acquire, evidence maths.

Cites SPEC R-BAND-1 (the band decides keeps in simulated steps through the real core) and
R-BAND-3 (a band that never widens is the margin rule, step for step).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from affinity_sim.band import (
    best_margin,
    break_even_tokens,
    head_to_head,
    markdown,
    operating_points,
    policy_table,
    regret_table,
    reprefill_s,
    slot_wait_s,
)
from affinity_sim.presets import load_sweep
from affinity_sim.routing import Balancer, PolicyError, parse_policy
from affinity_sim.simulate import simulate_step
from affinity_sim.workload import plan_step

from affinity_engine import Config, step
from affinity_engine import Path as CorePath

from .test_sim_replica import model
from .test_sim_routing import tiny_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "sim" / "examples"


def test_band_names_and_tables_map_to_the_core_config() -> None:
    named = parse_policy("band-m1-T8192-cap4")
    assert named.config() == Config(affinity_break_margin=1, affinity_break_tokens=8192,
                                    affinity_break_band_cap=4, tie_break="draw")
    table = parse_policy({"name": "b", "affinity_break_margin": 2,
                          "affinity_break_tokens": 1000, "affinity_break_band_cap": 5})
    assert table.config().affinity_break_tokens == 1000
    assert table.config().affinity_break_band_cap == 5
    assert named.describe()["affinity_break_tokens"] == 8192
    assert parse_policy("margin-2").describe()["affinity_break_band_cap"] is None


@pytest.mark.parametrize(("spec", "fragment"), [
    ("band-m3-T100-cap2", "affinity_break_band_cap"),  # cap below the margin
    ("band-m1-T0-cap4", "affinity_break_tokens must be null or an integer >= 1"),
    ({"name": "b", "affinity_break_tokens": 100, "affinity_break_band_cap": 3},
     "affinity_break_margin"),  # the band widens a margin: no margin, no band
    ("band-1-8192-4", "band-mM-TT-capC"),
])
def test_bad_band_policies_name_the_value(spec: Any, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(spec)
    assert fragment in str(info.value)


def test_balancer_keeps_a_long_context_where_a_short_one_breaks() -> None:
    """R-BAND-1 through the simulator's balancer: band = min(0 + c // 100, 2)."""
    def skewed() -> Balancer:
        balancer = Balancer(parse_policy("band-m0-T100-cap2").config("first"), ["a", "b"],
                            True, random.Random(0))
        assert balancer.acquire("s", 10) == "a"
        assert balancer.acquire("t", 10) == "b"
        assert balancer.acquire("u", 10) == "a"  # a: 2, b: 1, "s" pinned to a
        return balancer

    short = skewed()
    assert short.acquire("s", 99) == "b"  # band 0 < skew 1: broken
    assert short.paths[CorePath.BROKEN] == 1
    long = skewed()
    assert long.acquire("s", 100) == "a"  # band 1 >= skew 1: kept
    assert long.paths[CorePath.KEPT] == 1


def test_every_acquire_carries_the_turns_prompt_length(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str | None, int | None]] = []

    def recording_step(config, state, event):  # type: ignore[no-untyped-def]
        if type(event).__name__ == "Acquire":
            seen.append((event.request_id, event.context_tokens))
        return step(config, state, event)

    monkeypatch.setattr("affinity_engine.cursor.step", recording_step)
    workload = tiny_workload()
    simulate_step(workload, parse_policy("band-m1-T50-cap3"), seed=4)
    expected: dict[str, list[int]] = {}
    for plan in plan_step(workload, 4):
        context, prompts = plan.prompt_tokens, []
        for turn, output in enumerate(plan.outputs):
            prompts.append(context)
            context += output + (plan.tool_tokens[turn] if turn < len(plan.tool_tokens) else 0)
        expected[plan.request_id] = prompts
    by_request: dict[str, list[int]] = {}
    for rid, sent in seen:
        assert rid is not None and sent is not None
        by_request.setdefault(rid, []).append(sent)
    assert by_request == expected
    assert {40, 68, 96} == {c for cs in expected.values() for c in cs}  # 40 + (20 + 8) x k


def test_a_band_that_never_widens_is_the_margin_step_for_step() -> None:
    """R-BAND-3: T above every context gives margin m's results exactly."""
    workload = tiny_workload()
    for seed in (0, 1):
        band = simulate_step(workload, parse_policy("band-m1-T100000-cap4"), seed)
        margin = simulate_step(workload, parse_policy("margin-1"), seed)
        assert band.as_dict() | {"policy": ""} == margin.as_dict() | {"policy": ""}


def test_a_band_at_its_cap_everywhere_is_the_margin_at_the_cap() -> None:
    """T = 1: every turn (>= 40 tokens) has c // T >= cap, so the band is the cap margin."""
    workload = tiny_workload()
    for seed in (0, 1):
        band = simulate_step(workload, parse_policy("band-m0-T1-cap2"), seed)
        margin = simulate_step(workload, parse_policy("margin-2"), seed)
        assert band.as_dict() | {"policy": ""} == margin.as_dict() | {"policy": ""}


def test_reprefill_and_slot_wait_by_hand() -> None:
    # a = 5 ms, b = 1 ms per token (test_sim_replica's hand model), d = 0, budget 64.
    hand = model()
    a, b = hand.decode_fixed_s, hand.per_token_s
    assert reprefill_s(hand, 0) == 0.0
    assert reprefill_s(hand, 64) == pytest.approx(a + 64 * b)
    assert reprefill_s(hand, 100) == pytest.approx(2 * a + 100 * b)  # chunks of 64 and 36
    with_attention = model(prefill_attn_s_per_pair=1e-6)
    # Chunk 1: 64 x 65 / 2 pairs; chunk 2: 36 x 64 + 36 x 37 / 2.
    pairs = 64 * 65 / 2 + 36 * 64 + 36 * 37 / 2
    assert reprefill_s(with_attention, 100) == pytest.approx(2 * a + 100 * b + pairs * 1e-6)
    # Pool 1600 tokens / context 400 -> 4 sequences (= max_num_seqs); kv_read 0.
    assert slot_wait_s(hand, 400, 10) == pytest.approx(10 * (a + 4 * b) / 4)
    # Context 800 -> 2 sequences fit.
    assert slot_wait_s(hand, 800, 10) == pytest.approx(10 * (a + 2 * b) / 2)
    wait = reprefill_s(hand, 100)
    assert break_even_tokens(hand, wait) == 100
    assert break_even_tokens(hand, wait + 1e-9) == 101
    with pytest.raises(ValueError, match="wait_s must be > 0, got 0"):
        break_even_tokens(hand, 0)
    with pytest.raises(ValueError, match="tokens must be an integer >= 0, got -1"):
        reprefill_s(hand, -1)


def test_operating_points_come_from_drawn_trajectories() -> None:
    workload = tiny_workload()
    (point,) = operating_points([workload], [0])
    # Constant draws: prompts 40, 68, 96 (mean 68), outputs 20.
    assert point.mean_prompt == pytest.approx(68) and point.mean_output == pytest.approx(20)
    assert point.slot_wait_s == pytest.approx(slot_wait_s(workload.model, 68, 20))


def _record() -> dict[str, Any]:
    """A hand-made run record: 3 seeds, legacy 100 s; changes chosen to be checked by hand."""
    times = {"legacy": [100.0, 100.0, 100.0], "margin-1": [90.0, 92.0, 94.0],
             "margin-2": [95.0, 96.0, 97.0], "band": [91.0, 93.0, 90.0]}
    results = [{"workload": "w", "policy": p, "seed": s, "step_time_s": t}
               for p, ts in times.items() for s, t in enumerate(ts)]
    summary = [{"workload": "w", "policy": p, "median_change": sorted(ts)[1] / 100 - 1,
                "ci_low": min(ts) / 100 - 1, "ci_high": max(ts) / 100 - 1,
                "p_value": None if p == "legacy" else 0.25, "median_step_time_s": sorted(ts)[1],
                "prefix_hit_rate": 0.5, "breaks_per_step": 2.0}
               for p, ts in times.items()]
    return {"seeds": [0, 1, 2], "results": results, "summary": summary}


def test_head_to_head_pairs_by_seed() -> None:
    record = _record()
    assert best_margin(record, "w") == "margin-1"
    vs2 = head_to_head(record, "w", "band", "margin-2")
    assert vs2.median_diff == pytest.approx(-0.04)  # diffs -4, -3, -7 points
    assert vs2.ci_low == pytest.approx(-0.07) and vs2.ci_high == pytest.approx(-0.03)
    assert vs2.band_faster == 3 and vs2.seeds == 3
    assert vs2.band_change == pytest.approx(-0.09) and vs2.other_change == pytest.approx(-0.04)
    assert vs2.p_value == pytest.approx(0.25)  # exact two-sided Wilcoxon, n = 3, all one sign
    vs1 = head_to_head(record, "w", "band", "margin-1")
    assert vs1.median_diff == pytest.approx(0.01)  # diffs +1, +1, -4 points
    table = markdown(record, "band")
    assert "| w | -9.0% | -4.0% | margin-1 -8.0% |" in table and "yes (-1.0 pt)" in table
    rows = policy_table(record).splitlines()
    assert rows[0] == "| policy | w |"
    assert rows[2] == "| legacy | 100 s · hit 50.0% |"
    assert rows[-1] == "| band | -9.0% [-10.0, -7.0] · hit 50.0% · 2 breaks |"
    gaps = regret_table(record).splitlines()
    assert gaps[0] == "| policy | w | worst gap |"
    assert gaps[3] == "| margin-2 | +4.0 | **+4.0** |"  # -4% against margin 1's -8%
    assert gaps[4] == "| band | -1.0 | **-1.0** |"
    with pytest.raises(ValueError, match="no 'margin-9' results for workload 'w'"):
        head_to_head(record, "w", "band", "margin-9")


def test_the_evidence_run_uses_the_long_agent_workload_unchanged() -> None:
    band = load_sweep(EXAMPLES / "context-band.toml")
    agent = load_sweep(EXAMPLES / "long-agent.toml")
    assert band.workloads[-1] == agent.workloads[0]
    assert [w.name for w in band.workloads[:4]] == ["ctx2k", "ctx9k", "ctx20k", "ctx9k-bigkv"]
    assert band.seeds == 30
    assert [p.name for p in band.policies] == [
        "legacy", "margin-0", "margin-1", "margin-2", "margin-4", "dual-4",
        "band-m1-T8192-cap4"]
