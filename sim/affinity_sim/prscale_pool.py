"""Sensitivity of ``pr7435-scale`` to the KV pool of its three ordinary rows.

Theory of operation
-------------------
The prediction derives the pool from the model and verl 0.9.1's default
``gpu_memory_utilization`` 0.5 for the three ordinary rows (789,642 tokens a replica),
and from the ReTool recipe's 0.9 for the "large KV pool" row. The PR states no memory
setting, and in verl's hybrid engine the rollout's share is commonly set below or above
the default to leave room for the colocated actor. Together with the step size
(:mod:`affinity_sim.prscale_stepsize`), the pool is the other half of the *per-row
configuration* that sim/studies/README.md names as the missing feature: whether a replica's
cache thrashes is a matter of the conversations in flight against it.

This module re-runs the three ordinary rows at other utilizations
(:data:`UTILIZATIONS`; 0.5 is the prediction's own record, 0.9 is the ablation's
``pool-0.9``). The pool follows from the model as in the preset
(:func:`~affinity_sim.costmodel.kv_capacity_tokens`): 359K / 574K / 1.22M tokens at
0.3 / 0.4 / 0.7. The large-pool row is not re-run: its 0.9 is already near the
physical ceiling. Everything else is the preset's.

The hypothesis under test: at the pool that reproduces a row's baseline hit rate, the
model also reproduces its margin-2 change. This is a **sensitivity analysis decided
after the prediction missed**; its grid and reading rule were committed before it ran
(sim/studies/README.md, "Sensitivity: KV pool"). It replaces nothing in the prediction.
"""

from __future__ import annotations

import attrs

from .prscale import replica_model, scale_workloads, sensitivity_sweep
from .sweep import Sweep
from .workload import Workload

__all__ = ["ORDINARY_ROWS", "UTILIZATIONS", "pool_sweep", "pool_workloads"]

UTILIZATIONS = (0.3, 0.4, 0.7)  # gpu_memory_utilization; 0.5 is the prediction's record
ORDINARY_ROWS = ("ctx2k", "ctx9k", "ctx20k")


def pool_workloads() -> tuple[Workload, ...]:
    """The three ordinary rows at every :data:`UTILIZATIONS` value, named ``row/util-U``."""
    rows = []
    for utilization in UTILIZATIONS:
        pool = replica_model(utilization).kv_capacity_tokens
        for w in scale_workloads():
            if w.name not in ORDINARY_ROWS:
                continue
            rows.append(attrs.evolve(
                w, model=attrs.evolve(w.model, kv_capacity_tokens=pool),
                name=f"{w.name}/util-{utilization:g}",
                description=f"{w.description}; gpu_memory_utilization {utilization:g} "
                            f"({pool:,} KV tokens a replica)"))
    return tuple(rows)


def pool_sweep() -> Sweep:
    """Legacy and margin 2 on the ordinary rows at each utilization, 10 seeds."""
    return sensitivity_sweep("pr7435-scale-pool", pool_workloads(),
                             "sensitivity: pr7435-scale's ordinary rows at other KV pools "
                             "(decided after the prediction missed)")
