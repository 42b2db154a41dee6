"""The points of the wide encoding-conformance sweep (:mod:`.conformance_wide`).

Theory of operation
-------------------
Hypothesis draws them with ``derandomize=True`` and no example database, so every run
and every machine with the same Hypothesis version sees the same points. Each point's
bulk comes from a :class:`random.Random` seeded by Hypothesis' draws: pool sizes across
the load table's leaf boundaries (up to 130 servers), loads up to 10^6 around a common
base, caller hashes of any sign and size, every tie mode, unkeyed requests, margins and
gates at their edges, and the context band (T up to 10^6, caps at and far above the
margin, contexts on both sides of multiples of T and up to 10^12).
"""

from __future__ import annotations

import contextlib
import importlib
import random
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import attrs

from affinity_engine import DualThreshold

__all__ = ["RELATIVE", "SIZES", "WidePoint", "points"]

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
    # The context band (R-BAND-1): T and cap (both None without it) and the acquire's
    # context_tokens (also drawn without the band, where it must be ignored: R-BAND-3).
    tokens: int | None = None
    cap: int | None = None
    context: int | None = None


def _strategy(band: bool = False) -> Any:
    """The points; with ``band`` only context-band points (margin, T, cap and a context
    always set, the pin mostly at the band's edge)."""
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
        if band and keyed and rng.random() < 0.6:
            sticky = "hit"  # the band decides hits only
        pin = rng.randrange(n)
        policy = 1 if band else rng.randrange(3)
        margin = (rng.randint(0, 4) if rng.random() < 0.7 else rng.randint(0, 10**6)) \
            if policy == 1 else None
        gate = DualThreshold(rng.randint(0, 6), rng.choice(RELATIVE)) if policy == 2 else None
        if margin is not None and sticky == "hit" and rng.random() < 0.5:
            loads[pin] = min(loads) + margin + rng.randint(0, 1)  # the band's edge
        if gate is not None and sticky == "hit" and n >= 3 and rng.random() < 0.6:
            loads = _gate_edge(loads, pin, gate, rng.randint(-1, 1))
        if rng.random() < 0.4:  # negative, with every residue mod n
            request_hash = -abs(request_hash) - 1 - rng.randrange(n)
        tie_draw = rng.randrange(2**40)
        # Drawn after every field above, so the points without the band are unchanged.
        tokens, cap, context = _band(rng, margin, band)
        if tokens is not None and cap is not None and margin is not None \
                and sticky == "hit" and rng.random() < 0.9:  # the band's edge, +0 or +1
            width = min(margin + (context or 0) // tokens, cap)
            loads[pin] = min(loads) + width + rng.randint(0, 1)
        return WidePoint(tuple(loads), sticky, pin, margin, gate, det, request_hash,
                         tie_break, keyed, tie_draw, tokens, cap, context)

    return point()


def _band(rng: random.Random, margin: int | None, force: bool = False
          ) -> tuple[int | None, int | None, int | None]:
    """(T, cap, context): the band on half of the margin points (all, with ``force``),
    with T from 1 to 10^6, a cap at, near or far above the margin, and contexts on every
    side of multiples of T (0, T - 1, T, kT +- 1, 10^12, none); a context on a third of
    the other points."""
    if margin is None or (not force and rng.random() < 0.5):
        return None, None, (rng.choice((1, 7, 10**5, 10**12)) if rng.random() < 0.33
                            else None)
    tokens = rng.choice((1, 2, 3, 7, 1000, 4096, rng.randint(1, 10**6)))
    cap = max(margin + rng.choice((0, 1, 2, 3, rng.randint(0, 10**6))), 1)
    k = rng.randint(0, cap - margin + 2)
    context = rng.choice((None, 0, tokens - 1, tokens, k * tokens, k * tokens - 1,
                          k * tokens + 1, 10**12, rng.randint(0, 10**7)))
    return tokens, cap, None if context is None else max(context, 0)


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


def points(count: int, band: bool = False) -> list[WidePoint]:
    """``count`` points, the same ones in every run (Hypothesis, derandomized); with
    ``band``, context-band points only."""
    from hypothesis import HealthCheck, Phase, given, settings

    out: dict[WidePoint, None] = {}  # distinct points in drawing order

    @settings(derandomize=True, database=None, max_examples=3 * count, deadline=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(_strategy(band))
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
