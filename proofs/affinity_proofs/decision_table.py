"""Obligation 15, second method: every acquire decision over a table of load vectors.

Theory of operation
-------------------
The BFS reaches loads <= 3 at most; the gate's relative test needs a minimum of at least
4 before ``max * v > min * u`` differs from its neighbours (``>=``, swapped ``u``/``v``),
and a load table with more than 32 servers has more than one leaf. This job builds
pre-states directly -- every load vector over 1-3 servers with loads 0..7, a sticky entry
on every server (and none, and one on a removed server), and wide pools of 33, 64 and 65
servers whose minima straddle leaf boundaries -- and steps one acquire on each with the
real ``step``, under every policy of :data:`CONFIGS` (margins 0-3, gates with ``abs`` -1,
0, 1, 2 and ``rel`` 1, 5/4, 3/2, 2, the three tie modes with every tie draw, both
deterministic hash modes with negative and huge hashes, and five context-band
configurations, each acquire with the contexts of :func:`contexts`). Each transition
is compared with :func:`~affinity_proofs.bfs_spec_checks.effects_violation`, the plain
rules of SPEC sections 7-10 -- the same reference the BFS uses on every edge -- and
``allowed`` against R-REL-1.

The pre-states are built with :class:`~affinity_engine.LoadTable` and
:class:`~affinity_engine.StickyLru` from plain lists, so they are exactly the states a
sequence of acquires would leave, without the path to them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from fractions import Fraction

from affinity_engine import (
    Acquire,
    Config,
    DualThreshold,
    Event,
    LoadTable,
    State,
    StickyLru,
    initial_state,
    step,
)
from affinity_engine.values import evolve

from .bfs import Edge
from .bfs_spec_checks import effects_violation

__all__ = ["BAND_CONFIGS", "CONFIGS", "check_table", "contexts"]


def _configs() -> tuple[Config, ...]:
    out = [Config(max_cache_size=2), Config(max_cache_size=2, tie_break="draw"),
           Config(max_cache_size=2, tie_break="hashed")]
    out += [Config(affinity_break_margin=m, max_cache_size=2) for m in range(4)]
    out += [Config(affinity_break_margin=1, max_cache_size=2, tie_break=t)
            for t in ("draw", "hashed")]
    out += [Config(dual_threshold=DualThreshold(a, r), max_cache_size=2)
            for a, r in itertools.product((-1, 0, 1, 2),
                                          (Fraction(1), Fraction(5, 4), Fraction(3, 2), 2))]
    out += [Config(full_determinism=True, max_cache_size=2),
            Config(full_determinism=True, hash_mode="stable", max_cache_size=2),
            Config(full_determinism=True, affinity_break_margin=0, max_cache_size=2)]
    return (*out, *BAND_CONFIGS)


# The context band (R-BAND-1, R-BAND-2, R-BAND-5): T = 1 (every token widens), a cap at
# the margin (the band never widens), a cap above it, and under full_determinism.
BAND_CONFIGS: tuple[Config, ...] = tuple(
    Config(affinity_break_margin=m, affinity_break_tokens=t, affinity_break_band_cap=cap,
           max_cache_size=2, tie_break=ties, full_determinism=det)
    for m, t, cap, ties, det in ((0, 1, 1, "first", False), (1, 2, 3, "first", False),
                                 (2, 5, 2, "first", False), (0, 2, 1, "first", True)))


def contexts(config: Config) -> tuple[int | None, ...]:
    """The acquire's ``context_tokens``: with the band absent, 0, T - 1, T, 2T and 10^9
    (under full_determinism, which ignores it, absent and 10^9); with margin 1 and first
    ties absent and 10^9 (ignored, R-BAND-3); else absent."""
    t = config.affinity_break_tokens
    if t is not None and config.full_determinism:
        return (None, 10**9)
    if t is not None:
        return tuple(dict.fromkeys((None, 0, t - 1, t, 2 * t, 10**9)))
    plain_margin_1 = config.affinity_break_margin == 1 and config.tie_break.value == "first"
    return (None, 10**9) if plain_margin_1 and not config.full_determinism else (None,)


CONFIGS: tuple[Config, ...] = _configs()

_WIDE_PATTERNS: tuple[tuple[int, tuple[int, ...]], ...] = (
    # (servers, positions at the minimum); every other server is at load 2.
    (33, (0, 32)), (33, (31, 32)), (64, (5, 40, 63)), (65, (0, 31, 32, 64)),
    (65, tuple(range(65))), (64, (33,)),
)


def _states(config: Config, narrow_max: int) -> Iterator[State]:
    for n in (1, 2, 3):
        servers = [f"s{i}" for i in range(n)]
        base = initial_state(config, servers)
        for loads in itertools.product(range(narrow_max + 1), repeat=n):
            pool = LoadTable.build(zip(servers, loads, strict=True))
            for pin in (None, "gone", *servers):
                lru = StickyLru(2) if pin is None else StickyLru(2).put("r", pin)
                yield evolve(base, pool=pool, lru=lru)
    for n, minima in _WIDE_PATTERNS:
        servers = [f"w{i:02d}" for i in range(n)]
        base = initial_state(config, servers)
        wide = [0 if i in minima else 2 for i in range(n)]
        pool = LoadTable.build(zip(servers, wide, strict=True))
        for pin in (None, servers[minima[-1]], servers[1 if 1 not in minima else 2]):
            lru = StickyLru(2) if pin is None else StickyLru(2).put("r", pin)
            yield evolve(base, pool=pool, lru=lru)


def _events(config: Config, state: State) -> Iterator[Event]:
    ties = state.pool.tie_count
    draws = range(min(ties, 66)) if config.tie_break.value != "first" else (0,)
    hashes: tuple[int | None, ...] = (None,)
    if config.full_determinism:
        hashes = (None, 0, 1, -1, -7, 2**70 + 1, -(2**70) - 5)
    for rid in ("r", "q", None):
        for draw in draws:
            for h in hashes:
                for context in contexts(config):
                    yield Acquire(request_id=rid, tie_draw=draw, request_hash=h,
                                  context_tokens=context)


def check_table(narrow_max: int = 7, max_failures: int = 1,
                configs: tuple[Config, ...] | None = None) -> tuple[int, list[str]]:
    """(acquires checked, first failures) over every config (of ``configs``, default
    :data:`CONFIGS`), pre-state and acquire."""
    failures: list[str] = []
    checked = 0
    for config in CONFIGS if configs is None else configs:
        for state in _states(config, narrow_max):
            for event in _events(config, state):
                checked += 1
                try:
                    t = step(config, state, event)
                    why = effects_violation(Edge(config, state, event, t, None, "table",
                                                 (), ()), with_allowed=True)
                except Exception as exc:  # a crash of step is an R-OUT-1 counterexample
                    why = f"R-OUT-1: step raised {type(exc).__name__}: {exc}"
                if why is not None:
                    failures.append(f"{_config_text(config)} loads "
                                    f"{list(state.pool.items())[:6]}"
                                    f"{'...' if len(state.pool) > 6 else ''} pin "
                                    f"{state.lru.peek('r')} {event!r}: {why}")
                    if len(failures) >= max_failures:
                        return checked, failures
    return checked, failures


def _config_text(c: Config) -> str:
    gate = c.dual_threshold
    band = "" if c.affinity_break_tokens is None else \
        f" T={c.affinity_break_tokens} cap={c.affinity_break_band_cap}"
    return (f"[margin={c.affinity_break_margin}{band} ties={c.tie_break.value} "
            f"det={c.full_determinism}/{c.hash_mode.value}"
            + (f" gate=({gate.balance_abs_threshold}, {gate.balance_rel_threshold})"
               if gate else "") + "]")
