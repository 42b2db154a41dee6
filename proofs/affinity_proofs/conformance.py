"""Encoding conformance: the Z3 terms must agree with the real core on concrete inputs.

Theory of operation
-------------------
A Z3 proof is only as good as the encoding it proves things about. This module pins the
encoding of :mod:`.z3_model` to the production code: for each concrete acquire (loads,
sticky situation, policy, determinism, tie draw) it

1. runs the *real* ``affinity_engine.step`` on a state built from those values (draw
   tie-break, so the event's ``tie_draw`` selects the tie exactly like the encoding's
   ``tie``), and reads the chosen server, the path and the pin afterwards;
2. substitutes the same values into the functional encoding (``decide`` over
   ``AcquireVars(n)``) and simplifies -- choice, kept, broken and pin must match, and the
   domain constraint must hold;
3. does the same for the relational encoding (``AcquireVars(n, relational=True)``),
   whose fresh minimum/maximum/pinned-load/placement variables are set from the core's
   state and choice: the domain constraints must accept them and the choice must match;
4. for the legacy policy, checks the relational legacy encoding against
   ``affinity_conformance.legacy.legacy_acquire``: it must accept the legacy model's server and
   reject every other one.

The points are every case for one and two servers with loads up to 2, then a seeded
sample for three and four servers. If someone changes ``<=`` to ``<`` in the core's keep
rule, step 2 fails on the boundary ``load[pin] == min + m``.
"""

from __future__ import annotations

import functools
import itertools
import random
import time
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import attrs
import z3

from affinity_conformance.legacy import LegacyModel, legacy_acquire
from affinity_engine import (
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
from affinity_engine.policy import least_loaded

from .z3_model import AcquireVars, decide, legacy_decide

__all__ = ["ConformanceResult", "Point", "check_point", "points", "run"]

POLICIES: tuple[tuple[int | None, DualThreshold | None], ...] = (
    (None, None), (0, None), (1, None), (2, None),
    (None, DualThreshold(1, Fraction(3, 2))), (None, DualThreshold(0, Fraction(1))),
    (None, DualThreshold(2, Fraction(1))),
)


@attrs.frozen
class Point:
    loads: tuple[int, ...]
    sticky: str  # "miss", "hit", "removed" (pinned to a server no longer in the pool)
    pin: int
    margin: int | None
    gate: DualThreshold | None
    det: bool
    det_index: int
    tie: int


def points(sample: int, seed: int = 20260815) -> Iterator[Point]:
    """Every small case (n <= 2, loads <= 2), then ``sample`` seeded ones at n = 3, 4."""
    for n in (1, 2):
        for loads in itertools.product(range(3), repeat=n):
            yield from _cases(loads)
    rng = random.Random(seed)
    for _ in range(sample):
        loads = tuple(rng.randrange(5) for _ in range(rng.choice((3, 4))))
        yield rng.choice(list(_cases(loads)))


def _cases(loads: tuple[int, ...]) -> Iterator[Point]:
    n, low = len(loads), min(loads)
    ties = loads.count(low)
    stickies = [("miss", 0), ("removed", 0), *[("hit", p) for p in range(n)]]
    for (sticky, pin), (margin, gate), det in itertools.product(stickies, POLICIES,
                                                                (False, True)):
        for det_index in range(n) if det else (0,):
            for tie in range(ties) if not det else (0,):
                yield Point(loads, sticky, pin, margin, gate, det, det_index, tie)


def _core(p: Point) -> tuple[int, bool, bool, int, int]:
    """(choice, kept, broken, pin_after, least) from the real core."""
    servers = tuple(f"s{i}" for i in range(len(p.loads)))
    config = Config(affinity_break_margin=p.margin, dual_threshold=p.gate,
                    full_determinism=p.det, tie_break="draw", max_cache_size=4)
    lru = StickyLru(4)
    if p.sticky != "miss":
        lru = lru.put("r", "gone" if p.sticky == "removed" else servers[p.pin])
    pool = LoadTable.build(zip(servers, p.loads, strict=True))
    state = State(pool, lru, 0, 0, tuple(sorted(servers)))
    event = Acquire(request_id="r", tie_draw=p.tie,
                    request_hash=p.det_index if p.det else None)
    o = step(config, state, event).outcome
    assert isinstance(o, Acquired), o
    pin_after = step(config, state, event).state.lru.peek("r")
    least = servers.index(least_loaded(config, pool, event))
    return (servers.index(o.server_id), o.path is Path.KEPT, o.path is Path.BROKEN,
            servers.index(pin_after or ""), least)


@functools.cache
def _int(v: int) -> Any:
    return z3.IntVal(v)


_BOOL = {True: z3.BoolVal(True), False: z3.BoolVal(False)}


def _config_pairs(a: AcquireVars, p: Point) -> list[tuple[Any, Any]]:
    gate = p.gate
    return [
        (a.margin_on, z3.BoolVal(p.margin is not None)), (a.margin, z3.IntVal(p.margin or 0)),
        (a.gate_on, z3.BoolVal(gate is not None)),
        (a.gate_abs, z3.IntVal(0 if gate is None else gate.balance_abs_threshold)),
        (a.rel_num, z3.IntVal(1 if gate is None else gate.balance_rel_threshold.numerator)),
        (a.rel_den, z3.IntVal(1 if gate is None else gate.balance_rel_threshold.denominator)),
        (a.det, z3.BoolVal(p.det)),
    ]


def _input_pairs(a: AcquireVars, p: Point) -> list[tuple[Any, Any]]:
    return [
        *[(x, _int(v)) for x, v in zip(a.loads, p.loads, strict=True)],
        (a.pin, _int(p.pin)), (a.hit, _BOOL[p.sticky == "hit"]),
        (a.det_index, _int(p.det_index)), (a.tie, _int(p.tie)),
    ]


def _flag(b: Any, weight: int) -> Any:
    return z3.If(b, weight, 0)


class _Encodings:
    """The Z3 terms per server count, packed into one integer each and specialised per
    configuration (substituted and simplified once), so a point costs three
    ``substitute`` + ``simplify`` calls. Packing: choice + 8 pin + 64 kept + 128 broken
    + 256 domain (functional); choice + 8 domain (relational); bit ``i`` = the legacy
    constraint accepts server ``i``."""

    def __init__(self) -> None:
        self._terms: dict[int, tuple[AcquireVars, AcquireVars, Any, Any, Any]] = {}
        self._specialised: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}

    def _build(self, n: int) -> tuple[AcquireVars, AcquireVars, Any, Any, Any]:
        if n not in self._terms:
            f, r = AcquireVars(n), AcquireVars(n, relational=True)
            fd, rd = decide(f), decide(r)
            functional = fd.choice + 8 * fd.pin_after + _flag(fd.kept, 64) + \
                _flag(fd.broken, 128) + _flag(f.domain(), 256)
            relational = rd.choice + _flag(r.domain(), 8)
            constraint, choice = legacy_decide(f)
            legacy = z3.Sum([_flag(z3.substitute(constraint, (choice, z3.IntVal(i))), 1 << i)
                             for i in range(n)])
            self._terms[n] = (f, r, functional, relational, legacy)
        return self._terms[n]

    def evaluate(self, p: Point, least: int) -> tuple[int, int, int]:
        f, r, functional, relational, legacy = self._build(len(p.loads))
        gate = None if p.gate is None else (p.gate.balance_abs_threshold,
                                            p.gate.balance_rel_threshold.numerator,
                                            p.gate.balance_rel_threshold.denominator)
        key = (len(p.loads), p.margin, gate, p.det)
        if key not in self._specialised:
            self._specialised[key] = (
                z3.simplify(z3.substitute(functional, *_config_pairs(f, p))),
                z3.simplify(z3.substitute(relational, *_config_pairs(r, p))),
                z3.simplify(z3.substitute(legacy, *_config_pairs(f, p))))
        fs, rs, ls = self._specialised[key]
        rel_inputs = [*_input_pairs(r, p), (r.low, _int(min(p.loads))),
                      (r.high, _int(max(p.loads))), (r.own, _int(p.loads[p.pin])),
                      (r.least, _int(least))]
        return (_as_int(_eval(fs, _input_pairs(f, p))), _as_int(_eval(rs, rel_inputs)),
                _as_int(_eval(ls, _input_pairs(f, p))))


def _eval(term: Any, pairs: list[tuple[Any, Any]]) -> Any:
    return z3.simplify(z3.substitute(term, *pairs))


def _as_int(term: Any) -> int:
    if not z3.is_int_value(term):
        raise ValueError(f"encoding did not reduce to an integer: {term}")
    return int(term.as_long())


def check_point(p: Point, enc: _Encodings | None = None) -> str | None:
    """None if every encoding agrees with the core at ``p``, else the disagreement."""
    enc = enc or _Encodings()
    choice, kept, broken, pin_after, least = _core(p)
    functional, relational, legacy = enc.evaluate(p, least)
    if not functional & 256:
        return f"{p}: functional domain rejects a state the core accepts"
    got = (functional & 7, bool(functional & 64), bool(functional & 128), (functional >> 3) & 7)
    if got != (choice, kept, broken, pin_after):
        return f"{p}: core (choice, kept, broken, pin) = {(choice, kept, broken, pin_after)}" \
               f", functional encoding {got}"
    if not relational & 8:
        return f"{p}: relational domain rejects the core's minimum/maximum/placement"
    if relational & 7 != choice:
        return f"{p}: relational encoding chose {relational & 7}, core {choice}"
    if p.margin is None and p.gate is None:
        expected = _legacy_choice(p)
        if legacy != 1 << expected:
            accepted = [i for i in range(len(p.loads)) if legacy >> i & 1]
            return f"{p}: legacy encoding accepts {accepted}, legacy model chose {expected}"
    return None


def _legacy_choice(p: Point) -> int:
    servers = [f"s{i}" for i in range(len(p.loads))]
    lru: tuple[tuple[str, str], ...] = ()
    if p.sticky != "miss":
        lru = (("r", "gone" if p.sticky == "removed" else servers[p.pin]),)
    model = LegacyModel(tuple(zip(servers, p.loads, strict=True)), lru, 4, p.det)
    result = legacy_acquire(model, "r", ties="draw", tie_draw=p.tie, request_hash=p.det_index)
    assert result.server_id is not None
    return servers.index(result.server_id)


@attrs.frozen
class ConformanceResult:
    points: int
    seconds: float
    failures: tuple[str, ...]


def run(sample: int, max_failures: int = 3) -> ConformanceResult:
    start = time.perf_counter()
    enc = _Encodings()
    failures: list[str] = []
    count = 0
    for p in points(sample):
        count += 1
        message = check_point(p, enc)
        if message is not None:
            failures.append(message)
            if len(failures) >= max_failures:
                break
    return ConformanceResult(count, time.perf_counter() - start, tuple(failures))
