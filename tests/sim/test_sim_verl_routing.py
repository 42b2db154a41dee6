"""The referee's simulated column (docs/verl-routing.md): its run file and its prediction."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs
import pytest
from affinity_sim.presets import load_sweep
from affinity_sim.records import RecordError
from affinity_sim.simulate import StepResult
from affinity_sim.verl_routing import (
    ROW_POLICIES,
    Claim,
    ClaimError,
    acceptance_table,
    claim_row,
    evaluate,
    load_claims,
    paired,
    pr_scale_record,
    prediction_table,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "sim" / "examples"


def test_the_run_is_the_context_band_workloads_with_mains_first_ties() -> None:
    referee = load_sweep(EXAMPLES / "verl-routing.toml")
    band = load_sweep(EXAMPLES / "context-band.toml")
    assert [w.tie_break for w in referee.workloads] == ["first"] * 5
    assert [w.tie_break for w in band.workloads] == ["draw"] * 5  # why a new run was needed
    assert [attrs.evolve(w, tie_break="draw") for w in referee.workloads] == list(band.workloads)
    assert referee.seed_list() == list(range(30))
    configs = {p.name: p.config("first") for p in referee.policies}
    assert configs["legacy"].tie_break.value == "first"  # Aug-2026 main
    assert configs["legacy-draw"].tie_break.value == "draw"  # #7613
    assert configs["margin-2"].affinity_break_margin == 2  # #7435's recommended margin
    gate = configs["dual-64"].dual_threshold  # #6533's defaults at its head
    assert gate is not None
    assert (gate.balance_abs_threshold, gate.balance_rel_threshold) == (64, Fraction(3, 2))



def _record(times: dict[tuple[str, str], list[float]]) -> dict[str, Any]:
    # full step rows (every other measurement 0), as affinity simulate --json writes them
    zeros = {a.name: 0 for a in StepResult.__attrs_attrs__}
    return {"results": [{**zeros, "workload": w, "policy": p, "seed": s, "step_time_s": t,
                         "requests_per_replica": []}
                        for (w, p), ts in times.items() for s, t in enumerate(ts)]}


BASE = [100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0, 170.0, 180.0, 190.0]


def _claim(**fields: object) -> Claim:
    table = {"row": "#1", "scale": "calibrated", "workloads": ("ctx2k",), "why": "w", **fields}
    return Claim(**table)  # type: ignore[arg-type]


def test_paired_changes_and_identical_runs() -> None:
    record = _record({("ctx2k", "legacy"): BASE,
                      ("ctx2k", "same"): list(BASE),
                      ("ctx2k", "fast"): [t * 0.9 for t in BASE]})
    same = paired(record, "ctx2k", "same")
    assert same.always_identical and same.median == 0 and same.p_value == 1.0
    fast = paired(record, "ctx2k", "fast")
    assert fast.identical == 0 and abs(fast.median + 0.1) < 1e-12
    assert fast.ci_high < 0
    with pytest.raises(ClaimError, match="no 'gone' results for workload 'ctx2k'"):
        paired(record, "ctx2k", "gone")


def test_every_claim_kind_can_hit_and_can_miss() -> None:
    record = _record({("ctx2k", "legacy"): BASE,
                      ("ctx2k", "same"): list(BASE),
                      ("ctx2k", "fast"): [t * 0.9 for t in BASE],
                      ("ctx2k", "slow"): [t * 1.05 for t in BASE],
                      ("ctx2k", "noisy"): [t * (1.01 if i % 2 else 0.99)
                                           for i, t in enumerate(BASE)]})
    reference = _record({("ctx2k", "legacy"): BASE, ("ctx2k", "fast"): [t * 0.8 for t in BASE]})
    records = {"calibrated": record, "ref": reference}

    def hit(**fields: object) -> bool:
        [outcome] = evaluate(_claim(**fields), records)
        return outcome.hit

    assert hit(expect="identical", policy="same")
    assert not hit(expect="identical", policy="noisy")
    assert hit(expect="faster", policy="fast") and not hit(expect="faster", policy="slow")
    assert hit(expect="slower", policy="slow") and not hit(expect="slower", policy="fast")
    assert hit(expect="null", policy="noisy") and not hit(expect="null", policy="fast")
    assert hit(expect="within", policy="slow", low=4.0, high=6.0)
    assert not hit(expect="within", policy="slow", low=-1.0, high=1.0)
    assert hit(expect="order", faster_policy="fast", slower_policy="slow")
    assert not hit(expect="order", faster_policy="slow", slower_policy="fast")
    assert hit(expect="close", policy="fast", other_policy="slow", points=15.5)
    assert not hit(expect="close", policy="fast", other_policy="slow", points=14.5)
    assert hit(expect="near", policy="fast", reference="ref", points=10.5)
    assert not hit(expect="near", policy="fast", reference="ref", points=9.5)
    with pytest.raises(ClaimError, match="no reference record 'nope'"):
        hit(expect="near", policy="fast", reference="nope", points=1.0)
    table = prediction_table(records, [_claim(expect="faster", policy="fast"),
                                       _claim(expect="faster", policy="slow")])
    assert "| hit |" in table and "| **miss** |" in table
    assert table.endswith("1 of 2 registered claims hit; 1 missed.")


def test_a_malformed_claim_is_refused_naming_it() -> None:
    good = ('[[claim]]\nrow = "#1"\nscale = "calibrated"\nworkloads = ["ctx2k"]\n'
            'policy = "margin-2"\nexpect = "faster"\nwhy = "w"\n')
    assert load_claims(good)[0].workloads == ("ctx2k",)
    for bad, fragment in [(good.replace('"faster"', '"quicker"'), "expect must be one of"),
                          (good.replace('["ctx2k"]', '["ctx3k"]'), "workloads must be"),
                          (good.replace('"calibrated"', '"huge"'), "scale must be one of"),
                          (good + "colour = 1\n", "unknown keys ['colour']"),
                          ("", "no [[claim]] table")]:
        with pytest.raises(ClaimError, match=re.escape(fragment)):
            load_claims(bad)


def test_the_pr_scale_runs_are_paired_only_if_their_legacy_rows_agree() -> None:
    new = _record({("ctx9k", "legacy"): BASE, ("ctx9k", "dual-64"): BASE})
    earlier = _record({("ctx9k", "legacy"): BASE, ("ctx9k", "margin-2"): BASE,
                       ("agent-80k", "legacy"): BASE})
    merged = pr_scale_record(new, earlier)
    assert {(r["workload"], r["policy"]) for r in merged["results"]} == {
        ("ctx9k", "legacy"), ("ctx9k", "dual-64"), ("ctx9k", "margin-2")}
    # seeds the new run lacks are left out of every policy alike
    short = _record({("ctx9k", "legacy"): BASE[:4], ("ctx9k", "dual-64"): BASE[:4]})
    assert {r["seed"] for r in pr_scale_record(short, earlier)["results"]} == {0, 1, 2, 3}
    drifted = _record({("ctx9k", "legacy"): [t + 1 for t in BASE]})
    with pytest.raises(RecordError, match="disagree"):
        pr_scale_record(new, drifted)


def test_the_registered_predictions_are_well_formed() -> None:
    studies = ROOT / "sim" / "studies"
    claims = load_claims((studies / "verl-routing-prediction.toml").read_text(encoding="utf-8"))
    groups = load_claims((studies / "group-pins-prediction.toml").read_text(encoding="utf-8"))
    prefix = load_claims(
        (studies / "prefix-placement-prediction.toml").read_text(encoding="utf-8"))
    index = load_claims((studies / "prefix-index-prediction.toml").read_text(encoding="utf-8"))
    index_pr = load_claims(
        (studies / "prefix-index-prscale-prediction.toml").read_text(encoding="utf-8"))
    every = claims + groups + prefix + index + index_pr
    assert {c.row for c in every} == {claim_row(row) for row in ROW_POLICIES}
    assert {c.row for c in groups} == {"#6122", "group pins with a band"}
    assert {c.row for c in prefix} == {"prefix placement in the band",
                                       "group pins and prefix placement in the band"}
    for file_claims in (index, index_pr):
        assert {c.row for c in file_claims} == {"prefix placement in the band, adapters' index",
                                                "both together, adapters' index"}
    assert {c.scale for c in index} == {"calibrated"} and {c.scale for c in index_pr} == {
        "pr-scale"}
    # a claim's policy is a row's, or one the prefix run adds beside its row's
    for claim in every:
        assert claim.policy in (None, *ROW_POLICIES.values(), "prefix-p1-margin-2"), claim


def test_the_prefix_run_is_the_referees_workloads() -> None:
    referee = load_sweep(EXAMPLES / "verl-routing.toml")
    prefix = load_sweep(EXAMPLES / "verl-routing-prefix.toml")
    assert prefix.workloads == referee.workloads and prefix.seed_list() == referee.seed_list()
    assert [p.name for p in prefix.policies] == [
        "legacy", "prefix-p1-margin-2", "prefix-p2-margin-2", "prefix-p2-group-margin-2"]


def test_the_index_run_is_the_prefix_runs_configurations_on_the_same_workloads() -> None:
    prefix = load_sweep(EXAMPLES / "verl-routing-prefix.toml")
    index = load_sweep(EXAMPLES / "verl-routing-prefix-index.toml")
    assert index.workloads == prefix.workloads and index.seed_list() == prefix.seed_list()
    by_name = {p.name: p for p in prefix.policies}
    for policy in index.policies[1:]:
        assert policy.prefix_source == "index"
        twin = by_name[policy.name.removesuffix("-index")]
        # the core sees the same configuration: only the adapter's estimate differs
        assert policy.config("first") == twin.config("first")


def test_two_policies_compared_directly_use_the_seeds_both_ran() -> None:
    record = _record({("ctx2k", "legacy"): BASE, ("ctx2k", "a"): [t * 0.9 for t in BASE],
                      ("ctx2k", "b"): [t * 0.8 for t in BASE[:5]] + [t * 1.2 for t in BASE[5:]]})
    short = {"results": [r for r in record["results"]
                         if not (r["policy"] == "b" and r["seed"] >= 5)]}
    # on all ten seeds b's median is slower than a's; on the five b ran it is faster
    claim = _claim(expect="order", faster_policy="b", slower_policy="a")
    assert not evaluate(claim, {"calibrated": record})[0].hit
    assert evaluate(claim, {"calibrated": short})[0].hit
    assert paired(short, "ctx2k", "a", among="b").seeds == 5
    assert paired(short, "ctx2k", "a").seeds == 10


def test_the_acceptance_table_meets_only_a_significant_win_on_enough_workloads() -> None:
    workloads = ("ctx2k", "ctx9k", "ctx20k")
    rows: dict[tuple[str, str], list[float]] = {}
    for w in workloads:
        rows[(w, "rival")] = BASE
        rows[(w, "winner")] = [t * 0.95 for t in BASE]
        rows[(w, "tie")] = [t + (1 if i % 2 else -1) for i, t in enumerate(BASE)]
    record = _record(rows)
    won = acceptance_table(record, "winner", ("rival",), workloads, needed=3)
    assert won.endswith("Target **met**.") and won.count("**beats**") == 3
    # negative controls: no significant win, or one workload short of the target
    tied = acceptance_table(record, "tie", ("rival",), workloads, needed=3)
    assert tied.endswith("Target **missed**.") and "**beats**" not in tied
    assert acceptance_table(record, "winner", ("rival",), workloads, needed=4).endswith(
        "Target **missed**.")


def test_the_group_run_is_the_referees_workloads() -> None:
    referee = load_sweep(EXAMPLES / "verl-routing.toml")
    groups = load_sweep(EXAMPLES / "verl-routing-groups.toml")
    assert groups.workloads == referee.workloads and groups.seed_list() == referee.seed_list()
    assert [p.name for p in groups.policies] == ["legacy", "group-only", "group-margin-2"]


def _rows(name: str, policy: str) -> dict[tuple[str, int], float]:
    record = json.loads((ROOT / "sim" / f"{name}.json").read_text(encoding="utf-8"))
    return {(r["workload"], r["seed"]): r["step_time_s"] for r in record["results"]
            if r["policy"] == policy}


def test_the_recorded_random_ties_equal_the_context_band_runs_legacy() -> None:
    # the same workloads with random ties: if these differ, the two records are not the same
    # code and seeds, and the "near" claim compares different things
    draw = _rows("verl-routing", "legacy-draw")
    assert len(draw) == 150 and draw == _rows("context-band", "legacy")
    # negative control: main's first ties do not reproduce them
    assert _rows("verl-routing", "legacy") != draw
