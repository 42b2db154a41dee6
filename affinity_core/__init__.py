"""affinity_core: the pure, typed, sans-IO definition of load-aware sticky routing.

``step(config, state, event)`` is the whole routing semantics of verl's
``GlobalRequestLoadBalancer`` with PR #7435's ``affinity_break_margin`` (and PR #6533's
dual-threshold gate as an alternative). See spec/SPEC.md for the requirements each
module implements.
"""

from .allowed import allowed, draw_for
from .config import (
    DEFAULT_MAX_CACHE_SIZE,
    Config,
    ConfigError,
    DualThreshold,
    HashMode,
    TieBreak,
    validate_margin,
)
from .events import (
    Acquire,
    AddServers,
    ClearStickyCache,
    Event,
    EventError,
    Release,
    RemoveServers,
)
from .hashing import stable_hash
from .leases import LeaseBook
from .loads import LoadTable
from .lru import StickyLru
from .machine import ACQUIRE_RULES, TRANSITIONS, Lookup, Transition, classify, step
from .outcomes import (
    NO_SERVERS_MESSAGE,
    Acquired,
    Outcome,
    Path,
    PoolChanged,
    Rejected,
    RejectReason,
    Released,
    ReleaseResult,
    StickyCacheCleared,
)
from .state import State, initial_state
from .status import VERL_STATUS_KEYS, status

__all__ = [
    "ACQUIRE_RULES",
    "DEFAULT_MAX_CACHE_SIZE",
    "NO_SERVERS_MESSAGE",
    "TRANSITIONS",
    "VERL_STATUS_KEYS",
    "Acquire",
    "Acquired",
    "AddServers",
    "ClearStickyCache",
    "Config",
    "ConfigError",
    "DualThreshold",
    "Event",
    "EventError",
    "HashMode",
    "LeaseBook",
    "LoadTable",
    "Lookup",
    "Outcome",
    "Path",
    "PoolChanged",
    "RejectReason",
    "Rejected",
    "Release",
    "ReleaseResult",
    "Released",
    "RemoveServers",
    "State",
    "StickyCacheCleared",
    "StickyLru",
    "TieBreak",
    "Transition",
    "allowed",
    "classify",
    "draw_for",
    "initial_state",
    "stable_hash",
    "status",
    "step",
    "validate_margin",
]
