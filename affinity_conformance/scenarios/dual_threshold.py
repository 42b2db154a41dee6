"""Suite ``dual_threshold``: PR #6533's global gate as an alternative policy (SPEC 7.3).

A hit on an active pin is kept iff the pin is on a minimum or the pool is not imbalanced
(``abs > 0 and max - min > abs and max * v > min * u`` with ``rel = u/v`` exact).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from affinity_conformance.scenario import Scenario
from affinity_engine import DualThreshold

SUITE = "dual_threshold"


def _s(case: str, description: str, reqs: str, gate: DualThreshold,
       **options: Any) -> Scenario:
    return Scenario(SUITE, case, description, requirements=reqs.split(),
                    dual_threshold=gate, **options)


def cases() -> Iterator[Scenario]:
    yield (_s("imbalanced_pool_repins",
              "abs 2, rel 3/2: loads 5/0/0 are imbalanced and the pin is not on the "
              "minimum, so the hit re-pins to s1.",
              "R-GATE-1 R-BREAK-1 R-POL-1", DualThreshold(2))
           .acquire("a", expect="s0").fill(s0=5, s1=0, s2=0)
           .acquire("a", expect="s1", path="broken").check())
    yield (_s("abs_zero_disables_gate",
              "abs 0 keeps every pin (gate off).",
              "R-GATE-1 R-CFG-5", DualThreshold(0))
           .acquire("a", expect="s0").fill(s0=5, s1=0, s2=0)
           .acquire("a", expect="s0", path="kept"))
    yield (_s("negative_abs_disables_gate",
              "A negative abs is accepted and disables the gate.",
              "R-GATE-1 R-CFG-5", DualThreshold(-3))
           .acquire("a", expect="s0").fill(s0=4, s1=0, s2=0)
           .acquire("a", expect="s0", path="kept"))
    yield (_s("pin_on_minimum_stays_in_imbalanced_pool",
              "A pin on a least-loaded server is kept even when the pool is imbalanced.",
              "R-GATE-1", DualThreshold(2))
           .acquire("a", expect="s0").fill(s0=1, s1=6, s2=1)
           .acquire("a", expect="s0", path="kept"))
    yield (_s("relatively_balanced_pool_keeps",
              "{10, 8} with abs 1, rel 3/2: 10 > 8 * 3/2 is false, so the pool counts as "
              "balanced and the pin above the minimum is kept.",
              "R-GATE-1 R-GATE-2", DualThreshold(1), servers=("s0", "s1"))
           .acquire("a", expect="s0").fill(s0=10, s1=8)
           .acquire("a", expect="s0", path="kept"))
    yield (_s("exact_rational_boundary",
              "rel 3/2 compared exactly: 9 vs 6 is balanced (18 > 18 is false); 10 vs 6 is "
              "imbalanced and the pin moves.",
              "R-GATE-1 R-CFG-5", DualThreshold(2, "3/2"), servers=("s0", "s1"))
           .acquire("a", expect="s0").fill(s0=9, s1=6)
           .acquire("a", expect="s0", path="kept").acquire("a", expect="s1", path="broken"))
    yield (_s("decimal_rel_is_exact",
              "rel '1.1' means 11/10: 22 vs 20 is balanced (220 > 220 is false); 23 vs 20 is "
              "imbalanced.",
              "R-GATE-1 R-CFG-5", DualThreshold(1, "1.1"), servers=("s0", "s1"))
           .acquire("a", expect="s0").fill(s0=22, s1=20)
           .acquire("a", expect="s0", path="kept").acquire("a", expect="s1", path="broken"))
    yield (_s("balanced_pool_has_no_per_decision_bound",
              "abs 4, rel 3/2, loads 20/30: balanced, so a pin 10 above the minimum is kept "
              "(no constant bound, unlike the margin).",
              "R-GATE-2 R-GATE-1", DualThreshold(4), servers=("s0", "s1"))
           .acquire("x", expect="s0").acquire("a", expect="s1").fill(s0=20, s1=30)
           .acquire("a", expect="s1", path="kept"))
    yield (_s("rel_one_bounds_by_abs",
              "rel 1: the bound is abs: a pin 3 above the minimum is kept at abs 3, a pin "
              "4 above moves.",
              "R-GATE-2 R-GATE-1", DualThreshold(3, 1), servers=("s0", "s1"))
           .acquire("a", expect="s0").fill(s0=3, s1=0)
           .acquire("a", expect="s0", path="kept").acquire("a", expect="s1", path="broken"))
    yield (_s("gate_does_not_affect_placement",
              "New ids are placed least-loaded as always; only hits are gated.",
              "R-PLACE-1 R-GATE-1", DualThreshold(1))
           .acquires("a", "b", "c", "d").release("s1")
           .acquire("e", expect="s1").acquire("f", expect="s1"))
