"""Plain values and plain rules: the reference of :mod:`.bfs_spec_checks`.

Theory of operation
-------------------
:class:`_Plain` reads a state as plain values -- pool order, effective loads ``L``,
external loads ``X``, in-flight counts ``F = L - X``, the sticky map in recency order --
and the functions below restate SPEC's decisions over them: KEEP (section 10, with the
context band of section 7.5), the tie set's k-th server (section 8), the deterministic
index (R-DET-2, R-DET-3, CRC-32 from :mod:`binascii`), the refusals of R-ACQ-9 and the
lease verdict of R-LEASE-3. Nothing here calls the core's policy, machine or status
helpers.
"""

from __future__ import annotations

import binascii
from typing import Any

from affinity_engine import Acquire, Config, HashMode, Release, State, TieBreak

__all__ = ["plain_crc32"]


def plain_crc32(text: str) -> int:
    """R-HASH-1: CRC-32/ISO-HDLC of the UTF-8 bytes (binascii, not affinity_core.hashing)."""
    return binascii.crc32(text.encode("utf-8")) & 0xFFFFFFFF


class _Plain:
    """A state as plain values."""

    def __init__(self, state: State) -> None:
        items = state.pool.items()
        self.order = [s for s, _ in items]
        self.L = dict(items)
        self.X = {s: state.external[s] for s in state.external}
        self.F = {s: n - self.X.get(s, 0) for s, n in items} if self.X else self.L
        self.lru = list(state.lru.items())
        self.capacity = state.lru.capacity
        self.kept, self.broken = state.affinity_kept, state.affinity_broken


_last: list[Any] = [None, None]  # (state, _Plain): every edge of one pre-state shares it


def _plain(state: State) -> _Plain:
    if _last[0] is not state:
        _last[0], _last[1] = state, _Plain(state)
    plain: _Plain = _last[1]
    return plain


def _keep(c: Config, p: _Plain, pin: str, context_tokens: int | None = None) -> bool:
    """KEEP(p) of SPEC section 10, with the context band of section 7.5 (R-BAND-1)."""
    if c.full_determinism:
        return True
    low, high, mine = min(p.L.values()), max(p.L.values()), p.L[pin]
    m, t, cap = c.affinity_break_margin, c.affinity_break_tokens, c.affinity_break_band_cap
    if m is not None and t is not None and cap is not None:
        return mine <= low + min(m + (context_tokens or 0) // t, cap)
    if m is not None:
        return mine <= low + m
    gate = c.dual_threshold
    if gate is None:
        return True
    u, v = gate.balance_rel_threshold.numerator, gate.balance_rel_threshold.denominator
    imbalanced = (gate.balance_abs_threshold > 0 and high - low > gate.balance_abs_threshold
                  and high * v > low * u)
    return mine == low or not imbalanced


def _least_loaded(c: Config, p: _Plain, e: Acquire) -> str:
    """T[k] of SPEC section 8."""
    low = min(p.L.values())
    ties = [s for s in p.order if p.L[s] == low]
    if c.tie_break is TieBreak.FIRST:
        k = 0
    elif c.tie_break is TieBreak.HASHED and e.request_id is not None:
        k = plain_crc32(e.request_id) % len(ties)
    else:
        k = e.tie_draw % len(ties)
    return ties[k]


def _deterministic(c: Config, p: _Plain, e: Acquire) -> str:
    """R-DET-2 / R-DET-3 (Python's % is the floored mod the spec means)."""
    if c.hash_mode is HashMode.STABLE:
        assert e.request_id is not None
        return sorted(p.order)[plain_crc32(e.request_id) % len(p.order)]
    assert e.request_hash is not None
    return p.order[e.request_hash % len(p.order)]


def _det_refusal(c: Config, e: Acquire) -> str | None:
    if not c.full_determinism:
        return None
    if e.request_id is None:
        return "full_determinism needs a request_id"
    if c.hash_mode is HashMode.CALLER and e.request_hash is None:
        return "full_determinism with hash_mode 'caller' needs request_hash"
    return None


def _lease_verdict(state: State, e: Release) -> str:
    """R-LEASE-3: the oldest open lease of (rid, s) decides."""
    held = state.leases.held.get((e.request_id, e.server_id))
    if not held:
        return "unknown"
    return "current" if held[0][0] == state.leases.epoch.get(e.server_id) else "stale"
