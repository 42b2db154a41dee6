"""Sensitivity of ``pr7435-scale`` to the step size: does the per-row configuration explain it?

Theory of operation
-------------------
The prediction runs every row at 512 prompts x 16 samples (verl's ReTool recipe). Its
baseline hit rates then miss the PR's in opposite directions -- 86% against 8.7% at 2.2K,
3% against 99.7% on the large pool -- and sim/studies/README.md names the missing feature as the
*per-row configuration*: the PR says its workloads "are not directly comparable" and
states neither their step sizes nor their memory settings. Whether a cache thrashes is a
matter of trajectories in flight per replica against the pool, so the step size alone can
move a row from one side of that cliff to the other.

This module re-runs the four rows at other step sizes (:data:`STEP_PROMPTS`), all from
verl's recipes for this model and dataset, keeping every other input the preset's
(including the output medians: the trajectories are drawn from the same distributions,
only more or fewer of them):

* 1,536 prompts: the DAPO recipe for Qwen2.5-32B on DAPO-Math-17k generates
  ``gen_prompt_bsz = 3 x train_prompt_bsz = 1,536`` prompts per generation batch
  (``recipe/dapo/run_dapo_qwen2.5_32b.sh``, dynamic sampling), 24,576 trajectories;
  verl's sticky map then holds at most ``max_cache_size`` 10,000 of them, and the real
  core evicts the rest as verl does;
* 256 and 128 prompts: smaller ``train_batch_size`` values of the same recipes.

The hypothesis under test is that of sim/studies/README.md: *with the step size that reproduces
a row's baseline hit rate, the model also reproduces its margin-2 change.* The hit rate is
the observable used to pick the step size; margin 2's change is held out. This is a
**sensitivity analysis decided after the prediction missed**. Its grid and reading rule
were committed before it ran (sim/studies/README.md, "Sensitivity: step size"); it replaces
nothing in the prediction.
"""

from __future__ import annotations

import attrs

from .prscale import scale_workloads, sensitivity_sweep
from .sweep import Sweep
from .workload import Workload

__all__ = ["STEP_PROMPTS", "step_size_sweep", "step_size_workloads"]

# Prompts per step (x 16 samples, on 16 replicas); 512 is the prediction's own record.
STEP_PROMPTS = (128, 256, 1536)


def step_size_workloads() -> tuple[Workload, ...]:
    """Every row at every :data:`STEP_PROMPTS` size, named ``row/prompts-N``."""
    return tuple(
        attrs.evolve(w, name=f"{w.name}/prompts-{prompts}",
                     description=f"{w.description}; {prompts} prompts x 16 samples")
        for prompts in STEP_PROMPTS for w in scale_workloads(prompts=prompts))


def step_size_sweep() -> Sweep:
    """Legacy and margin 2 on the four rows at each step size, 10 seeds."""
    return sensitivity_sweep("pr7435-scale-step-size", step_size_workloads(),
                             "sensitivity: pr7435-scale at other step sizes (decided after "
                             "the prediction missed)")
