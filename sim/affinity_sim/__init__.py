"""affinity_sim: a discrete-event simulator of rollout generation steps.

One rollout step (prompts x samples multi-turn trajectories on a fleet of vLLM-like
replicas with continuous batching and a block prefix cache) is simulated on simpy, with
every routing decision made by the real ``affinity_engine`` through the events an adapter
sends. ``affinity simulate`` runs paired sweeps over policies and seeds; see sim/README.md
for the model, its calibration and its limits.
"""

from .costmodel import QWEN25_32B_TP4_H200, ReplicaModel, derive
from .presets import PRESETS, load_sweep, preset
from .routing import BASELINE, DEFAULT_POLICIES, Balancer, PolicySpec, parse_policies, parse_policy
from .simulate import StepResult, simulate_step
from .stats import PolicySummary, summarize
from .sweep import Sweep, run_sweep, run_task
from .workload import TrajectoryPlan, Workload, plan_step

__all__ = [
    "BASELINE",
    "DEFAULT_POLICIES",
    "PRESETS",
    "QWEN25_32B_TP4_H200",
    "Balancer",
    "PolicySpec",
    "PolicySummary",
    "ReplicaModel",
    "StepResult",
    "Sweep",
    "TrajectoryPlan",
    "Workload",
    "derive",
    "load_sweep",
    "parse_policies",
    "parse_policy",
    "plan_step",
    "preset",
    "run_sweep",
    "run_task",
    "simulate_step",
    "summarize",
]
