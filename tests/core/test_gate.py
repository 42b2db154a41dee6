"""PR #6533's dual-threshold gate (R-GATE-1, R-GATE-2), on literal two-server pools.

The gate keeps a pin iff the pin is on a minimum or the pool is not imbalanced, where
imbalanced means ``abs > 0 and max - min > abs and max > min * rel`` with ``rel`` an
exact rational. Each scenario pins "conv" to s0 and then sets the loads by events.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from affinity_engine import Config, DualThreshold

from .driver import Run

PAIR = ("s0", "s1")


def pinned(abs_threshold: int, rel: object, **loads: int) -> Run:
    """"conv" pinned to s0 under the gate, then the pool brought to ``loads``."""
    gate = DualThreshold(abs_threshold, rel)
    run = Run(Config(dual_threshold=gate), PAIR).acquire("conv", expect="s0", path="new")
    return run.set_loads(**loads)


def test_pin_on_a_minimum_is_kept_in_an_imbalanced_pool() -> None:
    """R-GATE-1: the pool is imbalanced (10 vs 0) but the pin is on the minimum."""
    run = Run(Config(dual_threshold=DualThreshold(1, Fraction(3, 2))))
    run.acquire("a", expect="s0").acquire("conv", expect="s1").set_loads(s0=10, s1=0, s2=0)
    run.acquire("conv", expect="s1", path="kept")
    assert run.counters == (1, 0)


def test_10_vs_8_with_abs_1_rel_1_5_is_balanced() -> None:
    """R-GATE-1: 10 - 8 > 1 but 10 <= 8 * 1.5, so the pool is balanced: kept."""
    pinned(1, "1.5", s0=10, s1=8).acquire("conv", expect="s0", path="kept")


def test_abs_4_rel_1_5_breaks_when_imbalanced() -> None:
    """R-GATE-1, R-BREAK-1: 10 vs 0 is imbalanced and the pin is not on the minimum."""
    run = pinned(4, "1.5", s0=10, s1=0)
    run.acquire("conv", expect="s1", path="broken", previous="s0")
    assert run.counters == (0, 1)
    assert run.lru == (("conv", "s1"),)


@pytest.mark.parametrize(("s0", "s1", "path"), [
    (4, 0, "kept"),     # max - min == abs: not above it
    (5, 0, "broken"),   # both thresholds exceeded
    (15, 10, "kept"),   # max == min * rel: not above it
    (16, 10, "broken"),
])
def test_both_thresholds_are_strict(s0: int, s1: int, path: str) -> None:
    """R-GATE-1: imbalanced needs max - min > abs AND max > min * rel (both strict)."""
    pinned(4, "1.5", s0=s0, s1=s1).acquire("conv", path=path)


@pytest.mark.parametrize("abs_threshold", [0, -3])
def test_abs_at_most_zero_disables_the_gate(abs_threshold: int) -> None:
    """R-GATE-1: abs <= 0 turns the gate off: a pin at 100 vs 0 is kept."""
    run = pinned(abs_threshold, "1.5", s0=100, s1=0)
    run.acquire("conv", expect="s0", path="kept")


def test_rel_as_string_fraction_or_float_is_the_same_rational() -> None:
    """R-GATE-1, R-CFG-5: "1.5", Fraction(3, 2) and 1.5 give equal configs and equal
    decisions."""
    gates = [DualThreshold(4, "1.5"), DualThreshold(4, Fraction(3, 2)),
             DualThreshold(4, 1.5)]
    assert gates[0] == gates[1] == gates[2]
    assert {g.balance_rel_threshold for g in gates} == {Fraction(3, 2)}
    for rel in ("1.5", Fraction(3, 2), 1.5):
        pinned(4, rel, s0=15, s1=10).acquire("conv", path="kept")
        pinned(4, rel, s0=16, s1=10).acquire("conv", path="broken")


def test_rel_is_compared_exactly_not_in_binary_floating_point() -> None:
    """R-GATE-1, R-CFG-5, R-PURE-1: 115 vs 100 at rel 1.15 is balanced (115 == 100 * 1.15), although
    the float product 100 * 1.15 is 114.99999999999999."""
    assert 100 * 1.15 < 115  # the trap a float implementation falls into
    pinned(1, 1.15, s0=115, s1=100).acquire("conv", path="kept")
    pinned(1, 1.15, s0=116, s1=100).acquire("conv", path="broken")


def test_balanced_pool_gives_no_per_decision_bound() -> None:
    """R-GATE-2: while the pool counts as balanced, a pin far above the minimum is kept
    (the margin rule with the same slack would break it)."""
    gate = pinned(64, "1.5", s0=60, s1=0)
    gate.acquire("conv", expect="s0", path="kept")
    margin = Run.of(PAIR, affinity_break_margin=4).acquire("conv", expect="s0")
    margin.set_loads(s0=60, s1=0).acquire("conv", expect="s1", path="broken")
    assert gate.status()["policy"] == "dual_threshold"
    assert (gate.status()["balance_abs_threshold"], gate.status()["balance_rel_threshold"]) == (
        64, "3/2")
