"""affinity_runtime: what the adapters run beside the pure core, with I/O.

The core (:mod:`affinity_engine`) does no I/O; the conformance tooling
(:mod:`affinity_conformance`) checks what the adapters did. This package holds the runtime
pieces the adapters and the simulator share: the one driver of the core
(:mod:`affinity_runtime.driver`: the state, its events, tie draws, leases and the decision
log, which verl's balancer, the vLLM router's routing table and the simulator's balancer
wrap), the decision-log writer and its format (:mod:`affinity_runtime.decision_log`), the
single-writer path lock (:mod:`affinity_runtime.path_lock`), the per-backend reuse meter
that feeds the context band (:mod:`affinity_runtime.reuse`) and the warm start from an
old log (:mod:`affinity_runtime.warm_start`, which replays it with its own few lines
rather than the checker's). It never imports conformance or test tooling
(``tests/test_runtime_layering.py``).
"""

from .decision_log import (
    DEFAULT_DIGEST_EVERY,
    LOG_FORMAT,
    PROBLEM_KINDS,
    DecisionLogLocked,
    DecisionLogWriter,
    state_summary,
)
from .driver import DecisionLogUnavailable, Lease, RoutingDriver, seeded_draw
from .reuse import ReuseMeter

__all__ = [
    "DEFAULT_DIGEST_EVERY",
    "LOG_FORMAT",
    "PROBLEM_KINDS",
    "DecisionLogLocked",
    "DecisionLogUnavailable",
    "DecisionLogWriter",
    "Lease",
    "ReuseMeter",
    "RoutingDriver",
    "seeded_draw",
    "state_summary",
]
