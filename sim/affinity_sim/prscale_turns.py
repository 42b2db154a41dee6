"""Sensitivity of ``pr7435-scale`` to its turn-count assumption.

Theory of operation
-------------------
``pr7435-scale`` draws 1-5 assistant turns per trajectory, uniformly (mean 3). The source
is the ReTool recipe's SFT model, which reports ``num_turns/mean`` 7.2, about 3.1
assistant turns. The PR, though, says its runs "do not cover ... instruct-tuned models",
so its policy may not have been a tool-tuned one, and a model that calls its tool less
often has fewer turns. Turns are what a margin acts on: a trajectory's first turn is
placed on the least-loaded replica in every policy, and only later turns can be kept or
moved. So the turn count bears directly on what margin 2 can change.

This module re-runs the four rows with the turn count drawn from a truncated geometric
law on 1-5, ``P(k) ~ q^(k-1)`` (:data:`TURN_RATIOS`; ``q = 1`` is the preset's uniform).
``q < 1`` is a model that mostly answers at once (q 0.25: mean 1.33 turns, 75% single
turn; q 0.5: mean 1.84); ``q = 2`` mirrors q 0.5 (mean 4.16). Each row's mean final
context is held: the output median is re-fitted per (row, q) on the drawn plans alone
(seeds 1000-1001, no simulation). Every other input is the preset's.

This is a **sensitivity analysis, decided after the prediction missed**. Its grid,
expectations and reading rule were committed before it ran (sim/studies/README.md,
"Sensitivity: turn count"); it replaces nothing in the prediction.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .calibrate import _with_median
from .distributions import parse
from .prscale import CONTEXTS, fit_shape_medians, scale_workloads, sensitivity_sweep
from .sweep import Sweep
from .workload import Workload

__all__ = ["TURN_MEDIANS", "TURN_RATIOS", "fit_turn_medians", "turn_sweep", "turn_workloads",
           "with_turn_ratio"]

FIT_SEEDS = (1000, 1001)  # the preset's fit seeds, disjoint from the evaluation seeds 0..
TURN_RATIOS = (0.25, 0.5, 2.0)  # q; 1 (uniform) is the prediction's own record
MAX_TURNS = 5


def with_turn_ratio(workload: Workload, q: float) -> Workload:
    """``workload`` with ``P(k turns) ~ q^(k-1)`` on 1..5."""
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not q > 0:
        raise ValueError(f"q must be a turn-count ratio > 0, got {q!r}")
    weights = [float(q) ** k for k in range(MAX_TURNS)]
    return attrs.evolve(workload, turns=parse("turns", {
        "dist": "choice", "values": list(range(1, MAX_TURNS + 1)), "weights": weights}))


def fit_turn_medians(ratios: Sequence[float] = TURN_RATIOS, seeds: Sequence[int] = FIT_SEEDS
                     ) -> dict[tuple[str, float], tuple[float, float]]:
    """Per (row, q): (output median, achieved mean final context), within 1%."""
    return fit_shape_medians(with_turn_ratio, ratios, seeds)


# Recorded by ``python -m affinity_sim.prscale_turns`` (seeds 1000-1001), to 0.1 token;
# each gives its row's context within 1%. ctx9k-bigkv draws ctx9k's plans.
TURN_MEDIANS: dict[tuple[str, float], float] = {
    ("ctx2k", 0.25): 1_191.7, ("ctx2k", 0.5): 833.6, ("ctx2k", 2.0): 280.7,
    ("ctx9k", 0.25): 5_668.5, ("ctx9k", 0.5): 4_185.7, ("ctx9k", 2.0): 1_562.2,
    ("ctx20k", 0.25): 14_543.9, ("ctx20k", 0.5): 10_944.9, ("ctx20k", 2.0): 3_965.1,
    ("ctx9k-bigkv", 0.25): 5_668.5, ("ctx9k-bigkv", 0.5): 4_185.7,
    ("ctx9k-bigkv", 2.0): 1_562.2,
}


def turn_workloads() -> tuple[Workload, ...]:
    """Every row at every :data:`TURN_RATIOS` value, named ``row/q-Q``."""
    rows = []
    for q in TURN_RATIOS:
        for w in scale_workloads():
            median = TURN_MEDIANS[(w.name, q)]
            shaped = with_turn_ratio(w, q)
            rows.append(attrs.evolve(
                shaped, output_tokens=_with_median(shaped.output_tokens, median),
                name=f"{w.name}/q-{q:g}",
                description=f"{w.description}; turns P(k) ~ {q:g}^(k-1) on 1-{MAX_TURNS}, "
                            f"output median {median:,.0f}"))
    return tuple(rows)


def turn_sweep() -> Sweep:
    """Legacy and margin 2 on the four rows at each turn-count ratio, 10 seeds."""
    return sensitivity_sweep("pr7435-scale-turns", turn_workloads(),
                             "sensitivity: pr7435-scale with other turn-count laws, the "
                             "contexts held (decided after the prediction missed)")


if __name__ == "__main__":
    for (row, q), (median, context) in fit_turn_medians().items():
        print(f"{row} q {q:g}: output median {median:,.1f} -> mean final context "
              f"{context:,.0f} (target {CONTEXTS[row]:,})")
