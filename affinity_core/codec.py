"""Canonical JSON for configurations, events, outcomes and states.

Theory of operation
-------------------
Conformance vectors, decision logs and ``affinity check`` reports exchange core values
with other languages, so their encoding is part of the spec (R-CODEC-1):

* JSON objects with fixed field names; enums as their string values; integers only
  (``balance_rel_threshold`` is an exact rational written as ``"p/q"`` or ``"p"``);
* canonical text: UTF-8, keys sorted, separators ``(",", ":")``, no NaN;
* an event is ``{"op": ..., fields}``; an outcome is ``{"kind": ..., fields}``;
* a state is ``{"servers": [[id, in-flight], ...] in pool order, "lru": [[rid, sid],
  ...] oldest first, "affinity_kept", "affinity_broken"}`` plus ``"leases"`` when the
  lease book is not empty, ``"external"`` when an observation set external loads, and
  ``"groups"`` / ``"group_kept"`` / ``"group_broken"`` when group pins were made;
* an option, event field or outcome field added by an extension appears only when set,
  so every value without it encodes (and digests) exactly as before it existed.

Decoding validates everything and raises :class:`CodecError` that names the field, the
value and what was expected, so a malformed vector or log line is reported, not crashed
on. ``state_digest`` is the SHA-256 of the canonical state text: logs carry it so a
replay can pinpoint the first step whose state diverges.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from immutables import Map

from .config import Config, ConfigError, DualThreshold
from .events import (
    Acquire,
    AddServers,
    ClearStickyCache,
    Event,
    EventError,
    ObserveLoads,
    Release,
    RemoveServers,
    is_valid_id,
)
from .leases import LeaseBook, open_epochs
from .outcomes import (
    Acquired,
    LoadsObserved,
    Outcome,
    PoolChanged,
    Rejected,
    Released,
    StickyCacheCleared,
)
from .state import State, inflight_items

__all__ = [
    "CodecError",
    "canonical_dumps",
    "config_from_json",
    "config_to_json",
    "event_from_json",
    "event_to_json",
    "outcome_to_json",
    "state_digest",
    "state_from_json",
    "state_to_json",
]

JSON = dict[str, Any]


class CodecError(ValueError):
    """A JSON value does not decode to a core value."""


def canonical_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def _rel_text(rel: Fraction) -> str:
    return str(rel)


# ------------------------------------------------------------------ config
_CONFIG_KEYS = frozenset({
    "affinity_break_margin", "dual_threshold", "max_cache_size", "full_determinism",
    "tie_break", "hash_mode", "lease_accounting", "affinity_break_tokens",
    "affinity_break_band_cap", "group_stickiness", "group_break_margin",
    "max_group_cache_size", "placement_margin",
})


def config_to_json(config: Config) -> JSON:
    gate = config.dual_threshold
    return {
        "affinity_break_margin": config.affinity_break_margin,
        "dual_threshold": None if gate is None else {
            "balance_abs_threshold": gate.balance_abs_threshold,
            "balance_rel_threshold": _rel_text(gate.balance_rel_threshold),
        },
        "max_cache_size": config.max_cache_size,
        "full_determinism": config.full_determinism,
        "tie_break": config.tie_break.value,
        "hash_mode": config.hash_mode.value,
        "lease_accounting": config.lease_accounting,
        # The context band's options appear only when set, so every configuration that
        # predates them (vectors, decision-log headers, digests) encodes as before.
        **({} if config.affinity_break_tokens is None else {
            "affinity_break_tokens": config.affinity_break_tokens,
            "affinity_break_band_cap": config.affinity_break_band_cap,
        }),
        **({} if not config.groups else {
            "group_stickiness": config.group_stickiness.value,
            "group_break_margin": config.group_break_margin,
            "max_group_cache_size": config.max_group_cache_size,
        }),
        **({} if config.placement_margin is None else {
            "placement_margin": config.placement_margin,
        }),
    }


def config_from_json(data: object) -> Config:
    obj = _object(data, "config")
    unknown = sorted(set(obj) - _CONFIG_KEYS)
    if unknown:
        raise CodecError(f"config: unknown keys {unknown}; accepted: {sorted(_CONFIG_KEYS)}")
    kwargs = dict(obj)
    gate = kwargs.pop("dual_threshold", None)
    try:
        if gate is not None:
            g = _object(gate, "config.dual_threshold")
            extra = sorted(set(g) - {"balance_abs_threshold", "balance_rel_threshold"})
            if extra or "balance_abs_threshold" not in g:
                raise CodecError(
                    "config.dual_threshold needs balance_abs_threshold and optional "
                    f"balance_rel_threshold, got keys {sorted(g)}"
                )
            kwargs["dual_threshold"] = DualThreshold(**g)
        return Config(**kwargs)
    except (ConfigError, TypeError) as exc:
        raise CodecError(f"config: {exc}") from None


# ------------------------------------------------------------------ events
def event_to_json(event: Event) -> JSON:
    if isinstance(event, Acquire):
        out: JSON = {"op": "acquire", "request_id": event.request_id}
        if event.tie_draw:
            out["tie_draw"] = event.tie_draw
        if event.request_hash is not None:
            out["request_hash"] = event.request_hash
        if event.context_tokens is not None:
            out["context_tokens"] = event.context_tokens
        if event.group_id is not None:
            out["group_id"] = event.group_id
        if event.cached_prefix:
            out["cached_prefix"] = [list(p) for p in event.cached_prefix]
        return out
    if isinstance(event, Release):
        out = {"op": "release", "server_id": event.server_id}
        if event.request_id is not None:
            out["request_id"] = event.request_id
        return out
    if isinstance(event, AddServers):
        return {"op": "add_servers", "server_ids": list(event.server_ids)}
    if isinstance(event, RemoveServers):
        return {"op": "remove_servers", "server_ids": list(event.server_ids)}
    if isinstance(event, ObserveLoads):
        return {"op": "observe_loads", "observed": [list(p) for p in event.observed]}
    return {"op": "clear_sticky_cache"}


_EVENT_FIELDS: Mapping[str, tuple[type[Any], frozenset[str], frozenset[str]]] = (
    MappingProxyType({
    # op -> (class, required fields, optional fields)
    "acquire": (Acquire, frozenset({"request_id"}),
                frozenset({"tie_draw", "request_hash", "context_tokens", "group_id",
                           "cached_prefix"})),
    "release": (Release, frozenset({"server_id"}), frozenset({"request_id"})),
    "add_servers": (AddServers, frozenset({"server_ids"}), frozenset()),
    "remove_servers": (RemoveServers, frozenset({"server_ids"}), frozenset()),
    "clear_sticky_cache": (ClearStickyCache, frozenset(), frozenset()),
    "observe_loads": (ObserveLoads, frozenset({"observed"}), frozenset()),
}))


def event_from_json(data: object) -> Event:
    obj = _object(data, "event")
    op = obj.get("op")
    if not isinstance(op, str) or op not in _EVENT_FIELDS:
        raise CodecError(f"event.op must be one of {sorted(_EVENT_FIELDS)}, got {op!r}")
    cls, required, optional = _EVENT_FIELDS[op]
    fields = {k: v for k, v in obj.items() if k != "op"}
    missing = sorted(required - set(fields))
    unknown = sorted(set(fields) - required - optional)
    if missing or unknown:
        raise CodecError(
            f"event {op!r}: missing {missing}, unknown {unknown}; "
            f"fields are {sorted(required)} + optional {sorted(optional)}"
        )
    try:
        event: Event = cls(**fields)
    except EventError as exc:
        raise CodecError(f"event {op!r}: {exc}") from None
    return event


# ---------------------------------------------------------------- outcomes
def outcome_to_json(outcome: Outcome) -> JSON:
    if isinstance(outcome, Acquired):
        out: JSON = {"kind": "acquired", "server_id": outcome.server_id,
                     "path": outcome.path.value}
        if outcome.previous is not None:
            out["previous"] = outcome.previous
        if outcome.evicted is not None:
            out["evicted"] = outcome.evicted
        if outcome.evicted_group is not None:
            out["evicted_group"] = outcome.evicted_group
        return out
    if isinstance(outcome, Released):
        return {"kind": "released", "server_id": outcome.server_id,
                "result": outcome.result.value}
    if isinstance(outcome, LoadsObserved):
        return {"kind": "loads_observed", "updated": list(outcome.updated),
                "ignored": list(outcome.ignored)}
    if isinstance(outcome, PoolChanged):
        return {"kind": "pool_changed", "servers": list(outcome.servers)}
    if isinstance(outcome, StickyCacheCleared):
        cleared: JSON = {"kind": "sticky_cache_cleared",
                         "cleared_entries": outcome.cleared_entries,
                         "server_loads": [list(p) for p in outcome.server_loads]}
        if outcome.cleared_groups:
            cleared["cleared_groups"] = outcome.cleared_groups
        return cleared
    assert isinstance(outcome, Rejected)
    return {"kind": "rejected", "reason": outcome.reason.value, "message": outcome.message}


# ------------------------------------------------------------------ states
def state_to_json(state: State) -> JSON:
    out: JSON = {
        "servers": [list(p) for p in inflight_items(state)],
        "lru": [list(p) for p in state.sticky],
        "affinity_kept": state.affinity_kept,
        "affinity_broken": state.affinity_broken,
    }
    if state.external:
        out["external"] = dict(sorted(state.external.items()))
    if state.groups or state.group_kept or state.group_broken:
        out["groups"] = [list(p) for p in state.groups]
        out["group_kept"] = state.group_kept
        out["group_broken"] = state.group_broken
    book = state.leases
    if book != LeaseBook():
        out["leases"] = {
            "held": sorted(
                (
                    [rid, sid, epoch, count]
                    for (rid, sid), held in book.held.items()
                    for epoch, count in held
                ),
                # Unkeyed leases (request id null) sort first; None and str don't compare.
                key=lambda row: (row[0] is not None, row[0] or "", row[1], row[2]),
            ),
            "epochs": dict(sorted(book.epoch.items())),
            "next_epoch": book.next_epoch,
            "unknown_leases": book.unknown_leases,
            "stale_leases": book.stale_leases,
        }
    return out


def state_from_json(config: Config, data: object) -> State:
    """A state as a vector's ``initial_state`` describes it (validated against config)."""
    obj = _object(data, "state")
    extra = sorted(set(obj) - {"servers", "lru", "affinity_kept", "affinity_broken", "leases",
                               "external", "groups", "group_kept", "group_broken"})
    if extra:
        raise CodecError(f"state: unknown keys {extra}")
    servers = [_pair(p, f"state.servers[{i}]", str, int) for i, p in
               enumerate(_list(obj.get("servers", []), "state.servers"))]
    ids = [s for s, _ in servers]
    if len(set(ids)) != len(ids) or not all(is_valid_id(s) for s in ids):
        raise CodecError(f"state.servers: ids must be unique non-empty strings, got {ids}")
    if any(n < 0 for _, n in servers):
        raise CodecError(f"state.servers: loads must be >= 0, got {servers}")
    lru = _pin_map(obj.get("lru", []), "state.lru", config.max_cache_size, "max_cache_size")
    groups = _pin_map(obj.get("groups", []), "state.groups", config.max_group_cache_size,
                      "max_group_cache_size")
    if groups and not config.groups:
        raise CodecError("state.groups: group pins need group_stickiness 'fallback' or 'only'")
    kept = _count(obj.get("affinity_kept", 0), "state.affinity_kept")
    broken = _count(obj.get("affinity_broken", 0), "state.affinity_broken")
    external = {k: _count(v, f"state.external[{k}]") for k, v in
                _object(obj.get("external", {}), "state.external").items() if v != 0}
    if not set(external) <= set(ids):
        stray = sorted(set(external) - set(ids))
        raise CodecError(f"state.external names inactive servers {stray}")
    book = LeaseBook()
    if config.lease_accounting:
        book = open_epochs(book, tuple(ids))
    if "leases" in obj:
        book = _leases_from_json(obj["leases"])
    return State(pool=tuple(ids), inflight=Map(servers), external=Map(external),
                 sticky=lru, affinity_kept=kept, affinity_broken=broken, leases=book,
                 groups=groups, group_kept=_count(obj.get("group_kept", 0), "state.group_kept"),
                 group_broken=_count(obj.get("group_broken", 0), "state.group_broken"))


def _pin_map(data: object, where: str, capacity: int, option: str
             ) -> tuple[tuple[str, str], ...]:
    pins = [_pair(p, f"{where}[{i}]", str, str) for i, p in enumerate(_list(data, where))]
    if not all(is_valid_id(k) and is_valid_id(v) for k, v in pins):
        raise CodecError(f"{where}: ids must be non-empty strings of Unicode scalar values")
    if len({k for k, _ in pins}) != len(pins) or len(pins) > capacity:
        raise CodecError(
            f"{where}: keys must be unique and at most {option}={capacity}, "
            f"got {len(pins)} entries")
    return tuple(pins)


def _leases_from_json(data: object) -> LeaseBook:
    obj = _object(data, "state.leases")
    held: dict[tuple[str | None, str], list[tuple[int, int]]] = {}
    for i, row in enumerate(_list(obj.get("held", []), "state.leases.held")):
        r = _list(row, f"state.leases.held[{i}]")
        if len(r) != 4 or not (r[0] is None or isinstance(r[0], str)):
            raise CodecError(f"state.leases.held[{i}] must be [rid|null, sid, epoch, count]")
        held.setdefault((r[0], r[1]), []).append(
            (_count(r[2], "epoch"), _count(r[3], "count")))
    epochs = _object(obj.get("epochs", {}), "state.leases.epochs")
    return LeaseBook(
        Map({k: tuple(sorted(v)) for k, v in held.items()}),
        Map({k: _count(v, f"epochs[{k}]") for k, v in epochs.items()}),
        _count(obj.get("next_epoch", 0), "next_epoch"),
        _count(obj.get("unknown_leases", 0), "unknown_leases"),
        _count(obj.get("stale_leases", 0), "stale_leases"),
    )


def state_digest(state: State) -> str:
    return hashlib.sha256(canonical_dumps(state_to_json(state)).encode()).hexdigest()


# ----------------------------------------------------------------- helpers
def _object(data: object, where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise CodecError(f"{where} must be a JSON object, got {data!r}")
    return data


def _list(data: object, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise CodecError(f"{where} must be a JSON array, got {data!r}")
    return data


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CodecError(f"{where} must be an integer >= 0, got {value!r}")
    return value


def _pair(value: object, where: str, first: type[Any], second: type[Any]) -> tuple[Any, Any]:
    items = _list(value, where)
    ok = (len(items) == 2 and isinstance(items[0], first) and isinstance(items[1], second)
          and not isinstance(items[1], bool))
    if not ok:
        raise CodecError(
            f"{where} must be [{first.__name__}, {second.__name__}], got {value!r}")
    return items[0], items[1]
