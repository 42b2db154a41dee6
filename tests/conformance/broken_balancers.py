"""Balancers with verl's API for testing ``affinity check``: one right, several deliberately wrong.

:class:`MiniBalancer` is a second, independent implementation of the spec (margin policy,
first-in-pool-order ties, verl's error contract), written from spec/SPEC.md with an
``OrderedDict`` as the LRU. It is the positive control: ``affinity check --tie-break
first`` must pass it. Each broken class changes exactly one rule:

* :class:`NoRefreshLruBalancer` (verl's constructor): a sticky hit does not refresh the
  entry's recency, so the wrong entry is evicted when the map is full (R-LRU-2);
* :class:`StrictMarginBalancer` (PR #7435's constructor): keeps a pin only while
  ``load < min + margin`` -- the exclusive bound moves sessions sitting exactly on the
  band's edge (R-KEEP-1);
* :class:`MarginUnderDeterminismBalancer`: applies the margin under ``full_determinism``
  (R-DET-4);
* :class:`NoRepinBalancer`: a break routes to a least-loaded server without re-pinning
  (R-BREAK-1).

The context band's positive control and mutants are at the end of the file.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

NO_SERVERS = "No available servers in load balancer"


def _margin(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"affinity_break_margin must be null or an integer >= 0, got {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise ValueError(f"affinity_break_margin must be null or an integer >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"affinity_break_margin must be null or an integer >= 0, got {value!r}")
    return int(value)


class MiniBalancer:
    """An independent spec implementation (legacy + margin, first-in-order ties)."""

    def __init__(self, servers: dict[str, Any], max_cache_size: int = 10000,
                 full_determinism: bool = False,
                 affinity_break_margin: int | None = None) -> None:
        if isinstance(max_cache_size, bool) or not isinstance(max_cache_size, int) \
                or max_cache_size < 1:
            raise ValueError(f"max_cache_size must be an integer >= 1, got {max_cache_size!r}")
        if not isinstance(full_determinism, bool):
            raise ValueError(f"full_determinism must be true or false, got {full_determinism!r}")
        if any(not isinstance(s, str) or s == "" for s in servers):
            raise ValueError(f"server ids must be non-empty strings, got {list(servers)!r}")
        self._margin = _margin(affinity_break_margin)
        self._capacity = max_cache_size
        self._determinism = full_determinism
        self._handles = dict(servers)
        self._inflight = dict.fromkeys(servers, 0)
        self._lru: OrderedDict[str, str] = OrderedDict()
        self._kept = 0
        self._broken = 0

    # sticky map
    def _lookup(self, request_id: str) -> str:
        self._lru.move_to_end(request_id)
        return self._lru[request_id]

    def _store(self, request_id: str, server_id: str) -> None:
        if request_id in self._lru:
            self._lru[request_id] = server_id
            self._lru.move_to_end(request_id)
            return
        while len(self._lru) >= self._capacity:
            self._lru.popitem(last=False)
        self._lru[request_id] = server_id

    # policy
    def _keep(self, pinned: str) -> bool:
        if self._margin is None or self._determinism:
            return True
        return self._inflight[pinned] <= min(self._inflight.values()) + self._margin

    def _least_loaded(self) -> str:
        low = min(self._inflight.values())
        return next(s for s, n in self._inflight.items() if n == low)

    def acquire_server(self, request_id: str) -> tuple[str, Any]:
        if request_id in self._lru:
            pinned = self._lookup(request_id)
            if pinned in self._inflight:
                if self._keep(pinned):
                    self._kept += 1
                    chosen = pinned
                else:
                    self._broken += 1
                    chosen = self._least_loaded()
                    self._store(request_id, chosen)
                self._inflight[chosen] += 1
                return chosen, self._handles[chosen]
            del self._lru[request_id]
        if not self._inflight:
            raise RuntimeError(NO_SERVERS)
        if self._determinism:
            pool = list(self._inflight)
            chosen = pool[hash(request_id) % len(pool)]
        else:
            chosen = self._least_loaded()
        self._store(request_id, chosen)
        self._inflight[chosen] += 1
        return chosen, self._handles[chosen]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        if self._inflight.get(server_id, 0) > 0:
            self._inflight[server_id] -= 1

    def add_servers(self, servers: dict[str, Any]) -> None:
        for sid, handle in servers.items():
            self._inflight[sid] = 0
            self._handles[sid] = handle

    def remove_servers(self, server_ids: list[str]) -> None:
        for sid in server_ids:
            self._inflight.pop(sid, None)
            self._handles.pop(sid, None)

    def clear_sticky_cache(self) -> dict[str, Any]:
        cleared = len(self._lru)
        self._lru.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight)}

    def get_all_servers(self) -> list[str]:
        return list(self._inflight)

    def get_total_inflight(self) -> int:
        return sum(self._inflight.values())

    def get_status(self) -> dict[str, Any]:
        return {"servers": dict(self._inflight), "total_inflight": self.get_total_inflight(),
                "active_servers": len(self._inflight), "registered_handles": list(self._handles),
                "affinity_break_margin": self._margin, "affinity_kept": self._kept,
                "affinity_broken": self._broken}


class NoRefreshLruBalancer(MiniBalancer):
    """verl's constructor; BUG: a sticky hit does not make the entry most recent."""

    def __init__(self, servers: dict[str, Any], max_cache_size: int = 10000,
                 full_determinism: bool = False) -> None:
        super().__init__(servers, max_cache_size, full_determinism)

    def _lookup(self, request_id: str) -> str:
        return self._lru[request_id]


class StrictMarginBalancer(MiniBalancer):
    """PR #7435's constructor; BUG: keeps a pin only strictly inside the band."""

    def _keep(self, pinned: str) -> bool:
        if self._margin is None or self._determinism:
            return True
        return self._inflight[pinned] < min(self._inflight.values()) + self._margin


class MarginUnderDeterminismBalancer(MiniBalancer):
    """BUG: applies the margin under ``full_determinism`` too (the spec ignores it, R-DET-4)."""

    def _keep(self, pinned: str) -> bool:
        if self._margin is None:
            return True
        return self._inflight[pinned] <= min(self._inflight.values()) + self._margin


class NoRepinBalancer(MiniBalancer):
    """BUG: a broken pin routes to a least-loaded server but keeps its old sticky entry
    (R-BREAK-1: a break re-pins)."""

    def _store(self, request_id: str, server_id: str) -> None:
        if request_id in self._lru:  # only a break writes an existing key
            return
        super()._store(request_id, server_id)


class NotABalancer:
    """Has no balancer methods (for the bad-IMPL test)."""

    def __init__(self, servers: dict[str, Any]) -> None:
        self.servers = servers


# ------------------------------------------------------------------ the context band
# MiniBandBalancer extends MiniBalancer with the band (SPEC section 7.5): T and cap validated
# as R-CFG-6 says, and verl 0.9.1's way of receiving the context -- require_acquire_fields()
# names "prompt_ids" when T is set and acquire_server(request_id, prompt_ids=...) takes
# c = len(prompt_ids). It is the positive control. Each mutant changes one rule:
# CeilBandBalancer rounds c / T up (R-BAND-1); UncappedBandBalancer forgets the cap
# (R-BAND-2); GuessingBandBalancer gives an acquire without a context T tokens (R-BAND-1).
# CountBandBalancer declares "context_tokens" and receives the count itself.

def _positive(key: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and (not math.isfinite(value) or not value.is_integer())):
        raise ValueError(f"{key} must be null or an integer >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{key} must be null or an integer >= 1, got {value!r}")
    return int(value)


class MiniBandBalancer(MiniBalancer):
    """MiniBalancer plus the context band (first-in-order ties)."""

    def __init__(self, servers: dict[str, Any], max_cache_size: int = 10000,
                 full_determinism: bool = False, affinity_break_margin: int | None = None,
                 affinity_break_tokens: int | None = None,
                 affinity_break_band_cap: int | None = None) -> None:
        super().__init__(servers, max_cache_size, full_determinism, affinity_break_margin)
        tokens = _positive("affinity_break_tokens", affinity_break_tokens)
        cap = _positive("affinity_break_band_cap", affinity_break_band_cap)
        if (tokens is None) != (cap is None) or (tokens is not None and self._margin is None):
            raise ValueError("affinity_break_tokens and affinity_break_band_cap are set "
                             "together and only with affinity_break_margin; got "
                             f"affinity_break_tokens={tokens!r}, affinity_break_band_cap={cap!r}")
        if cap is not None and self._margin is not None and cap < self._margin:
            raise ValueError(f"affinity_break_band_cap must be >= affinity_break_margin "
                             f"({self._margin}), got {cap!r}")
        self._tokens, self._cap = tokens, cap
        self._context: int | None = None

    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids"] if self._tokens is not None else []

    def acquire_server(self, request_id: str,
                       prompt_ids: Sequence[int] | None = None) -> tuple[str, Any]:
        self._context = None if prompt_ids is None else len(prompt_ids)
        return super().acquire_server(request_id)

    def band(self) -> int:
        assert self._margin is not None and self._tokens is not None and self._cap is not None
        return min(self._margin + (self._context or 0) // self._tokens, self._cap)

    def _keep(self, pinned: str) -> bool:
        if self._tokens is None or self._determinism:
            return super()._keep(pinned)
        return self._inflight[pinned] <= min(self._inflight.values()) + self.band()


class CeilBandBalancer(MiniBandBalancer):
    """BUG: rounds c / T up."""

    def band(self) -> int:
        assert self._margin is not None and self._tokens is not None and self._cap is not None
        return min(self._margin + -(-(self._context or 0) // self._tokens), self._cap)


class UncappedBandBalancer(MiniBandBalancer):
    """BUG: forgets the cap."""

    def band(self) -> int:
        assert self._margin is not None and self._tokens is not None
        return self._margin + (self._context or 0) // self._tokens


class GuessingBandBalancer(MiniBandBalancer):
    """BUG: an acquire without a context is given T tokens."""

    def band(self) -> int:
        if self._context is None:
            self._context = self._tokens
        return super().band()


class CountBandBalancer(MiniBandBalancer):
    """Declares ``context_tokens`` and receives the count itself."""

    def require_acquire_fields(self) -> list[str]:
        return ["context_tokens"] if self._tokens is not None else []

    def acquire_server(self, request_id: str,  # type: ignore[override]
                       context_tokens: int | None = None) -> tuple[str, Any]:
        self._context = context_tokens
        return MiniBalancer.acquire_server(self, request_id)


# ------------------------------------------------------------------ group pins
# MiniGroupBalancer extends MiniBalancer with group pins (SPEC section 7.6), written from
# R-GRP-1..8: group_stickiness "off" | "fallback" | "only", group_break_margin,
# max_group_cache_size, and PR #6122's call shape acquire_server(request_id,
# request_group_id=...). Unkeyed requests are placed by load and never pinned (R-ACQ-8). It
# is the positive control. Each mutant changes one rule: StaleGroupLruBalancer does not
# refresh a group entry's recency on a hit (R-GRP-4's "touch"); KeepsRemovedGroupBalancer
# keeps the group entry of a removed server, placing each sibling by load without deleting
# or re-pinning it (R-GRP-2, R-GRP-4). NoGroupFieldBalancer has the group options but an
# acquire_server without request_group_id (the harness must say so, not crash).


def _group_margin(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"group_break_margin must be null or an integer >= 0, got {value!r}")
    return value


class MiniGroupBalancer(MiniBalancer):
    """An independent spec implementation of group pins (legacy + margin, first ties)."""

    def __init__(self, servers: dict[str, Any], max_cache_size: int = 10000,
                 full_determinism: bool = False, affinity_break_margin: int | None = None,
                 group_stickiness: str = "off", group_break_margin: int | None = None,
                 max_group_cache_size: int = 10000) -> None:
        super().__init__(servers, max_cache_size, full_determinism, affinity_break_margin)
        if group_stickiness not in ("off", "fallback", "only"):
            raise ValueError("group_stickiness must be 'off', 'fallback' or 'only', "
                             f"got {group_stickiness!r}")
        if group_stickiness == "off" and group_break_margin is not None:
            raise ValueError("group_break_margin needs group_stickiness 'fallback' or 'only'")
        if isinstance(max_group_cache_size, bool) or not isinstance(max_group_cache_size, int) \
                or max_group_cache_size < 1:
            raise ValueError("max_group_cache_size must be an integer >= 1, "
                             f"got {max_group_cache_size!r}")
        self._stickiness = group_stickiness
        self._group_margin = _group_margin(group_break_margin)
        self._group_capacity = max_group_cache_size
        self._groups: OrderedDict[str, str] = OrderedDict()
        self._group_kept = 0
        self._group_broken = 0

    # group map
    def _group_lookup(self, group_id: str) -> str:
        self._groups.move_to_end(group_id)
        return self._groups[group_id]

    def _group_store(self, group_id: str, server_id: str) -> None:
        if group_id in self._groups:
            self._groups[group_id] = server_id
            self._groups.move_to_end(group_id)
            return
        while len(self._groups) >= self._group_capacity:
            self._groups.popitem(last=False)
        self._groups[group_id] = server_id

    def _group_pin(self, group_id: str) -> str | None:
        """The group's pin if it is on an active server (a stale one is deleted first)."""
        pinned = self._group_lookup(group_id)
        if pinned in self._inflight:
            return pinned
        del self._groups[group_id]
        return None

    def _keep_group(self, pinned: str) -> bool:
        if self._group_margin is None or self._determinism:
            return self._keep(pinned)
        return self._inflight[pinned] <= min(self._inflight.values()) + self._group_margin

    def _place(self, key: str) -> str:
        if not self._inflight:
            raise RuntimeError(NO_SERVERS)
        if self._determinism:
            pool = list(self._inflight)
            return pool[hash(key) % len(pool)]
        return self._least_loaded()

    def acquire_server(self, request_id: str | None,
                       request_group_id: str | None = None) -> tuple[str, Any]:
        if request_id is None:  # unkeyed: placed by load, never pinned (R-ACQ-8)
            if self._determinism:
                raise ValueError("full_determinism needs a request_id")
            placed = self._place("")
            self._inflight[placed] += 1
            return placed, self._handles[placed]
        grouped = self._stickiness != "off" and request_group_id is not None
        if not grouped or (self._stickiness == "fallback" and request_id in self._lru):
            return super().acquire_server(request_id)
        assert request_group_id is not None
        chosen: str | None = None
        if request_group_id in self._groups:
            pinned = self._group_pin(request_group_id)
            if pinned is not None and self._keep_group(pinned):
                self._group_kept += 1
                chosen = pinned
            elif pinned is not None:
                self._group_broken += 1
                chosen = self._least_loaded()
                self._group_store(request_group_id, chosen)
        if chosen is None:
            chosen = self._place(request_group_id)
            self._group_store(request_group_id, chosen)
        if self._stickiness == "fallback":
            self._store(request_id, chosen)
        self._inflight[chosen] += 1
        return chosen, self._handles[chosen]

    def clear_sticky_cache(self) -> dict[str, Any]:
        result = super().clear_sticky_cache()
        if self._groups:
            result["cleared_groups"] = len(self._groups)
        self._groups.clear()
        return result

    def get_status(self) -> dict[str, Any]:
        status = super().get_status()
        if self._stickiness != "off":
            status.update(group_entries=len(self._groups), group_kept=self._group_kept,
                          group_broken=self._group_broken)
        return status


class StaleGroupLruBalancer(MiniGroupBalancer):
    """BUG: a group hit does not make the group entry most recent (R-GRP-4, group
    recency "touch"), so the wrong group is evicted when the group map is full."""

    def _group_lookup(self, group_id: str) -> str:
        return self._groups[group_id]


class KeepsRemovedGroupBalancer(MiniGroupBalancer):
    """BUG: a group pin on a removed server is kept in the map: the sibling is placed by
    load but the group entry is neither deleted nor re-pinned (R-GRP-2, R-GRP-4)."""

    def _group_pin(self, group_id: str) -> str | None:
        pinned = self._group_lookup(group_id)
        return pinned if pinned in self._inflight else None

    def _group_store(self, group_id: str, server_id: str) -> None:
        if group_id in self._groups and self._groups[group_id] not in self._inflight:
            return  # the stale pin stays
        super()._group_store(group_id, server_id)


class NoGroupFieldBalancer(MiniGroupBalancer):
    """Takes the group options but its acquire_server has no request_group_id."""

    def acquire_server(self, request_id: str | None) -> tuple[str, Any]:  # type: ignore[override]
        return super().acquire_server(request_id)
