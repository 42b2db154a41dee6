"""The status view: verl's ``get_status`` keys plus the affinity fields.

Theory of operation
-------------------
``status`` (R-STAT-1) returns a fresh, JSON-ready dict: verl 0.9.1's keys ``servers``
(pool order), ``total_inflight``, ``active_servers`` and ``registered_handles``; PR
#7435's ``affinity_break_margin``, ``affinity_kept`` and ``affinity_broken``; and
Affinity's own ``policy``, ``tie_break``, ``hash_mode``, ``full_determinism``,
``sticky_entries`` and, with lease accounting, ``unknown_leases`` and ``stale_leases``;
the group fields (``group_stickiness``, ``group_entries``, ``group_kept``,
``group_broken``) when group stickiness is on; ``placement_margin`` when prefix-aware
placement is configured; ``external_loads`` when an
:class:`~affinity_engine.events.ObserveLoads` set any. The ``servers`` counts are the
router's own in-flight counts, as in verl.
"""

from __future__ import annotations

from typing import Any

from affinity_core.config import Config

from .state import State

__all__ = ["VERL_STATUS_KEYS", "status"]

VERL_STATUS_KEYS = ("servers", "total_inflight", "active_servers", "registered_handles")


def status(config: Config, state: State) -> dict[str, Any]:
    items = state.inflight_items()
    out: dict[str, Any] = {
        "servers": dict(items),
        "total_inflight": state.inflight_total,
        "active_servers": len(items),
        "registered_handles": [sid for sid, _ in items],
        "affinity_break_margin": config.affinity_break_margin,
        "affinity_kept": state.affinity_kept,
        "affinity_broken": state.affinity_broken,
        "policy": config.policy,
        "tie_break": config.tie_break.value,
        "hash_mode": config.hash_mode.value,
        "full_determinism": config.full_determinism,
        "sticky_entries": len(state.lru),
        "lease_accounting": config.lease_accounting,
    }
    if config.dual_threshold is not None:
        out["balance_abs_threshold"] = config.dual_threshold.balance_abs_threshold
        out["balance_rel_threshold"] = str(config.dual_threshold.balance_rel_threshold)
    if state.external:
        out["external_loads"] = {s: state.external[s] for s in state.pool.servers
                                 if s in state.external}
    if config.groups:
        out["group_stickiness"] = config.group_stickiness.value
        out["group_entries"] = len(state.groups.lru)
        out["group_kept"] = state.groups.kept
        out["group_broken"] = state.groups.broken
    if config.placement_margin is not None:
        out["placement_margin"] = config.placement_margin
    if config.lease_accounting:
        out["unknown_leases"] = state.leases.unknown_leases
        out["stale_leases"] = state.leases.stale_leases
    return out
