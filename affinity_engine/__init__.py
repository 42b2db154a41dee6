"""affinity_engine: the pure, typed, sans-IO definition of load-aware sticky routing.

``step(config, state, event)`` is the whole routing semantics of verl's
``GlobalRequestLoadBalancer`` with PR #7435's ``affinity_break_margin`` (and PR #6533's
dual-threshold gate as an alternative). See spec/SPEC.md for the requirements each
module implements.

``BUILD`` says which build of the core this process runs: ``"pure"`` (this source) or
``"compiled"`` (the same source compiled with mypyc; see benchmarks/README.md). A
compiled build lives in the subpackage ``_native`` that only a compiled install has; it
decides at import time whether to put itself in front of this source (environment
variable ``AFFINITY_BUILD=auto|pure|compiled``) and refuses to when its recorded source
digests differ from the source here, so the two cannot drift.
"""

from affinity_core.config import (
    DEFAULT_MAX_CACHE_SIZE,
    Config,
    ConfigError,
    DualThreshold,
    GroupStickiness,
    HashMode,
    TieBreak,
    validate_margin,
)
from affinity_core.events import (
    Acquire,
    AddServers,
    ClearStickyCache,
    Event,
    EventError,
    ObserveLoads,
    Release,
    RemoveServers,
)
from affinity_core.hashing import stable_hash
from affinity_core.outcomes import (
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

from ._build import BUILD
from .allowed import allowed, draw_for
from .builders import acquire_event, release_event
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
from .cursor import Cursor, KeyedBalancer
from .leases import LeaseBook
from .loads import LoadTable
from .lru import StickyLru
from .machine import ACQUIRE_RULES, TRANSITIONS, Lookup, Transition, classify, step
from .policy import needs_draw, needs_request_hash
from .state import GroupPins, State, initial_state
from .status import VERL_STATUS_KEYS, status

__all__ = [
    "ACQUIRE_RULES",
    "BUILD",
    "DEFAULT_MAX_CACHE_SIZE",
    "NO_SERVERS_MESSAGE",
    "TRANSITIONS",
    "VERL_STATUS_KEYS",
    "Acquire",
    "Acquired",
    "AddServers",
    "ClearStickyCache",
    "CodecError",
    "Config",
    "ConfigError",
    "Cursor",
    "DualThreshold",
    "Event",
    "EventError",
    "GroupPins",
    "GroupStickiness",
    "HashMode",
    "KeyedBalancer",
    "LeaseBook",
    "LoadTable",
    "LoadsObserved",
    "Lookup",
    "ObserveLoads",
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
