"""affinity_runtime: what the adapters run beside the pure core, with I/O.

The core (:mod:`affinity_engine`) does no I/O; the conformance tooling
(:mod:`affinity_conformance`) checks what the adapters did. This package holds the runtime
pieces both adapters share and the checker reads: the decision-log writer and its format
(:mod:`affinity_runtime.decision_log`), the single-writer path lock
(:mod:`affinity_runtime.path_lock`) and the per-backend reuse meter that feeds the context
band (:mod:`affinity_runtime.reuse`), and the warm start from an old log
(:mod:`affinity_runtime.warm_start`). It imports conformance tooling in one place only:
the warm start replays an old log with the checker's own replay
(:mod:`affinity_conformance.log_replay`), imported when a restart finds a log, so the
restarted state is the replayed state by construction (SPEC R-LOG-3). Never test tooling.
"""

from .decision_log import (
    DEFAULT_DIGEST_EVERY,
    LOG_FORMAT,
    PROBLEM_KINDS,
    DecisionLogLocked,
    DecisionLogWriter,
    state_summary,
)
from .reuse import ReuseMeter

__all__ = [
    "DEFAULT_DIGEST_EVERY",
    "LOG_FORMAT",
    "PROBLEM_KINDS",
    "DecisionLogLocked",
    "DecisionLogWriter",
    "ReuseMeter",
    "state_summary",
]
