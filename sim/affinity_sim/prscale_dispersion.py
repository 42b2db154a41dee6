"""Sensitivity of ``pr7435-scale`` to its one unsourced shape input: output dispersion.

Theory of operation
-------------------
``pr7435-scale`` draws every turn's output length from a lognormal with log-sigma 0.8 in
every row (the calibrated preset's assumption; no source gives the spread of this
model's per-turn reasoning lengths on DAPO-Math). In a step where legacy routing pins
~512 trajectories to each replica at their first turn, how unevenly the replicas'
work ends up spread -- which is what a margin can recover -- grows with that spread. So
the magnitude of every policy's change depends on an input the prediction had to assume.

This module re-runs the four rows at other values of that one input, the
**total log-sigma** ``s`` of a turn's output (:data:`DISPERSIONS`), keeping everything
else the preset's. Two things are held fixed so that only the spread moves:

* the split of the log-variance, half between prompts (the GRPO difficulty factor) and
  half within (per turn), exactly as in the preset: ``difficulty = within = s / sqrt 2``;
* each row's mean final context (the PR's 2.2K / 8.7K / 19.8K): the output median is
  re-fitted per ``(row, s)`` on the drawn plans alone, seeds 1000-1001, with the same
  bisection as the preset (:func:`~affinity_sim.calibrate.fit_output_median`; no
  simulation). ``ctx9k-bigkv`` draws ``ctx9k``'s plans, so it shares its medians.

This is a **sensitivity analysis, decided after the prediction missed**. Its grid,
expectations and reading rule were committed before it ran (sim/studies/README.md, "Sensitivity:
output-length dispersion"). It replaces nothing in the prediction, and no value of ``s``
is chosen from it.

The medians are recorded in :data:`DISPERSION_MEDIANS` by this module's ``__main__``;
``tests/sim/test_sim_prscale_sensitivity.py`` checks that they still give the contexts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from .distributions import parse
from .prscale import CONTEXTS, OUTPUT_SIGMA, fit_shape_medians, scale_workloads, sensitivity_sweep
from .sweep import Sweep
from .workload import Workload

__all__ = ["DISPERSIONS", "DISPERSION_MEDIANS", "dispersed", "dispersion_sweep",
           "dispersion_workloads", "fit_dispersion_medians"]

FIT_SEEDS = (1000, 1001)  # the preset's fit seeds, disjoint from the evaluation seeds 0..
# The total log-sigma of a turn's output, around the preset's 0.8 (not re-run here: its
# record is the prediction itself). Fixed before the run.
DISPERSIONS = (0.5, 1.1, 1.4)


def dispersed(workload: Workload, sigma: float, median: float) -> Workload:
    """``workload`` with a turn's output at total log-sigma ``sigma`` and ``median``.

    Half the log-variance is the per-prompt difficulty, half the per-turn draw.
    """
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not sigma > 0:
        raise ValueError(f"sigma must be a log-sigma > 0, got {sigma!r}")
    if isinstance(median, bool) or not isinstance(median, (int, float)) or not median > 0:
        raise ValueError(f"median must be a number of tokens > 0, got {median!r}")
    half = sigma / math.sqrt(2)
    return attrs.evolve(workload, difficulty_sigma=half, output_tokens=parse(
        "output_tokens", {"dist": "lognormal", "median": median, "sigma": half}))


def fit_dispersion_medians(sigmas: Sequence[float] = DISPERSIONS,
                           seeds: Sequence[int] = FIT_SEEDS
                           ) -> dict[tuple[str, float], tuple[float, float]]:
    """Per (row, sigma): (output median, achieved mean final context), within 1%."""
    def shape(w: Workload, sigma: float) -> Workload:
        return dispersed(w, sigma, float(dict(w.output_tokens.params)["median"]))

    return fit_shape_medians(shape, sigmas, seeds)


# Recorded by ``python -m affinity_sim.prscale_dispersion`` (seeds 1000-1001), to 0.1
# token; each gives its row's context within 1%. ctx9k-bigkv draws ctx9k's plans.
DISPERSION_MEDIANS: dict[tuple[str, float], float] = {
    ("ctx2k", 0.5): 495.6, ("ctx2k", 1.1): 407.8, ("ctx2k", 1.4): 346.7,
    ("ctx9k", 0.5): 2_557.1, ("ctx9k", 1.1): 2_115.6, ("ctx9k", 1.4): 1_961.2,
    ("ctx20k", 0.5): 6_455.2, ("ctx20k", 1.1): 5_832.0, ("ctx20k", 1.4): 5_487.3,
    ("ctx9k-bigkv", 0.5): 2_557.1, ("ctx9k-bigkv", 1.1): 2_115.6,
    ("ctx9k-bigkv", 1.4): 1_961.2,
}


def dispersion_workloads() -> tuple[Workload, ...]:
    """Every row at every :data:`DISPERSIONS` value, named ``row/sigma-S``."""
    rows = []
    for sigma in DISPERSIONS:
        for w in scale_workloads():
            median = DISPERSION_MEDIANS[(w.name, sigma)]
            rows.append(attrs.evolve(
                dispersed(w, sigma, median), name=f"{w.name}/sigma-{sigma}",
                description=f"{w.description}; output log-sigma {sigma} (preset "
                            f"{OUTPUT_SIGMA}), median {median:,.0f}"))
    return tuple(rows)


def dispersion_sweep() -> Sweep:
    """Legacy and margin 2 on the four rows at each dispersion, 10 seeds."""
    return sensitivity_sweep("pr7435-scale-dispersion", dispersion_workloads(),
                             "sensitivity: pr7435-scale at other output log-sigmas, the "
                             "contexts held (decided after the prediction missed)")


if __name__ == "__main__":
    for (row, sigma), (median, context) in fit_dispersion_medians().items():
        print(f"{row} sigma {sigma}: output median {median:,.0f} -> mean final context "
              f"{context:,.0f} (target {CONTEXTS[row]:,})")
