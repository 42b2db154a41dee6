"""Outcomes: what one :func:`~affinity_core.machine.step` decided (SPEC §5).

Theory of operation
-------------------
Every step returns exactly one outcome (R-OUT-1). Errors are outcomes too, never
exceptions: an empty pool is ``Rejected(NO_SERVERS, ...)`` with verl's exact message, and
an acquire that does not fit the configuration is ``Rejected(INVALID_FOR_CONFIG, ...)``
(R-OUT-2, R-ACQ-5, R-ACQ-9).
"""

from __future__ import annotations

import enum

import attrs

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

NO_SERVERS_MESSAGE = "No available servers in load balancer"  # verl's RuntimeError text


class Path(enum.Enum):
    NEW = "new"  # no sticky entry: placed, then pinned
    KEPT = "kept"  # sticky hit on an active server, pin kept
    BROKEN = "broken"  # sticky hit on an active server, re-pinned to a least-loaded one
    RESELECTED = "reselected"  # entry pointed at a removed server: deleted, placed anew
    UNKEYED = "unkeyed"  # no request_id: placed, never pinned
    GROUP_KEPT = "group_kept"  # conversation miss, joined its group's pin
    GROUP_BROKEN = "group_broken"  # conversation miss, group pin broken and moved


class ReleaseResult(enum.Enum):
    APPLIED = "applied"  # the count went down by one
    UNKNOWN_SERVER = "unknown_server"  # not active: ignored
    AT_ZERO = "at_zero"  # count already 0: ignored (legacy clamp)
    STALE_LEASE = "stale_lease"  # lease mode: the lease predates a remove/re-add
    UNKNOWN_LEASE = "unknown_lease"  # lease mode: no matching lease: ignored


class RejectReason(enum.Enum):
    NO_SERVERS = "no_servers"
    INVALID_FOR_CONFIG = "invalid_for_config"


@attrs.frozen
class Acquired:
    server_id: str
    path: Path
    previous: str | None = None  # the pin that was read, on (GROUP_)BROKEN and RESELECTED
    evicted: str | None = None  # the request id the sticky write evicted, if any
    evicted_group: str | None = None  # the group id the group write evicted, if any


@attrs.frozen
class Released:
    server_id: str
    result: ReleaseResult


@attrs.frozen
class PoolChanged:
    servers: tuple[str, ...]  # the active pool afterwards, in pool order


@attrs.frozen
class StickyCacheCleared:
    cleared_entries: int
    server_loads: tuple[tuple[str, int], ...]  # in-flight counts before clearing
    cleared_groups: int = 0  # entries of the group map before clearing


@attrs.frozen
class Rejected:
    reason: RejectReason
    message: str


@attrs.frozen
class LoadsObserved:
    updated: tuple[str, ...]  # active servers whose external load was set
    ignored: tuple[str, ...]  # listed servers that are not active


Outcome = Acquired | Released | PoolChanged | StickyCacheCleared | Rejected | LoadsObserved
