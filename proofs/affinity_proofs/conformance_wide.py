"""Encoding conformance beyond the small world: the all-N encoding against the real core.

Theory of operation
-------------------
The proofs of :mod:`.z3_param_lemmas` are about the encoding in :mod:`.z3_param`. This
sweep links that encoding to ``affinity_engine.step`` where the small-world sweep of
:mod:`.conformance` cannot reach: pools of up to 130 servers (several leaves of the load
table), loads up to 10^6 around a common base (so the minimum is tied across leaves and a
gate's relative threshold is tested at minimum loads >= 4), caller hashes of any sign and
size (up to 2^70 in magnitude), all three tie-breaks, unkeyed requests under ``hashed``
ties, and the context band (T up to 10^6, contexts up to 10^12, near multiples of T).
The points are drawn in :mod:`.conformance_wide_points`.

Points are drawn by Hypothesis with ``derandomize=True`` and no example database: the
same points in every run and on every machine with the same Hypothesis version. For each
point:

1. the real core decides (chosen position, kept, broken, pin afterwards);
2. the spec's placement is computed from the plain definitions -- the tie set in pool
   order (R-TIE-1), ``k`` by R-TIE-2..4 (CRC-32 for ``hashed``, the draw for an unkeyed
   request), ``pool[h mod n]`` with Python's floored ``mod`` (R-DET-2);
3. the encoding is evaluated at the point (``substitute`` + ``simplify``): the witnesses
   of the minimum, maximum and placement must satisfy their definitions, and the decision
   (with the spec's placement) must equal the core's;
   With the context band, the encoding's ``T``, ``cap``, ``c`` and ``c = q*T + r`` are
   set from the point (Python's ``divmod``); without it the band is off and the context
   the acquire carries must change nothing (R-BAND-3);
4. at a legacy point (margin and gate null, ``first`` or ``draw`` ties) the all-N legacy
   encoding, its tie rank replaced by the concrete running count of minima
   (``substitute_funs``), must accept the server of the independent legacy model
   (``affinity_conformance.legacy``) and reject every other tie and the pin.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import attrs
import z3

from affinity_conformance.legacy import LegacyModel, Ties, legacy_acquire
from affinity_engine import (
    Acquire,
    Acquired,
    Config,
    LoadTable,
    Path,
    State,
    StickyLru,
    step,
)

from .conformance_wide_points import WidePoint, points
from .z3_param import Pool, decide, det_index, legacy_decide

__all__ = ["WidePoint", "WideResult", "check_point", "points", "run"]

RID = "conversation-7"


def _core(p: WidePoint) -> tuple[int, bool, bool, int]:
    servers = tuple(f"s{i}" for i in range(len(p.loads)))
    config = Config(affinity_break_margin=p.margin, dual_threshold=p.gate,
                    full_determinism=p.det, tie_break=p.tie_break, max_cache_size=4,
                    affinity_break_tokens=p.tokens, affinity_break_band_cap=p.cap)
    lru = StickyLru(4)
    if p.sticky != "miss":
        lru = lru.put(RID, "gone" if p.sticky == "removed" else servers[p.pin])
    pool = LoadTable.build(zip(servers, p.loads, strict=True))
    state = State(pool, lru, 0, 0, tuple(sorted(servers)))
    event = Acquire(request_id=RID if p.keyed else None, tie_draw=p.tie_draw,
                    request_hash=p.request_hash if p.det else None,
                    context_tokens=p.context)
    t = step(config, state, event)
    o = t.outcome
    if not isinstance(o, Acquired):
        raise ValueError(f"the core did not acquire: {o}")
    pinned = t.state.lru.peek(RID) if p.keyed else o.server_id
    return (servers.index(o.server_id), o.path is Path.KEPT, o.path is Path.BROKEN,
            servers.index(pinned or ""))


def spec_placement(p: WidePoint) -> int:
    """The least-loaded placement by the plain definitions of R-TIE-1..4."""
    low = min(p.loads)
    ties = [i for i, x in enumerate(p.loads) if x == low]
    if p.tie_break == "first":
        k = 0
    elif p.tie_break == "hashed" and p.keyed:
        k = zlib.crc32(RID.encode("utf-8")) % len(ties)
    else:
        k = p.tie_draw % len(ties)
    return ties[k]


class _Encoding:
    """The decision terms of :mod:`.z3_param`, built once, evaluated per point."""

    def __init__(self) -> None:
        self.pool = Pool(band=True)  # with band_on false it is the margin's encoding
        d = decide(self.pool)
        self.terms = (d.choice, d.kept, d.broken, d.pin_after)
        self.det_term = det_index(self.pool.hash, self.pool.n)
        self.rank = z3.Function("rank", z3.IntSort(), z3.IntSort())
        self.tie = z3.Int("tie")
        self.legacy, self.legacy_choice = legacy_decide(self.pool, self.rank, self.tie)

    def legacy_accepts(self, p: WidePoint, tie: int, candidates: list[int]) -> list[int]:
        """The candidate positions the all-N legacy encoding accepts at ``p``."""
        a, loads = self.pool, p.loads
        low, running, ranks = min(loads), 0, []
        for x in loads:
            ranks.append(running)
            running += x == low
        ranks.append(running)
        body: Any = z3.IntVal(-1)
        for i in reversed(range(len(ranks))):
            body = z3.If(z3.Var(0, z3.IntSort()) == i, ranks[i], body)
        term = z3.substitute_funs(self.legacy, (self.rank, body))
        term = z3.simplify(z3.substitute(term, *[
            (a.n, z3.IntVal(len(loads))), (a.pin, z3.IntVal(p.pin)),
            (a.hit, z3.BoolVal(p.sticky == "hit")), (a.det, z3.BoolVal(p.det)),
            (a.hash, z3.IntVal(p.request_hash)), (self.tie, z3.IntVal(tie))]))
        return [c for c in candidates if z3.is_true(z3.simplify(
            z3.substitute(term, (self.legacy_choice, z3.IntVal(c)))))]

    def evaluate(self, p: WidePoint, placement: int) -> tuple[Any, ...]:
        a, loads = self.pool, p.loads
        # The decision reads the loads only at the pin, the witnesses and the placement;
        # every other position reads -1, which no well-formed load equals.
        w_min, w_max = loads.index(min(loads)), loads.index(max(loads))
        array: Any = z3.K(z3.IntSort(), z3.IntVal(-1))
        for i in {p.pin, w_min, w_max, placement}:
            array = z3.Store(array, i, loads[i])
        gate = p.gate
        pairs = [
            (a.n, z3.IntVal(len(loads))), (a.loads, array),
            (a.w_min, z3.IntVal(w_min)), (a.w_max, z3.IntVal(w_max)),
            (a.pin, z3.IntVal(p.pin)), (a.hit, z3.BoolVal(p.sticky == "hit")),
            (a.least, z3.IntVal(placement)),
            (a.margin_on, z3.BoolVal(p.margin is not None)),
            (a.margin, z3.IntVal(p.margin or 0)),
            (a.gate_on, z3.BoolVal(gate is not None)),
            (a.gate_abs, z3.IntVal(0 if gate is None else gate.balance_abs_threshold)),
            (a.rel_num, z3.IntVal(1 if gate is None else gate.balance_rel_threshold.numerator)),
            (a.rel_den,
             z3.IntVal(1 if gate is None else gate.balance_rel_threshold.denominator)),
            (a.det, z3.BoolVal(p.det)), (a.hash, z3.IntVal(p.request_hash)),
            *_band_pairs(a, p),
        ]
        at_min = z3.simplify(z3.substitute(a.loads[a.least] == a.low, *pairs))
        values = [z3.simplify(z3.substitute(t, *pairs)) for t in self.terms]
        return (z3.is_true(at_min), *[_value(v) for v in values])


def _band_pairs(a: Pool, p: WidePoint) -> list[tuple[Any, Any]]:
    """The band's inputs at ``p``: ``c = q*T + r`` by Python's divmod (T = 1 and q = r = 0
    without the band, where the encoding does not read them)."""
    c, t = p.context or 0, p.tokens or 1
    q, r = divmod(c, t) if p.tokens is not None else (0, 0)
    return [(a.band_on, z3.BoolVal(p.tokens is not None)), (a.tokens, z3.IntVal(t)),
            (a.cap, z3.IntVal(p.cap or 0)), (a.ctx, z3.IntVal(c)), (a.quot, z3.IntVal(q)),
            (a.rem, z3.IntVal(r))]


def _value(term: Any) -> int | bool:
    if z3.is_int_value(term):
        return int(term.as_long())
    if z3.is_true(term) or z3.is_false(term):
        return bool(z3.is_true(term))
    raise ValueError(f"the encoding did not reduce to a value: {term}")


def check_point(p: WidePoint, enc: _Encoding) -> str | None:
    """None if the all-N encoding agrees with the core at ``p``, else the disagreement."""
    try:
        core = _core(p)
    except Exception as exc:  # a crash of the core is a disagreement
        return f"{_describe(p)}: the core raised {type(exc).__name__}: {exc}"
    placement = spec_placement(p)
    if p.det:
        placement_text = f"pool[{p.request_hash} mod {len(p.loads)}]"
    else:
        placement_text = f"tie position {placement}"
    at_min, *decision = enc.evaluate(p, placement)
    if not at_min:
        return f"{_describe(p)}: the spec placement {placement} is not at the minimum"
    got = tuple(decision)
    if got != core:
        return (f"{_describe(p)}: core (choice, kept, broken, pin) = {core}, "
                f"all-N encoding with {placement_text} = {got}")
    if p.margin is None and p.gate is None and p.keyed and p.tie_break != "hashed":
        return _check_legacy(p, enc)
    return None


def _check_legacy(p: WidePoint, enc: _Encoding) -> str | None:
    servers = [f"s{i}" for i in range(len(p.loads))]
    lru: tuple[tuple[str, str], ...] = ()
    if p.sticky != "miss":
        lru = ((RID, "gone" if p.sticky == "removed" else servers[p.pin]),)
    model = LegacyModel(tuple(zip(servers, p.loads, strict=True)), lru, 4, p.det)
    ties: Ties = "first" if p.tie_break == "first" else "draw"
    result = legacy_acquire(model, RID, ties=ties, tie_draw=p.tie_draw,
                            request_hash=p.request_hash)
    expected = servers.index(result.server_id or "")
    low = min(p.loads)
    tied = [i for i, x in enumerate(p.loads) if x == low]
    tie = 0 if ties == "first" else p.tie_draw % len(tied)
    candidates = sorted({expected, p.pin, *tied[:8], *tied[-8:]})
    accepted = enc.legacy_accepts(p, tie, candidates)
    if accepted != [expected]:
        return (f"{_describe(p)}: the all-N legacy encoding accepts {accepted} of "
                f"{candidates}, the legacy model chose {expected}")
    return None


def _describe(p: WidePoint) -> str:
    loads = p.loads if len(p.loads) <= 8 else f"{p.loads[:6]}... ({len(p.loads)} servers, " \
        f"min {min(p.loads)} x{p.loads.count(min(p.loads))}, max {max(p.loads)})"
    band = f" band T={p.tokens} cap={p.cap}" if p.tokens is not None else ""
    policy = f"margin {p.margin}{band}" if p.margin is not None else (
        f"gate {p.gate.balance_abs_threshold}/{p.gate.balance_rel_threshold}" if p.gate
        else "legacy")
    return (f"loads={loads} {p.sticky} pin={p.pin} {policy} det={p.det} "
            f"hash={p.request_hash} ties={p.tie_break} keyed={p.keyed} draw={p.tie_draw} "
            f"context={p.context}")


@attrs.frozen
class WideResult:
    points: int
    seconds: float
    failures: tuple[str, ...]
    max_n: int
    max_load: int
    negative_hashes: int
    gate_min_ge_4: int
    legacy_points: int
    band_points: int = 0
    band_hits_at_edge: int = 0  # band hits with the pin at min + width or one above


def run(count: int, max_failures: int = 3,
        sample: list[WidePoint] | None = None) -> WideResult:
    start = time.perf_counter()
    sample = points(count) if sample is None else sample
    enc = _Encoding()
    failures: list[str] = []
    for p in sample:
        message = check_point(p, enc)
        if message is not None:
            failures.append(message)
            if len(failures) >= max_failures:
                break
    return WideResult(
        len(sample), time.perf_counter() - start, tuple(failures),
        max(len(p.loads) for p in sample), max(max(p.loads) for p in sample),
        sum(1 for p in sample if p.det and p.request_hash < 0),
        sum(1 for p in sample if p.gate is not None and min(p.loads) >= 4),
        sum(1 for p in sample if p.margin is None and p.gate is None and p.keyed
            and p.tie_break != "hashed"),
        sum(1 for p in sample if p.tokens is not None),
        sum(1 for p in sample if _at_band_edge(p)))


def _at_band_edge(p: WidePoint) -> bool:
    if p.tokens is None or p.cap is None or p.margin is None or p.sticky != "hit" or p.det:
        return False
    width = min(p.margin + (p.context or 0) // p.tokens, p.cap)
    return p.loads[p.pin] - min(p.loads) in (width, width + 1)
