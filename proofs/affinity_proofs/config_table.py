"""Obligation 19: the configuration values the core refuses are exactly SPEC's.

Theory of operation
-------------------
Configuration validation (R-CFG-1..6, R-POL-1) is a total function from option values
to "accepted as X" or "refused". :data:`CASES` is an exhaustive table over the *edge
values* of every option -- each side of every boundary (0 and -1, 1 and 0, 1 and a
value just below it), both infinities and NaN, ``-0.0``, integral and non-integral
floats, booleans where integers are expected, integers where booleans are expected,
strings, ``None``, containers, huge integers -- and, for each case, what SPEC's text says
(the ``expect`` column is written from spec/SPEC.md section 2, not from the code).

:func:`check_table` builds every case with the real constructors and demands: an accepted
value is stored converted exactly as the spec says (``2.0`` becomes the int ``2``,
``1.1`` the rational ``11/10``); a refused one raises
:class:`~affinity_engine.ConfigError` whose message names the option and the offending
value. The configuration event (R-CFG-2) is checked the same way: which server lists
``initial_state`` accepts, and that the state it builds is the spec's (pool in the given
order, all counts 0, empty sticky map, counters 0, the sorted mirror, one fresh epoch per
server in order). The reference's configuration event (``affinity_core.initial_state``,
its own code) must refuse the same lists and build, for the others, the state the engine's
abstracts to. ``Config`` is one class shared by both packages, so its table is one.

:func:`check_examples` replays SPEC's worked examples for the deterministic index
(R-DET-2: ``request_hash = -1`` over three servers; R-DET-3: ``"a"`` over
``[s2, s0, s1]``; the R-HASH-1 test values), on initial states whose pool order is not
sorted.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import attrs

import affinity_core
from affinity_engine import (
    Acquire,
    Acquired,
    Config,
    ConfigError,
    DualThreshold,
    GroupStickiness,
    HashMode,
    TieBreak,
    initial_state,
    stable_hash,
    step,
)
from affinity_engine.abstraction import to_reference

__all__ = ["CASES", "OPTIONS", "Case", "check_examples", "check_table"]

_REFUSED = object()


@attrs.frozen
class Case:
    option: str  # the option the message must name
    value: Any
    expect: Any  # the stored value, or _REFUSED
    build: Callable[[Any], Any]
    read: Callable[[Any], Any]


def _margin(v: Any) -> Config:
    return Config(affinity_break_margin=v)


def _cache(v: Any) -> Config:
    return Config(max_cache_size=v)


def _abs(v: Any) -> DualThreshold:
    return DualThreshold(v)


def _rel(v: Any) -> DualThreshold:
    return DualThreshold(1, v)


def _det(v: Any) -> Config:
    return Config(full_determinism=v)


def _lease(v: Any) -> Config:
    return Config(lease_accounting=v)


def _ties(v: Any) -> Config:
    return Config(tie_break=v)


def _hash(v: Any) -> Config:
    return Config(hash_mode=v)


def _gate(v: Any) -> Config:
    margin, gate = v
    return Config(affinity_break_margin=margin, dual_threshold=gate)


def _tokens(v: Any) -> Config:
    return Config(affinity_break_margin=0, affinity_break_tokens=v, affinity_break_band_cap=5)


def _band_cap(v: Any) -> Config:
    return Config(affinity_break_margin=1, affinity_break_tokens=3, affinity_break_band_cap=v)


def _band(v: Any) -> Config:
    margin, tokens, cap = v
    return Config(affinity_break_margin=margin, affinity_break_tokens=tokens,
                  affinity_break_band_cap=cap)


def _group_mode(v: Any) -> Config:
    return Config(group_stickiness=v)


def _group_cache(v: Any) -> Config:
    return Config(group_stickiness="fallback", max_group_cache_size=v)


def _group_margin(v: Any) -> Config:
    return Config(group_stickiness="fallback", group_break_margin=v)


def _group_margin_off(v: Any) -> Config:
    return Config(group_break_margin=v)


def _placement(v: Any) -> Config:
    return Config(placement_margin=v)


def _band_read(c: Config) -> tuple[Any, ...]:
    return (c.affinity_break_margin, c.affinity_break_tokens, c.affinity_break_band_cap)


def _cases() -> list[Case]:
    out: list[Case] = []

    def add(option: str, build: Callable[[Any], Any], read: Callable[[Any], Any],
            accepted: list[tuple[Any, Any]], refused: list[Any]) -> None:
        out.extend(Case(option, v, want, build, read) for v, want in accepted)
        out.extend(Case(option, v, _REFUSED, build, read) for v in refused)

    # R-CFG-3: null or an integer >= 0; finite integral floats (also -0.0) become ints.
    add("affinity_break_margin", _margin, lambda c: c.affinity_break_margin,
        [(None, None), (0, 0), (1, 1), (7, 7), (2**70, 2**70), (0.0, 0), (-0.0, 0),
         (2.0, 2), (1e300, int(1e300))],
        [-1, -(2**70), -2.0, 0.5, 2.5, -0.5, math.nan, math.inf, -math.inf, True, False,
         "1", "0", b"1", [], [1], Fraction(1), Fraction(1, 2), 1j])
    # R-CFG-4: an integer >= 1.
    add("max_cache_size", _cache, lambda c: c.max_cache_size,
        [(1, 1), (2, 2), (10**9, 10**9), (2**70, 2**70)],
        [0, -1, -(2**70), True, False, 1.0, 2.0, "1", None, Fraction(1), [1]])
    # R-CFG-5: balance_abs_threshold any integer (<= 0 disables the gate).
    add("balance_abs_threshold", _abs, lambda g: g.balance_abs_threshold,
        [(0, 0), (-3, -3), (1, 1), (5, 5), (2**70, 2**70), (-(2**70), -(2**70))],
        [True, False, 1.0, 0.0, "1", None, Fraction(1), [1]])
    # R-CFG-5: balance_rel_threshold an exact rational >= 1 (int, Fraction, "p/q",
    # decimal string, finite float read as its shortest decimal text).
    add("balance_rel_threshold", _rel, lambda g: g.balance_rel_threshold,
        [(1, Fraction(1)), (2, Fraction(2)), (2**70, Fraction(2**70)),
         (Fraction(3, 2), Fraction(3, 2)), (Fraction(1), Fraction(1)),
         ("3/2", Fraction(3, 2)), ("1.5", Fraction(3, 2)), ("1", Fraction(1)),
         ("11/10", Fraction(11, 10)), (1.1, Fraction(11, 10)), (1.0, Fraction(1)),
         (1.5, Fraction(3, 2)), (1e20, Fraction(10**20))],
        [0, -1, Fraction(1, 2), Fraction(99, 100), "0.9", "1/2", "abc", "1/0", "", 0.5,
         0.999, -1.5, math.nan, math.inf, -math.inf, True, False, None, [], [1]])
    # R-CFG-4 for the group map (R-GRP-1): an integer >= 1.
    add("max_group_cache_size", _group_cache, lambda c: c.max_group_cache_size,
        [(1, 1), (2, 2), (10**9, 10**9), (2**70, 2**70)],
        [0, -1, -(2**70), True, False, 1.0, 2.0, "1", None, Fraction(1), [1]])
    # R-GRP-1 and R-PFX-1: null or an integer >= 0, with R-CFG-3's conversions and refusals.
    for option, build in (("group_break_margin", _group_margin),
                          ("placement_margin", _placement)):
        add(option, build, operator.attrgetter(option),
            [(None, None), (0, 0), (1, 1), (2**70, 2**70), (0.0, 0), (-0.0, 0), (2.0, 2)],
            [-1, -(2**70), -2.0, 0.5, math.nan, math.inf, True, False, "1", [], Fraction(1)])
    # R-GRP-1: a group margin is refused while group stickiness is "off".
    add("group_break_margin", _group_margin_off, lambda c: c.group_break_margin,
        [(None, None)], [0, 1, 2**70])
    add("group_stickiness", _group_mode, lambda c: c.group_stickiness,
        [("off", GroupStickiness.OFF), ("fallback", GroupStickiness.FALLBACK),
         ("only", GroupStickiness.ONLY), (GroupStickiness.ONLY, GroupStickiness.ONLY)],
        ["Off", "on", "", None, 0, True, ["only"]])
    # R-CFG-1: only booleans for the two switches.
    for option, build, read in (("full_determinism", _det, lambda c: c.full_determinism),
                                ("lease_accounting", _lease,
                                 lambda c: c.lease_accounting)):
        add(option, build, read, [(True, True), (False, False)],
            [0, 1, "true", "false", None, 1.0, []])
    # R-CFG-1: one of the listed strings.
    add("tie_break", _ties, lambda c: c.tie_break,
        [("first", TieBreak.FIRST), ("draw", TieBreak.DRAW), ("hashed", TieBreak.HASHED),
         (TieBreak.DRAW, TieBreak.DRAW)],
        ["FIRST", "random", "", None, 0, ["first"]])
    add("hash_mode", _hash, lambda c: c.hash_mode,
        [("caller", HashMode.CALLER), ("stable", HashMode.STABLE),
         (HashMode.STABLE, HashMode.STABLE)],
        ["Stable", "crc32", "", None, 1])
    # R-POL-1: margin and gate are alternatives.
    gate = DualThreshold(1)
    add("dual_threshold", _gate, lambda c: (c.affinity_break_margin, c.dual_threshold),
        [((None, gate), (None, gate)), ((0, None), (0, None)), ((None, None), (None, None))],
        [(0, gate), (5, gate), (None, (1, 1.5)), (None, 1)])
    # R-CFG-6: null or an integer >= 1, with R-CFG-3's conversions and refusals (here with
    # margin 0 / cap 5 and margin 1 / T 3 around the option under test) ...
    for option, build in (("affinity_break_tokens", _tokens),
                          ("affinity_break_band_cap", _band_cap)):
        add(option, build, operator.attrgetter(option),
            [(1, 1), (2, 2), (4096, 4096), (2**70, 2**70), (1.0, 1), (7.0, 7),
             (1e300, int(1e300))],
            [0, -1, -(2**70), 0.0, -0.0, -2.0, 0.5, 1.5, math.nan, math.inf, -math.inf,
             True, False, "1", b"1", [], [1], Fraction(1), Fraction(3, 2), 1j, None])
    # ... set together or not at all, only with the margin, and cap >= margin.
    add("affinity_break_band_cap", _band, _band_read,
        [((None, None, None), (None, None, None)), ((0, 1, 1), (0, 1, 1)),
         ((3, 2, 3), (3, 2, 3)), ((2, 10**6, 2**70), (2, 10**6, 2**70))],
        [(None, 2, 3), (1, 2, None), (1, None, 3), (3, 2, 2), (1, 1, 0), (5, 1, 4)])
    return out


CASES: tuple[Case, ...] = tuple(_cases())
OPTIONS = len({case.option for case in CASES})  # the options the table covers


def _same(got: Any, want: Any) -> bool:
    # 2 == 2.0 == True in Python: the stored value must also have the spec's type.
    return bool(got == want) and type(got) is type(want)


def _names(case: Case) -> tuple[str, ...]:
    """How a refusal's message may name the offending value."""
    if case.option == "dual_threshold":
        return (repr(case.value[1]),)
    if isinstance(case.value, tuple) and len(case.value) == 3:  # a band combination
        return (f"{case.value[2]!r}",)
    if isinstance(case.value, float) and math.isfinite(case.value) and \
            case.value.is_integer():
        return (repr(case.value), repr(int(case.value)))  # after the integral conversion
    return (repr(case.value),)


def check_table() -> tuple[int, list[str]]:
    """(cases checked, problems) over :data:`CASES` and the configuration event."""
    problems: list[str] = []
    for case in CASES:
        try:
            built = case.build(case.value)
        except ConfigError as exc:
            if case.expect is not _REFUSED:
                problems.append(f"{case.option}={case.value!r} refused ({exc}); SPEC "
                                f"accepts it as {case.expect!r}")
            elif case.option not in str(exc) or not any(n in str(exc) for n in _names(case)):
                problems.append(f"{case.option}={case.value!r}: the message {str(exc)!r} "
                                "does not name the option and the value (R-CFG-1)")
            continue
        except Exception as exc:  # a refusal must be a ConfigError, never a crash
            problems.append(f"{case.option}={case.value!r} raised {type(exc).__name__}: "
                            f"{exc} instead of a ConfigError")
            continue
        if case.expect is _REFUSED:
            problems.append(f"{case.option}={case.value!r} accepted; SPEC refuses it")
        elif not _same(case.read(built), case.expect):
            problems.append(f"{case.option}={case.value!r} stored as "
                            f"{case.read(built)!r}, SPEC says {case.expect!r}")
    problems += _check_initial_states()
    return len(CASES) + len(_SERVER_LISTS), problems


# R-CFG-2: servers may be empty; a sequence (not a bare string) of distinct non-empty ids.
_SERVER_LISTS: tuple[tuple[Any, bool], ...] = (
    ([], True), (["s0"], True), (["s2", "s0", "s1"], True), (("b", "a"), True),
    (["é", "a b"], True), ("ab", False), (["a", "a"], False), (["a", "b", "a"], False),
    ([""], False), (["\ud800"], False), ([1], False), (["a", None], False),
)


def _built(build: Callable[[Config, Any], Any], config: Config, servers: Any
           ) -> tuple[Any, str | None]:
    """(state, None) when ``build`` accepts ``servers``, else (None, how it refused):
    ``"refused"`` for a ConfigError, the exception's type name for anything else."""
    try:
        return build(config, servers), None
    except ConfigError:
        return None, "refused"
    except Exception as exc:  # a refusal must be a ConfigError, never a crash
        return None, type(exc).__name__


def _check_initial_states() -> list[str]:
    """R-CFG-2 on both packages: the engine's configuration event against SPEC's text,
    and the reference's against the engine's (the same refusals, and an accepted state
    equal to the engine's under the abstraction function)."""
    problems: list[str] = []
    for lease in (False, True):
        config = Config(lease_accounting=lease, max_cache_size=3)
        for servers, ok in _SERVER_LISTS:
            state, refusal = _built(initial_state, config, servers)
            reference, reference_refusal = _built(affinity_core.initial_state, config,
                                                  servers)
            if reference_refusal != refusal:
                problems.append(f"affinity_core.initial_state({servers!r}): "
                                f"{reference_refusal or 'accepted'}, the engine: "
                                f"{refusal or 'accepted'}")
            elif state is not None and to_reference(state) != reference:
                problems.append(f"affinity_core.initial_state({servers!r}) = {reference}, "
                                f"the engine's abstracts to {to_reference(state)}")
            if refusal is not None:
                if ok or refusal != "refused":
                    problems.append(f"initial_state({servers!r}) raised {refusal}; SPEC "
                                    + ("accepts it" if ok else "wants a ConfigError"))
                continue
            if not ok:
                problems.append(f"initial_state({servers!r}) accepted; SPEC refuses it")
                continue
            ids = list(servers)
            epochs = [state.leases.epoch.get(s, -1) for s in ids]
            plain = (list(state.pool.items()), state.lru.items(), len(state.lru),
                     state.lru.capacity, state.affinity_kept, state.affinity_broken,
                     dict(state.external), state.sorted_servers, state.pool.total)
            want: tuple[Any, ...] = ([(s, 0) for s in ids], (), 0, 3, 0, 0, {},
                                     tuple(sorted(ids)), 0)
            if plain != want:
                problems.append(f"initial_state({servers!r}) = {plain}, SPEC says {want}")
            if lease and (-1 in epochs or epochs != sorted(set(epochs))):
                problems.append(f"initial_state({servers!r}) epochs {epochs}: SPEC wants "
                                "one fresh epoch per server, in order")
            if not lease and state.leases.epoch:
                problems.append(f"initial_state({servers!r}) opened epochs without leases")
    return problems


def check_examples() -> list[str]:
    """SPEC's worked examples of R-DET-2, R-DET-3 and R-HASH-1."""
    problems: list[str] = []
    values = {"a": 3904355907, "conv-1": 3736203980, "é": 235179326, "123456789": 3421780262}
    for text, value in values.items():
        if stable_hash(text) != value:
            problems.append(f"stable_hash({text!r}) = {stable_hash(text)}, R-HASH-1 says "
                            f"{value}")
    examples = (
        (Config(full_determinism=True), ["s0", "s1", "s2"],
         Acquire(request_id="r", request_hash=-1), "s2", "R-DET-2"),
        (Config(full_determinism=True, hash_mode="stable"), ["s2", "s0", "s1"],
         Acquire(request_id="a"), "s0", "R-DET-3"),
        (Config(full_determinism=True, hash_mode="stable"), ["s1", "s2", "s0"],
         Acquire(request_id="a", request_hash=7), "s0", "R-DET-3 (hash ignored)"),
        (Config(full_determinism=True), ["s1", "s2", "s0"],
         Acquire(request_id="r", request_hash=-(2**70) - 2), "s1", "R-DET-2 (huge)"),
    )
    for config, servers, event, want, rule in examples:
        o = step(config, initial_state(config, servers), event).outcome
        if not (isinstance(o, Acquired) and o.server_id == want):
            problems.append(f"{rule}: pool {servers}, {event!r}: got {o!r}, SPEC says {want}")
    return problems
