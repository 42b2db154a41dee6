"""Obligations 15-18: every event's outcome, effect and status against SPEC's plain rules.

Theory of operation
-------------------
The checks of :mod:`.bfs_checks` state properties (a band, a bound, an equivalence with
the legacy model in legacy configurations). They do not say that an outcome's fields are
right, what ``status`` reports once loads were observed, or that the lease counters move.
This module restates spec/SPEC.md sections 5, 8-12 and 15 as *plain definitions* over
the pre-state's plain values -- pool order with effective loads ``L``, external loads
``X``, in-flight counts ``F = L - X``, the sticky map in recency order, the lease book's
held leases and epochs -- and compares every edge of every BFS run with them:

* obligation 15 (R-OUT-3, R-ACQ-1..8, R-TIE-1..4, R-RLS-1, R-POOL-1..3, R-CLR-1, R-OBS-1):
  the outcome with every field (server, path, ``previous``, ``evicted``, release result,
  pool order, clear's entries and ``F`` loads, observed/ignored) and the successor's
  ``F``, ``X``, pool order, sticky map in recency order and counters;
* obligation 16 (R-STAT-1, R-OBS-2): ``status`` equals its table, computed from ``F``,
  ``X`` and the configuration, on every distinct state;
* obligation 17 (R-LEASE-3, R-LEASE-6): a release's lease verdict and the monotonic
  ``unknown_leases`` / ``stale_leases`` counters (stored states hold them at 0, so the
  check is inductive: the successor's counter is the pre-state's plus this edge's count);
* obligation 18 (R-ACQ-9, R-DET-2, R-DET-3, R-HASH-1): under ``full_determinism`` an
  acquire is refused exactly when it lacks a request id, or a ``request_hash`` in
  ``caller`` mode -- so ``stable`` mode *accepts* an acquire without a hash -- and a
  placement takes ``P[h mod n]`` (floored mod: negative and huge hashes included) or
  ``sorted(P)[crc32(rid) mod n]``, with CRC-32 from :mod:`binascii`, not the core's
  ``stable_hash``.

Nothing here calls the core's policy, machine or status helpers: only the plain fields
of the state and the configuration are read. The plain values and decisions (KEEP with
the context band of section 7.5, the tie set, the deterministic index, the lease
verdict) are in :mod:`.bfs_spec_plain`.
"""

from __future__ import annotations

import importlib
from typing import Any

from affinity_core.outcomes import NO_SERVERS_MESSAGE
from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    Config,
    LoadsObserved,
    ObserveLoads,
    Path,
    PoolChanged,
    Rejected,
    RejectReason,
    Release,
    Released,
    ReleaseResult,
    RemoveServers,
    State,
    StickyCacheCleared,
)

from .bfs import Check, Edge
from .bfs_spec_plain import (
    _det_refusal,
    _deterministic,
    _keep,
    _lease_verdict,
    _least_loaded,
    _Plain,
    _plain,
    plain_crc32,
)

__all__ = ["SPEC_CHECKS", "effects_violation", "expected_status", "plain_crc32"]

# The status module by name (the package re-exports the function under the same name), so
# that a negative control patching ``affinity_engine.status.status`` is seen here.
status_mod = importlib.import_module("affinity_engine.status")
allowed_mod = importlib.import_module("affinity_engine.allowed")


Expected = tuple[Any, dict[str, Any]]  # (outcome, successor as plain values)


def _plain_after(t_state: State) -> dict[str, Any]:
    after = _Plain(t_state)
    return {"order": after.order, "F": after.F, "X": after.X, "lru": after.lru,
            "counters": (after.kept, after.broken)}


def _expect_acquire(c: Config, p: _Plain, e: Acquire) -> Expected:
    same = {"order": p.order, "F": p.F, "X": p.X, "lru": p.lru,
            "counters": (p.kept, p.broken)}
    refusal = _det_refusal(c, e)
    if refusal is not None:
        return Rejected(RejectReason.INVALID_FOR_CONFIG, refusal), same
    rid, lru = e.request_id, list(p.lru)
    pinned = dict(lru).get(rid) if rid is not None else None
    kept, broken = p.kept, p.broken
    if rid is None:
        path = Path.UNKEYED
    elif pinned is None:
        path = Path.NEW
    elif pinned not in p.L:
        path = Path.RESELECTED
        lru = [(r, s) for r, s in lru if r != rid]
    else:
        path = Path.KEPT if _keep(c, p, pinned, e.context_tokens) else Path.BROKEN
    if path is Path.KEPT:
        assert rid is not None and pinned is not None
        chosen = pinned
        lru = [(r, s) for r, s in lru if r != rid] + [(rid, pinned)]
        kept += 1
    elif not p.order:
        return Rejected(RejectReason.NO_SERVERS, NO_SERVERS_MESSAGE), {**same, "lru": lru}
    elif path is not Path.BROKEN and c.full_determinism:
        chosen = _deterministic(c, p, e)
    else:
        chosen = _least_loaded(c, p, e)
    evicted = None
    if path in (Path.NEW, Path.RESELECTED, Path.BROKEN):
        assert rid is not None
        if path is Path.NEW and len(lru) >= p.capacity:
            evicted, lru = lru[0][0], lru[1:]
        lru = [(r, s) for r, s in lru if r != rid] + [(rid, chosen)]
        broken += path is Path.BROKEN
    previous = pinned if path in (Path.BROKEN, Path.RESELECTED) else None
    counts = dict(p.F)
    counts[chosen] += 1
    return Acquired(chosen, path, previous, evicted), {
        **same, "F": counts, "lru": lru, "counters": (kept, broken)}


def _expect_release(c: Config, p: _Plain, pre: State, e: Release) -> Expected:
    same = {"order": p.order, "F": p.F, "X": p.X, "lru": p.lru,
            "counters": (p.kept, p.broken)}
    s = e.server_id
    if c.lease_accounting:
        verdict = _lease_verdict(pre, e)
        result = {"current": ReleaseResult.APPLIED, "stale": ReleaseResult.STALE_LEASE,
                  "unknown": ReleaseResult.UNKNOWN_LEASE}[verdict]
    elif s not in p.L:
        result = ReleaseResult.UNKNOWN_SERVER
    elif p.F[s] == 0:
        result = ReleaseResult.AT_ZERO
    else:
        result = ReleaseResult.APPLIED
    if result is ReleaseResult.APPLIED:
        return Released(s, result), {**same, "F": {**p.F, s: p.F[s] - 1}}
    return Released(s, result), same


def _expect_pool(c: Config, p: _Plain, e: AddServers | RemoveServers) -> Expected:
    order, F, X = list(p.order), dict(p.F), dict(p.X)
    if isinstance(e, AddServers):
        for s in e.server_ids:
            if s not in F:
                order.append(s)
            if s not in p.F or not c.lease_accounting:  # R-POOL-2, R-LEASE-4, R-OBS-2
                F[s] = 0
                X.pop(s, None)
    else:
        for s in e.server_ids:
            if s in F:
                order.remove(s)
                del F[s]
                X.pop(s, None)
    return PoolChanged(tuple(order)), {"order": order, "F": F, "X": X, "lru": p.lru,
                                       "counters": (p.kept, p.broken)}


def _expect(c: Config, pre: State, e: Any) -> Expected:
    p = _plain(pre)
    same = {"order": p.order, "F": p.F, "X": p.X, "lru": p.lru,
            "counters": (p.kept, p.broken)}
    if isinstance(e, Acquire):
        return _expect_acquire(c, p, e)
    if isinstance(e, Release):
        return _expect_release(c, p, pre, e)
    if isinstance(e, (AddServers, RemoveServers)):
        return _expect_pool(c, p, e)
    if isinstance(e, ClearStickyCache):  # R-CLR-1, R-OBS-2: F, read before clearing
        return StickyCacheCleared(len(p.lru), tuple((s, p.F[s]) for s in p.order)), {
            **same, "lru": []}
    assert isinstance(e, ObserveLoads)  # R-OBS-1
    X = dict(p.X)
    updated: list[str] = []
    ignored: list[str] = []
    for s, n in e.observed:
        if s not in p.L:
            ignored.append(s)
            continue
        extra = max(0, n - p.F[s])
        if extra:
            X[s] = extra
        else:
            X.pop(s, None)
        updated.append(s)
    return LoadsObserved(tuple(updated), tuple(ignored)), {**same, "X": X}


def _plain_allowed(c: Config, p: _Plain, e: Acquire, outcome: Any) -> frozenset[str]:
    """R-REL-1 from the expected outcome: empty, the pin, the deterministic server, or T."""
    if not isinstance(outcome, Acquired):
        return frozenset()
    if outcome.path is Path.KEPT or (c.full_determinism and outcome.path is not Path.BROKEN):
        return frozenset((outcome.server_id,))
    low = min(p.L.values())
    return frozenset(s for s in p.order if p.L[s] == low)


def effects_violation(edge: Edge, with_allowed: bool = False) -> str | None:
    """Obligation 15 on one edge: the outcome and the successor SPEC's rules give, and
    (``with_allowed``, the decision table) the decision relation ``allowed`` (R-REL-1)."""
    t = edge.transition
    assert t is not None
    outcome, after = _expect(edge.config, edge.pre, edge.event)
    if t.outcome != outcome:
        return f"outcome {t.outcome!r}, SPEC says {outcome!r}"
    if with_allowed and isinstance(edge.event, Acquire):
        got_allowed = allowed_mod.allowed(edge.config, edge.pre, edge.event)
        want_allowed = _plain_allowed(edge.config, _plain(edge.pre), edge.event, outcome)
        if got_allowed != want_allowed:
            return f"allowed = {sorted(got_allowed)}, R-REL-1 says {sorted(want_allowed)}"
    state, F, X = t.state, after["F"], after["X"]
    want_items = tuple((s, F[s] + X.get(s, 0)) for s in after["order"])
    got_x = dict(state.external.items()) if state.external else {}
    if state.pool.items() != want_items or got_x != X:
        got = _plain_after(state)
        return f"after the event (F, X) = ({got['F']}, {got['X']}) in pool order " \
               f"{got['order']}, SPEC says ({F}, {X}) in {after['order']}"
    if state.lru.items() != tuple(after["lru"]):
        return f"after the event the sticky map is {state.lru.items()}, SPEC says " \
               f"{tuple(after['lru'])}"
    if (state.affinity_kept, state.affinity_broken) != after["counters"]:
        return f"after the event (kept, broken) = {(state.affinity_kept, state.affinity_broken)}" \
               f", SPEC says {after['counters']}"
    if state.sorted_servers != tuple(sorted(after["order"])):
        return f"sorted_servers {state.sorted_servers!r} is not the sorted pool"
    if state.lru.capacity != edge.pre.lru.capacity:
        return f"sticky map capacity {state.lru.capacity} != {edge.pre.lru.capacity}"
    return None


# ------------------------------------------------------------------ 16 status view
def expected_status(c: Config, state: State) -> dict[str, Any]:
    """The table of R-STAT-1, from F, X and the configuration."""
    p = _Plain(state)
    out: dict[str, Any] = {
        "servers": {s: p.F[s] for s in p.order}, "total_inflight": sum(p.F.values()),
        "active_servers": len(p.order), "registered_handles": list(p.order),
        "affinity_break_margin": c.affinity_break_margin,
        "affinity_kept": p.kept, "affinity_broken": p.broken,
        "policy": "margin" if c.affinity_break_margin is not None else (
            "dual_threshold" if c.dual_threshold is not None else "legacy"),
        "tie_break": c.tie_break.value, "hash_mode": c.hash_mode.value,
        "full_determinism": c.full_determinism, "sticky_entries": len(p.lru),
        "lease_accounting": c.lease_accounting,
    }
    if c.dual_threshold is not None:
        rel = c.dual_threshold.balance_rel_threshold
        out["balance_abs_threshold"] = c.dual_threshold.balance_abs_threshold
        out["balance_rel_threshold"] = str(rel.numerator) if rel.denominator == 1 else \
            f"{rel.numerator}/{rel.denominator}"
    if p.X:
        out["external_loads"] = {s: p.X[s] for s in p.order if s in p.X}
    if c.lease_accounting:
        out["unknown_leases"] = state.leases.unknown_leases
        out["stale_leases"] = state.leases.stale_leases
    return out


def _status(edge: Edge) -> str | None:
    t = edge.transition
    assert t is not None
    got = status_mod.status(edge.config, t.state)
    want = expected_status(edge.config, t.state)
    if got != want or list(got["servers"]) != list(want["servers"]):
        diff = sorted(k for k in {*got, *want} if got.get(k) != want.get(k))
        return f"status differs from R-STAT-1 at {diff}: " + ", ".join(
            f"{k}={got.get(k)!r} (SPEC {want.get(k)!r})" for k in diff[:3])
    return None


# --------------------------------------------------------------- 17 lease counters
def _lease_counters(edge: Edge) -> str | None:
    t, pre, e = edge.transition, edge.pre, edge.event
    assert t is not None
    unknown = stale = 0
    if isinstance(e, Release):
        verdict = _lease_verdict(pre, e)
        unknown, stale = verdict == "unknown", verdict == "stale"
        o = t.outcome
        want = {"current": ReleaseResult.APPLIED, "stale": ReleaseResult.STALE_LEASE,
                "unknown": ReleaseResult.UNKNOWN_LEASE}[verdict]
        if not isinstance(o, Released) or o.result is not want:
            return f"release settles a {verdict} lease but the outcome is {o!r}"
    got = (t.state.leases.unknown_leases, t.state.leases.stale_leases)
    want_counts = (pre.leases.unknown_leases + unknown, pre.leases.stale_leases + stale)
    if got != want_counts:
        return f"(unknown_leases, stale_leases) = {got}, SPEC says {want_counts}"
    return None


# ------------------------------------------------------------ 18 deterministic mode
def _deterministic_inputs(edge: Edge) -> str | None:
    c, e, t = edge.config, edge.event, edge.transition
    assert t is not None and isinstance(e, Acquire)
    refusal = _det_refusal(c, e)
    o = t.outcome
    if refusal is not None:
        if o != Rejected(RejectReason.INVALID_FOR_CONFIG, refusal) or t.state != edge.pre:
            return f"{e!r} must be refused ({refusal!r}) without a change, got {o!r}"
        return None
    if isinstance(o, Rejected) and o.reason is RejectReason.INVALID_FOR_CONFIG:
        return f"{e!r} carries every input {c.hash_mode.value!r} mode needs, refused: {o!r}"
    if isinstance(o, Acquired) and o.path in (Path.NEW, Path.RESELECTED):
        want = _deterministic(c, _plain(edge.pre), e)
        if o.server_id != want:
            return f"placed on {o.server_id}, R-DET-2/3 say {want} " \
                   f"(hash {e.request_hash}, pool {edge.pre.pool.servers})"
    return None


SPEC_CHECKS: tuple[Check, ...] = (
    Check("outcome_and_effect", 15, lambda c: True, effects_violation),
    Check("status_view", 16, lambda c: True, _status, per_state=True),
    # A release that only moves a lease counter leads to a stored state seen before (the
    # counters are stored at 0), so per-state alone would never show status at 1.
    Check("status_view_after_release", 16, lambda c: c.lease_accounting, _status,
          events=(Release,)),
    Check("lease_counters", 17, lambda c: c.lease_accounting, _lease_counters),
    Check("deterministic_inputs", 18, lambda c: c.full_determinism, _deterministic_inputs,
          events=(Acquire,)),
)
