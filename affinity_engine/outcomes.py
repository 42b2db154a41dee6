"""Outcomes: what one :func:`~affinity_engine.machine.step` decided.

Theory of operation
-------------------
Every step returns exactly one outcome (R-OUT-1). Errors are outcomes too, never stray
exceptions: :class:`Rejected` carries a typed reason. A rejected event leaves the state
unchanged, with one documented exception inherited from verl: an acquire that finds a
stale sticky entry deletes it *before* it discovers the pool is empty (R-ACQ-6).

:class:`Path` names the branch an acquire took; ``kept`` and ``broken`` are the only
branches that move the ``affinity_kept`` / ``affinity_broken`` counters (R-CNT-1).
"""

from __future__ import annotations

import enum
from typing import final

from .values import Value, register

__all__ = [
    "NO_SERVERS_MESSAGE",
    "Acquired",
    "LoadsObserved",
    "Outcome",
    "Path",
    "PoolChanged",
    "RejectReason",
    "Rejected",
    "ReleaseResult",
    "Released",
    "StickyCacheCleared",
]

# verl callers (FullyAsyncLLMServerClient) match on this exact text.
NO_SERVERS_MESSAGE = "No available servers in load balancer"


class Path(enum.Enum):
    NEW = "new"  # no sticky entry: placed, then pinned
    KEPT = "kept"  # sticky hit on an active server, pin kept
    BROKEN = "broken"  # sticky hit on an active server, re-pinned to a least-loaded one
    RESELECTED = "reselected"  # entry pointed at a removed server: deleted, placed anew
    UNKEYED = "unkeyed"  # no request_id: placed, never pinned


class ReleaseResult(enum.Enum):
    APPLIED = "applied"  # the count went down by one
    UNKNOWN_SERVER = "unknown_server"  # not active: ignored
    AT_ZERO = "at_zero"  # count already 0: ignored (legacy clamp)
    STALE_LEASE = "stale_lease"  # lease mode: the lease predates a remove/re-add
    UNKNOWN_LEASE = "unknown_lease"  # lease mode: no matching lease: ignored


class RejectReason(enum.Enum):
    NO_SERVERS = "no_servers"
    INVALID_FOR_CONFIG = "invalid_for_config"


# Acquired and Released are built (or shared, see machine.py) on every event, so they
# are native values (values.py); the others are rare but take the same form, so every
# outcome compares, hashes and prints alike.


@final
class Acquired(Value):
    __slots__ = ("evicted", "path", "previous", "server_id")
    __match_args__ = ("server_id", "path", "previous", "evicted")
    server_id: str
    path: Path
    previous: str | None  # the old pin, on BROKEN and RESELECTED
    evicted: str | None  # the request id the sticky write evicted, if any

    def __init__(self, server_id: str, path: Path, previous: str | None = None,
                 evicted: str | None = None) -> None:
        object.__setattr__(self, "server_id", server_id)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "previous", previous)
        object.__setattr__(self, "evicted", evicted)


@final
class Released(Value):
    __slots__ = ("result", "server_id")
    __match_args__ = ("server_id", "result")
    server_id: str
    result: ReleaseResult

    def __init__(self, server_id: str, result: ReleaseResult) -> None:
        object.__setattr__(self, "server_id", server_id)
        object.__setattr__(self, "result", result)


@final
class PoolChanged(Value):
    __slots__ = ("servers",)
    __match_args__ = ("servers",)
    servers: tuple[str, ...]  # the active pool afterwards, in pool order

    def __init__(self, servers: tuple[str, ...]) -> None:
        object.__setattr__(self, "servers", servers)


@final
class StickyCacheCleared(Value):
    __slots__ = ("cleared_entries", "server_loads")
    __match_args__ = ("cleared_entries", "server_loads")
    cleared_entries: int
    server_loads: tuple[tuple[str, int], ...]

    def __init__(self, cleared_entries: int, server_loads: tuple[tuple[str, int], ...]) -> None:
        object.__setattr__(self, "cleared_entries", cleared_entries)
        object.__setattr__(self, "server_loads", server_loads)


@final
class Rejected(Value):
    __slots__ = ("message", "reason")
    __match_args__ = ("reason", "message")
    reason: RejectReason
    message: str

    def __init__(self, reason: RejectReason, message: str) -> None:
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "message", message)


@final
class LoadsObserved(Value):
    __slots__ = ("ignored", "updated")
    __match_args__ = ("updated", "ignored")
    updated: tuple[str, ...]  # active servers whose external load was set
    ignored: tuple[str, ...]  # listed servers that are not active

    def __init__(self, updated: tuple[str, ...], ignored: tuple[str, ...]) -> None:
        object.__setattr__(self, "updated", updated)
        object.__setattr__(self, "ignored", ignored)


register(Acquired, Released, PoolChanged, StickyCacheCleared, Rejected, LoadsObserved)

Outcome = Acquired | Released | PoolChanged | StickyCacheCleared | Rejected | LoadsObserved
