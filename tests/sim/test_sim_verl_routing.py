"""The referee's simulated column (docs/verl-routing.md): its run file and its prediction."""

from __future__ import annotations

from pathlib import Path

import attrs
from affinity_sim.presets import load_sweep

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
    assert gate is not None and (gate.balance_abs_threshold, gate.balance_rel_threshold) == (
        64, 1.5)

