"""Narrow, typed wrappers around the real core, with PEP 316 contracts for CrossHair.

Theory of operation
-------------------
CrossHair explores functions symbolically; it does best on small, fixed-size, typed
inputs (formal-methods.md section 7, gotcha 7). Each wrapper here takes a
``tuple[int, int, int]`` of loads and a few ints, builds a *real* ``State`` through the
core's own ``LoadTable`` / ``StickyLru`` and calls the *real* policy or ``step``. The
``post:`` lines state the obligations (proofs/README.md) on that three-server slice:

* :func:`keep_pin_3` -- obligation 6 (R-KEEP-1): kept iff ``load[pin] <= min + m``;
* :func:`decide_3` -- obligations 3, 7, 12 (R-SKEW-1, R-BREAK-1, R-KEEP-3);
* :func:`decide_margin_zero_3` -- obligation 4 (R-SKEW-5);
* :func:`keep_at_two_margins_3` -- obligation 5 (R-KEEP-4);
* :func:`decide_deterministic_3` -- obligation 2 (R-DET-4).

Each ``*_mutant`` wrapper runs the same body with a mutant of :mod:`.mutants` applied;
CrossHair must find a counterexample to it. :func:`legacy_decide_3` (the independent
legacy model) and :func:`core_decide_null_3` (the core with margin None) are the
``diffbehavior`` pair of obligation 1; :func:`core_decide_null_3_mutant` must differ.

A pin of ``-1`` means "no sticky entry". Inputs outside the preconditions are folded
back into range in the diffbehavior pair (``diffbehavior`` ignores ``pre:``).

Wrappers never call each other: CrossHair replaces a call to a function that has
contracts by those contracts ("short-circuiting"), so a mutant wrapper calling a
contracted wrapper would be judged by the contract, not by the mutated core. They share
the uncontracted helpers ``_decide`` / ``_keep`` / ``_deterministic`` instead.
"""

from __future__ import annotations

from affinity_conformance.legacy import LegacyModel, legacy_acquire
from affinity_engine import Acquire, Acquired, Config, LoadTable, State, StickyLru, step

from . import mutants

__all__ = [
    "core_decide_null_3",
    "core_decide_null_3_mutant",
    "decide_3",
    "decide_3_idle_mutant",
    "decide_3_mutant",
    "decide_deterministic_3",
    "decide_deterministic_3_mutant",
    "decide_margin_zero_3",
    "decide_margin_zero_3_mutant",
    "keep_at_two_margins_3",
    "keep_at_two_margins_3_mutant",
    "keep_pin_3",
    "keep_pin_3_mutant",
    "legacy_decide_3",
]

SERVERS = ("s0", "s1", "s2")


def _pool(loads: tuple[int, int, int]) -> LoadTable:
    return LoadTable.build(zip(SERVERS, loads, strict=True))


def _state(loads: tuple[int, int, int], pin: int) -> State:
    lru = StickyLru(4)
    if pin >= 0:
        lru = lru.put("r", SERVERS[pin])
    return State(_pool(loads), lru, 0, 0, SERVERS)


def _acquire(config: Config, loads: tuple[int, int, int], pin: int, tie_draw: int,
             request_hash: int | None = None) -> tuple[int, str]:
    t = step(config, _state(loads, pin),
             Acquire(request_id="r", tie_draw=tie_draw, request_hash=request_hash))
    assert isinstance(t.outcome, Acquired)
    return SERVERS.index(t.outcome.server_id), t.outcome.path.value


def _keep(loads: tuple[int, int, int], pin: int, margin: int) -> bool:
    from affinity_engine import policy  # read at call time: a mutant may have patched it

    return policy.keep_pin(Config(affinity_break_margin=margin), _pool(loads), SERVERS[pin])


def _decide(loads: tuple[int, int, int], pin: int, margin: int, tie_draw: int) -> int:
    return _acquire(Config(affinity_break_margin=margin, tie_break="draw"), loads, pin,
                    tie_draw)[0]


def _kept_at(loads: tuple[int, int, int], pin: int, m1: int, m2: int) -> tuple[bool, bool]:
    return (_acquire(Config(affinity_break_margin=m1), loads, pin, 0)[1] == "kept",
            _acquire(Config(affinity_break_margin=m2), loads, pin, 0)[1] == "kept")


def _deterministic(loads: tuple[int, int, int], pin: int, margin: int,
                   request_hash: int) -> tuple[int, int]:
    """The decision under these loads and margin, and under idle loads and no margin."""
    with_margin = Config(affinity_break_margin=margin, full_determinism=True)
    return (_acquire(with_margin, loads, pin, 0, request_hash)[0],
            _acquire(Config(full_determinism=True), (0, 0, 0), pin, 0, request_hash)[0])


def keep_pin_3(loads: tuple[int, int, int], pin: int, margin: int) -> bool:
    """
    pre: all(x >= 0 for x in loads)
    pre: 0 <= pin < 3
    pre: margin >= 0
    post: __return__ == (loads[pin] <= min(loads) + margin)
    """
    return _keep(loads, pin, margin)


def keep_pin_3_mutant(loads: tuple[int, int, int], pin: int, margin: int) -> bool:
    """
    pre: all(x >= 0 for x in loads)
    pre: 0 <= pin < 3
    pre: margin >= 0
    post: __return__ == (loads[pin] <= min(loads) + margin)
    """
    with mutants.by_name("keep_strict_lt").applied():
        return _keep(loads, pin, margin)


def decide_3(loads: tuple[int, int, int], pin: int, margin: int, tie_draw: int) -> int:
    """
    pre: all(x >= 0 for x in loads)
    pre: -1 <= pin < 3
    pre: margin >= 0 and tie_draw >= 0
    post: loads[__return__] <= min(loads) + margin
    post: __return__ == pin or loads[__return__] == min(loads)
    post: min(loads) > 0 or loads[__return__] <= margin
    """
    return _decide(loads, pin, margin, tie_draw)


def decide_3_mutant(loads: tuple[int, int, int], pin: int, margin: int, tie_draw: int) -> int:
    """
    pre: all(x >= 0 for x in loads)
    pre: -1 <= pin < 3
    pre: margin >= 0 and tie_draw >= 0
    post: loads[__return__] <= min(loads) + margin
    """
    with mutants.by_name("keep_band_plus_one").applied():
        return _decide(loads, pin, margin, tie_draw)


def decide_3_idle_mutant(loads: tuple[int, int, int], pin: int, margin: int,
                         tie_draw: int) -> int:
    """
    pre: all(x >= 0 for x in loads)
    pre: -1 <= pin < 3
    pre: margin >= 0 and tie_draw >= 0
    post: min(loads) > 0 or loads[__return__] <= margin
    """
    with mutants.by_name("min_ignores_idle").applied():
        return _decide(loads, pin, margin, tie_draw)


def decide_margin_zero_3(loads: tuple[int, int, int], pin: int, tie_draw: int) -> int:
    """
    pre: all(x >= 0 for x in loads)
    pre: -1 <= pin < 3 and tie_draw >= 0
    post: loads[__return__] == min(loads)
    """
    return _decide(loads, pin, 0, tie_draw)


def decide_margin_zero_3_mutant(loads: tuple[int, int, int], pin: int, tie_draw: int) -> int:
    """
    pre: all(x >= 0 for x in loads)
    pre: -1 <= pin < 3 and tie_draw >= 0
    post: loads[__return__] == min(loads)
    """
    with mutants.by_name("margin_zero_means_off").applied():
        return _decide(loads, pin, 0, tie_draw)


def keep_at_two_margins_3(loads: tuple[int, int, int], pin: int, m1: int,
                          m2: int) -> tuple[bool, bool]:
    """
    pre: all(x >= 0 for x in loads)
    pre: 0 <= pin < 3
    pre: 0 <= m1 <= m2
    post: __return__[1] or not __return__[0]
    """
    return _kept_at(loads, pin, m1, m2)


def keep_at_two_margins_3_mutant(loads: tuple[int, int, int], pin: int, m1: int,
                                 m2: int) -> tuple[bool, bool]:
    """
    pre: all(x >= 0 for x in loads)
    pre: 0 <= pin < 3
    pre: 0 <= m1 <= m2
    post: __return__[1] or not __return__[0]
    """
    with mutants.by_name("keep_comparison_flipped").applied():
        return _kept_at(loads, pin, m1, m2)


def decide_deterministic_3(loads: tuple[int, int, int], pin: int, margin: int,
                           request_hash: int) -> tuple[int, int]:
    """
    pre: all(x >= 0 for x in loads)
    pre: -1 <= pin < 3 and margin >= 0
    post: __return__[0] == __return__[1]
    """
    return _deterministic(loads, pin, margin, request_hash)


def decide_deterministic_3_mutant(loads: tuple[int, int, int], pin: int, margin: int,
                                  request_hash: int) -> tuple[int, int]:
    """
    pre: all(x >= 0 for x in loads)
    pre: -1 <= pin < 3 and margin >= 0
    post: __return__[0] == __return__[1]
    """
    with mutants.by_name("margin_under_determinism").applied():
        return _deterministic(loads, pin, margin, request_hash)


def _fold(loads: tuple[int, int, int], pin: int, tie_draw: int
          ) -> tuple[tuple[int, int, int], int, int]:
    """Inputs folded into range: diffbehavior does not honour ``pre:``."""
    folded = (abs(loads[0]), abs(loads[1]), abs(loads[2]))
    return folded, (pin % 4) - 1, abs(tie_draw)


def _core_null(loads: tuple[int, int, int], pin: int, tie_draw: int) -> int:
    loads, pin, tie_draw = _fold(loads, pin, tie_draw)
    return _acquire(Config(tie_break="draw"), loads, pin, tie_draw)[0]


def legacy_decide_3(loads: tuple[int, int, int], pin: int, tie_draw: int) -> int:
    """The independent legacy model (upstream-verl.md section 3), random ties drawn."""
    loads, pin, tie_draw = _fold(loads, pin, tie_draw)
    lru = (("r", SERVERS[pin]),) if pin >= 0 else ()
    model = LegacyModel(tuple(zip(SERVERS, loads, strict=True)), lru, 4)
    result = legacy_acquire(model, "r", ties="draw", tie_draw=tie_draw)
    assert result.server_id is not None
    return SERVERS.index(result.server_id)


def core_decide_null_3(loads: tuple[int, int, int], pin: int, tie_draw: int) -> int:
    """The core with ``affinity_break_margin=None`` and draw ties."""
    return _core_null(loads, pin, tie_draw)


def core_decide_null_3_mutant(loads: tuple[int, int, int], pin: int, tie_draw: int) -> int:
    with mutants.by_name("margin_null_as_zero").applied():
        return _core_null(loads, pin, tie_draw)
