"""The status view: verl's ``get_status`` keys plus the affinity fields (SPEC §15).

Theory of operation
-------------------
``status`` (R-STAT-1) returns a fresh, JSON-ready dict: verl 0.9.1's keys ``servers`` (pool
order), ``total_inflight``, ``active_servers`` and ``registered_handles``; PR #7435's
``affinity_break_margin``, ``affinity_kept`` and ``affinity_broken``; and Affinity's own
``policy``, ``tie_break``, ``hash_mode``, ``full_determinism``, ``sticky_entries``,
``lease_accounting``, the gate's thresholds when it is configured, ``external_loads`` when
an observation set any, the lease counters with lease accounting, and the group map's
size and counters with group stickiness, and ``placement_margin`` when prefix-aware
placement is configured. ``servers`` reports
the in-flight counts ``F``, as verl does.
"""

from __future__ import annotations

from typing import Any

from .config import Config
from .state import State, inflight_items

__all__ = ["VERL_STATUS_KEYS", "status"]

VERL_STATUS_KEYS = ("servers", "total_inflight", "active_servers", "registered_handles")


def status(config: Config, state: State) -> dict[str, Any]:
    items = inflight_items(state)
    out: dict[str, Any] = {
        "servers": dict(items),
        "total_inflight": sum(count for _, count in items),
        "active_servers": len(items),
        "registered_handles": [server_id for server_id, _ in items],
        "affinity_break_margin": config.affinity_break_margin,
        "affinity_kept": state.affinity_kept,
        "affinity_broken": state.affinity_broken,
        "policy": config.policy,
        "tie_break": config.tie_break.value,
        "hash_mode": config.hash_mode.value,
        "full_determinism": config.full_determinism,
        "sticky_entries": len(state.sticky),
        "lease_accounting": config.lease_accounting,
    }
    if config.dual_threshold is not None:
        out["balance_abs_threshold"] = config.dual_threshold.balance_abs_threshold
        out["balance_rel_threshold"] = str(config.dual_threshold.balance_rel_threshold)
    if state.external:
        out["external_loads"] = {server_id: state.external[server_id]
                                 for server_id in state.pool if server_id in state.external}
    if config.groups:
        out["group_stickiness"] = config.group_stickiness.value
        out["group_entries"] = len(state.groups)
        out["group_kept"] = state.group_kept
        out["group_broken"] = state.group_broken
    if config.placement_margin is not None:
        out["placement_margin"] = config.placement_margin
    if config.lease_accounting:
        out["unknown_leases"] = state.leases.unknown_leases
        out["stale_leases"] = state.leases.stale_leases
    return out
