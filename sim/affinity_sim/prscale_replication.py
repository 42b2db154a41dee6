"""Replication of the sensitivity runs' explaining cells on 100 fresh seeds.

Theory of operation
-------------------
The step-size and KV-pool sensitivity runs (:mod:`affinity_sim.prscale_stepsize`,
:mod:`affinity_sim.prscale_pool`) each picked, per row, the setting whose legacy hit rate
is nearest the PR's (the "‡" cell), and read margin 2's change there as the held-out
test of the per-row-configuration explanation. They ran 10 seeds, so each cell's median
carries an interval 4-6 points wide: ctx20k at 128 prompts read -6.8% [-9.9%, -4.8%], which
leaves open whether the 3.3 points it falls short of the PR's -10.1% are a model gap or
the noise of 10 seeds.

This module re-runs exactly those cells, unchanged, on seeds 3000-3099 (no earlier run
used them): :data:`CELLS` names them and the run that picked each. The cells are the
workloads of those runs, looked up by name, so a cell cannot drift from its run. One
more cell is reported apart and decides nothing (:data:`REPORTED_APART`): ctx20k at 256
prompts, whose 10-seed interval [-11.1%, -5.8%] contained the PR's value although its
hit rate was not the nearest.

This is a **replication decided after the sensitivity runs**, registered before it ran
(sim/studies/README.md, "Replication of the explaining cells"); it changes no cell, no setting
and nothing in the prediction.
"""

from __future__ import annotations

import attrs

from .prscale import sensitivity_sweep
from .prscale_pool import pool_workloads
from .prscale_stepsize import step_size_workloads
from .sweep import Sweep
from .workload import Workload

__all__ = ["CELLS", "FIRST_SEED", "REPORTED_APART", "SEEDS", "replication_sweep",
           "replication_workloads"]

FIRST_SEED = 3000  # seeds 3000-3099: disjoint from every earlier PR-scale run (0-9, fits 1000-1001)
SEEDS = 100
# (cell, the sensitivity run whose ‡ it is): the setting nearest each row's PR hit rate.
CELLS = (("ctx2k/util-0.3", "pr7435-scale-pool"),
         ("ctx9k/prompts-256", "pr7435-scale-step-size"),
         ("ctx20k/prompts-128", "pr7435-scale-step-size"),
         ("ctx9k-bigkv/prompts-256", "pr7435-scale-step-size"))
REPORTED_APART = (("ctx20k/prompts-256", "pr7435-scale-step-size"),)


def replication_workloads() -> tuple[Workload, ...]:
    """The cells, taken by name from the runs that defined them."""
    defined = {w.name: w for w in (*step_size_workloads(), *pool_workloads())}
    return tuple(attrs.evolve(defined[name], description=defined[name].description
                              + f" (the ‡ cell of {run}, replicated)")
                 for name, run in (*CELLS, *REPORTED_APART))


def replication_sweep() -> Sweep:
    """Legacy and margin 2 on the cells, seeds 3000-3099."""
    base = sensitivity_sweep("pr7435-scale-replication", replication_workloads(),
                             "replication: the sensitivity runs' explaining cells on 100 "
                             "fresh seeds (decided after the sensitivity runs)")
    return attrs.evolve(base, seeds=SEEDS, first_seed=FIRST_SEED)
