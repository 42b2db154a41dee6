"""affinity_core: the readable reference of load-aware sticky routing.

``step(config, state, event)`` is the whole routing semantics of verl's
``GlobalRequestLoadBalancer`` with PR #7435's ``affinity_break_margin`` (and PR #6533's
dual-threshold gate as an alternative, and opt-in group pins after PR #6122), as
spec/SPEC.md states it. It is written to be
read next to the spec: frozen values, plain data structures, no caches, no I/O, no clock,
no randomness, no builtin ``hash()``, no floats in decisions.

Modules, in SPEC order: :mod:`.config` (§2), :mod:`.state` (§3), :mod:`.events` (§4),
:mod:`.outcomes` (§5), :mod:`.sticky` (§6), :mod:`.policy` (§7-§9), :mod:`.machine`
(§10-§11), :mod:`.leases` (§12), :mod:`.allowed` (§14), :mod:`.status` (§15),
:mod:`.codec` (§16) and :mod:`.hashing` (R-HASH-1).

The optimised implementation that adapters run is ``affinity_engine``; ``affinity
verify`` proves it equal to this package (the refinement obligation).
"""

from .allowed import allowed, draw_for
from .codec import (
    CodecError,
    canonical_dumps,
    config_from_json,
    config_to_json,
    event_from_json,
    event_to_json,
    outcome_to_json,
    state_digest,
    state_from_json,
    state_to_json,
)
from .config import (
    DEFAULT_MAX_CACHE_SIZE,
    Config,
    ConfigError,
    DualThreshold,
    GroupStickiness,
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
    ObserveLoads,
    Release,
    RemoveServers,
    acquire_event,
    release_event,
)
from .hashing import stable_hash
from .leases import LeaseBook
from .machine import (
    ACQUIRE_RULES,
    TRANSITIONS,
    AcquireRule,
    Choice,
    Counter,
    Lookup,
    Recency,
    Transition,
    classify,
    step,
)
from .outcomes import (
    NO_SERVERS_MESSAGE,
    Acquired,
    LoadsObserved,
    Outcome,
    Path,
    PoolChanged,
    Rejected,
    RejectReason,
    Released,
    ReleaseResult,
    StickyCacheCleared,
)
from .policy import needs_draw, needs_request_hash
from .state import State, initial_state
from .status import VERL_STATUS_KEYS, status

__all__ = [
    "ACQUIRE_RULES",
    "DEFAULT_MAX_CACHE_SIZE",
    "NO_SERVERS_MESSAGE",
    "TRANSITIONS",
    "VERL_STATUS_KEYS",
    "Acquire",
    "AcquireRule",
    "Acquired",
    "AddServers",
    "Choice",
    "ClearStickyCache",
    "CodecError",
    "Config",
    "ConfigError",
    "Counter",
    "DualThreshold",
    "Event",
    "EventError",
    "GroupStickiness",
    "HashMode",
    "LeaseBook",
    "LoadsObserved",
    "Lookup",
    "ObserveLoads",
    "Outcome",
    "Path",
    "PoolChanged",
    "Recency",
    "RejectReason",
    "Rejected",
    "Release",
    "ReleaseResult",
    "Released",
    "RemoveServers",
    "State",
    "StickyCacheCleared",
    "TieBreak",
    "Transition",
    "acquire_event",
    "allowed",
    "canonical_dumps",
    "classify",
    "config_from_json",
    "config_to_json",
    "draw_for",
    "event_from_json",
    "event_to_json",
    "initial_state",
    "needs_draw",
    "needs_request_hash",
    "outcome_to_json",
    "release_event",
    "stable_hash",
    "state_digest",
    "state_from_json",
    "state_to_json",
    "status",
    "step",
    "validate_margin",
]
