"""Encoding conformance beyond the small world: the all-N encoding against the real core.

Theory of operation
-------------------
The proofs of :mod:`.z3_param_lemmas` are about the encoding in :mod:`.z3_param`. This
sweep links that encoding to ``affinity_core.step`` where the small-world sweep of
:mod:`.conformance` cannot reach: pools of up to 130 servers (several leaves of the load
table), loads up to 10^6 around a common base (so the minimum is tied across leaves and a
gate's relative threshold is tested at minimum loads >= 4), caller hashes of any sign and
size (up to 2^70 in magnitude), all three tie-breaks and unkeyed requests under ``hashed``
ties.

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
4. at a legacy point (margin and gate null, ``first`` or ``draw`` ties) the all-N legacy
   encoding, its tie rank replaced by the concrete running count of minima
   (``substitute_funs``), must accept the server of the independent legacy model
   (``affinity_core.legacy``) and reject every other tie and the pin.
"""

from __future__ import annotations

import contextlib
import importlib
import random
import time
import zlib
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import attrs
import z3

from affinity_core import (
    Acquire,
    Acquired,
    Config,
    DualThreshold,
    LoadTable,
    Path,
    State,
    StickyLru,
    step,
)
from affinity_core.legacy import LegacyModel, Ties, legacy_acquire

from .z3_param import Pool, decide, det_index, legacy_decide

__all__ = ["WidePoint", "WideResult", "check_point", "points", "run"]

SIZES = (1, 2, 31, 32, 33, 63, 64, 65, 96, 97, 130)
RELATIVE = (Fraction(1), Fraction(5, 4), Fraction(3, 2), Fraction(2), Fraction(7, 3))


@attrs.frozen
class WidePoint:
    loads: tuple[int, ...]
    sticky: str  # "miss", "hit", "removed"
    pin: int
    margin: int | None
    gate: DualThreshold | None
    det: bool
    request_hash: int
    tie_break: str  # "first", "draw", "hashed"
    keyed: bool
    tie_draw: int


def _strategy() -> Any:
    from hypothesis import strategies as st

    @st.composite
    def point(draw: Any) -> WidePoint:
        # The bulk comes from a Random seeded by a Hypothesis draw: the same points every
        # run, without a Hypothesis draw per server.
        seed = draw(st.integers(0, 2**32))
        n = draw(st.one_of(st.sampled_from(SIZES), st.integers(1, 130)))
        base = draw(st.one_of(st.integers(0, 8), st.integers(4, 10**6)))
        request_hash = draw(st.one_of(st.integers(-(2**70), 2**70),
                                      st.integers(-3 * n, 3 * n)))
        # seeded by every draw (a str seed is hashed with SHA-512: no PYTHONHASHSEED)
        rng = random.Random(f"{seed}:{n}:{base}:{request_hash}")
        if rng.random() < 0.6:  # beside Hypothesis' boundary values, uniform ones
            n = rng.choice((*SIZES, rng.randint(1, 130)))
            base = rng.choice((rng.randint(0, 8), rng.randint(4, 10**6)))

        def offset() -> int:
            return rng.randint(1, 3) if rng.random() < 0.7 else rng.randint(1, 10**6)

        if draw(st.booleans()):  # dense: about half the servers at the minimum
            loads = [base + offset() if rng.random() < 0.5 else base for _ in range(n)]
        else:  # sparse: the minimum at a few positions, so most leaves hold none
            minima = {rng.randrange(n) for _ in range(rng.randint(1, 3))}
            loads = [base if i in minima else base + offset() for i in range(n)]
        # The choices below come from the seeded Random too: Hypothesis' own draws lean
        # towards simple values, which left whole combinations (a gate on a sticky hit)
        # out of a few hundred points. Hashes stay Hypothesis draws (0, -1, huge).
        det = rng.random() < 0.25
        tie_break = rng.choice(("first", "draw", "hashed"))
        # unkeyed requests mostly where they matter: hashed ties fall back to the draw
        keyed = det or rng.random() < (0.5 if tie_break == "hashed" else 0.8)
        stickies = ("miss", "removed", "hit") if det else ("miss", "hit", "hit", "removed")
        sticky = rng.choice(stickies) if keyed else "miss"
        pin = rng.randrange(n)
        policy = rng.randrange(3)
        margin = (rng.randint(0, 4) if rng.random() < 0.7 else rng.randint(0, 10**6)) \
            if policy == 1 else None
        gate = DualThreshold(rng.randint(0, 6), rng.choice(RELATIVE)) if policy == 2 else None
        if margin is not None and sticky == "hit" and rng.random() < 0.5:
            loads[pin] = min(loads) + margin + rng.randint(0, 1)  # the band's edge
        if gate is not None and sticky == "hit" and n >= 3 and rng.random() < 0.6:
            loads = _gate_edge(loads, pin, gate, rng.randint(-1, 1))
        if rng.random() < 0.4:  # negative, with every residue mod n
            request_hash = -abs(request_hash) - 1 - rng.randrange(n)
        return WidePoint(tuple(loads), sticky, pin, margin, gate, det, request_hash,
                         tie_break, keyed, rng.randrange(2**40))

    return point()


def _gate_edge(loads: list[int], pin: int, gate: DualThreshold, nudge: int) -> list[int]:
    """Loads at the edge of the gate's relative test: max = min * rel (+-1), with the
    absolute test passed and the pin above the minimum, so only the relative test
    decides whether the pin is kept."""
    n, low, rel = len(loads), max(min(loads), 4), gate.balance_rel_threshold
    high = max(low + gate.balance_abs_threshold + 1,
               low * rel.numerator // rel.denominator + nudge)
    out = [min(max(x, low), high) for x in loads]
    out[(pin + 1) % n], out[(pin + 2) % n] = low, high
    out[pin] = low + 1 if high > low + 1 else high
    return out


def points(count: int) -> list[WidePoint]:
    """``count`` points, the same ones in every run (Hypothesis, derandomized)."""
    from hypothesis import HealthCheck, Phase, given, settings

    out: dict[WidePoint, None] = {}  # distinct points in drawing order

    @settings(derandomize=True, database=None, max_examples=3 * count, deadline=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(_strategy())
    def collect(p: WidePoint) -> None:
        if len(out) < count:  # derandomized Hypothesis repeats its early, simple draws
            out[p] = None

    with _without_local_constants():
        collect()
    return list(out)


@contextlib.contextmanager
def _without_local_constants() -> Iterator[None]:
    """Hypothesis (6.13x and later) mixes literal constants from every *loaded* module of
    the project into its draws, so the derandomized points would depend on which modules
    a process happened to import before (measured: importing ``scopes`` first changed
    them). For the duration of the draw that pool is empty; where this Hypothesis has no
    such pool, nothing changes (``tests/proofs/test_z3_param.py`` checks the points are
    the same whatever was imported first)."""
    try:
        providers: Any = importlib.import_module("hypothesis.internal.conjecture.providers")
        empty = providers.Constants(integers=providers.SortedSet(),
                                    floats=providers.SortedSet(key=providers.float_to_int),
                                    bytes=providers.SortedSet(),
                                    strings=providers.SortedSet())
        original = providers._get_local_constants
    except (ImportError, AttributeError):
        yield
        return
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = original


RID = "conversation-7"


def _core(p: WidePoint) -> tuple[int, bool, bool, int]:
    servers = tuple(f"s{i}" for i in range(len(p.loads)))
    config = Config(affinity_break_margin=p.margin, dual_threshold=p.gate,
                    full_determinism=p.det, tie_break=p.tie_break, max_cache_size=4)
    lru = StickyLru(4)
    if p.sticky != "miss":
        lru = lru.put(RID, "gone" if p.sticky == "removed" else servers[p.pin])
    pool = LoadTable.build(zip(servers, p.loads, strict=True))
    state = State(pool, lru, 0, 0, tuple(sorted(servers)))
    event = Acquire(request_id=RID if p.keyed else None, tie_draw=p.tie_draw,
                    request_hash=p.request_hash if p.det else None)
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
        self.pool = Pool()
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
        busy = [x if x > 0 else max(loads) for x in loads]
        w_min, w_max, w_busy = loads.index(min(loads)), loads.index(max(loads)), \
            busy.index(min(busy))
        array: Any = z3.K(z3.IntSort(), z3.IntVal(-1))
        for i in {p.pin, w_min, w_max, w_busy, placement}:
            array = z3.Store(array, i, loads[i])
        gate = p.gate
        pairs = [
            (a.n, z3.IntVal(len(loads))), (a.loads, array),
            (a.w_min, z3.IntVal(w_min)), (a.w_max, z3.IntVal(w_max)),
            (a.w_busy, z3.IntVal(w_busy)),
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
        ]
        at_min = z3.simplify(z3.substitute(a.loads[a.least] == a.low, *pairs))
        values = [z3.simplify(z3.substitute(t, *pairs)) for t in self.terms]
        return (z3.is_true(at_min), *[_value(v) for v in values])


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
    policy = f"margin {p.margin}" if p.margin is not None else (
        f"gate {p.gate.balance_abs_threshold}/{p.gate.balance_rel_threshold}" if p.gate
        else "legacy")
    return (f"loads={loads} {p.sticky} pin={p.pin} {policy} det={p.det} "
            f"hash={p.request_hash} ties={p.tie_break} keyed={p.keyed} draw={p.tie_draw}")


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
            and p.tie_break != "hashed"))
