"""The named scenarios are hand-checked, so the generator is not circular.

Every scenario states some expectations worked out on paper (``expect=``, ``path=``,
``assert_loads`` ...) and building fails when the core disagrees. These tests show that
mechanism bites, and re-read a few hand-derived facts straight from the committed files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from affinity_conformance.scenario import Scenario, ScenarioError
from affinity_conformance.scenarios import all_scenarios

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"


def vector(rel: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((VECTORS / rel).read_text(encoding="utf-8"))
    return data


def acquires(rel: str) -> list[tuple[str | None, str, str]]:
    """(request_id, server_id, path) of each successful acquire in a vector."""
    return [(s["event"]["request_id"], s["expect"]["server_id"], s["expect"]["path"])
            for s in vector(rel)["steps"]
            if s.get("expect", {}).get("kind") == "acquired"]


def test_a_wrong_hand_expectation_fails_the_build() -> None:
    run = Scenario("margin", "x", "", requirements=["R-KEEP-1"], affinity_break_margin=0)
    run.acquire("a", expect="s0")
    with pytest.raises(ScenarioError, match="chose s1, the author expected s0"):
        run.acquire("a", expect="s0")  # margin 0: the pin 1 above the minimum moves
    with pytest.raises(ScenarioError, match="took path new, the author expected kept"):
        Scenario("legacy", "y", "", requirements=[]).acquire("a", path="kept")
    with pytest.raises(ScenarioError, match="loads are"):
        Scenario("legacy", "z", "", requirements=[]).acquire("a").assert_loads(s0=2)


def test_named_scenarios_state_hand_checked_expectations() -> None:
    """Every named scenario that runs events asserts expectations of its own."""
    scenarios = [s for s in all_scenarios() if isinstance(s, Scenario)]
    assert len(scenarios) >= 100
    assert len({s.case for s in scenarios}) == len(scenarios), "case names must be unique"
    unchecked = [s.case for s in scenarios if s.events and s.hand_checks == 0]
    assert not unchecked, f"scenarios that only record what the core did: {unchecked}"
    total = sum(s.hand_checks for s in scenarios)
    assert total >= 400, total


def test_worked_example_from_the_spec() -> None:
    """SPEC section 6: capacity 2, a, b, a (hit), c evicts b."""
    rel = "eviction/worked_example_capacity_two.json"
    assert acquires(rel)[:4] == [("a", "s0", "new"), ("b", "s1", "new"),
                                 ("a", "s0", "kept"), ("c", "s2", "new")]
    evicting = [s["expect"] for s in vector(rel)["steps"] if s.get("expect", {}).get("evicted")]
    assert [e["evicted"] for e in evicting] == ["b", "a"]
    checks = [s["checks"] for s in vector(rel)["steps"] if "checks" in s]
    assert checks[0]["lru"] == [["a", "s0"], ["c", "s2"]]


def test_margin_boundary_is_inclusive() -> None:
    """PR #7435 (10): margin 3, pin at min+3 kept, at min+4 broken to s1."""
    steps = acquires("margin/boundary_is_inclusive.json")
    assert steps[-2:] == [("a", "s0", "kept"), ("a", "s1", "broken")]
    assert vector("margin/boundary_is_inclusive.json")["config"]["affinity_break_margin"] == 3


def test_stable_hash_examples_from_the_spec() -> None:
    """R-DET-3: P = [s2, s0, s1], rid 'a': 3904355907 mod 3 = 0 -> s0 (sorted pool)."""
    data = vector("determinism/stable_hash_over_sorted_pool.json")
    assert data["initial_state"]["servers"] == [["s2", 0], ["s0", 0], ["s1", 0]]
    assert acquires("determinism/stable_hash_over_sorted_pool.json")[0] == ("a", "s0", "new")
    rotated = acquires("determinism/stable_order_invariance_rotated.json")
    assert rotated == acquires("determinism/stable_order_invariance_sorted.json")


def test_caller_hash_floors_negative_values() -> None:
    """R-DET-2: request_hash -1 over [s0, s1, s2] -> s2."""
    steps = vector("determinism/caller_hash_indexes_pool_order.json")["steps"]
    negative = [s for s in steps if s.get("event", {}).get("request_hash") == -1]
    assert negative[0]["expect"]["server_id"] == "s2"


def test_rejection_keeps_verls_message_and_deletes_stale_entry() -> None:
    """R-ACQ-5/6: verl's exact text; the stale entry is gone even though it was rejected."""
    steps = vector("failover/all_removed_rejects_and_deletes_stale_entry.json")["steps"]
    rejected = [s for s in steps if s.get("valid") is False]
    assert rejected[0]["expect"] == {"kind": "rejected", "reason": "no_servers",
                                     "message": "No available servers in load balancer"}
    assert rejected[0]["allowed"] == []
    after = steps[steps.index(rejected[0]) + 1]["checks"]["lru"]
    assert after == [["b", "s1"]]


def test_features_are_declared_from_config_and_events() -> None:
    assert vector("legacy/first_tie_avalanche.json")["features"] == []
    assert vector("margin/boundary_is_inclusive.json")["features"] == ["margin"]
    assert vector("counters/six_hits_sum_to_six.json")["features"] == ["counters", "margin"]
    assert "unkeyed" in vector("unkeyed/not_counted.json")["features"]
    assert "core_events" in vector("validation/malformed_events_are_refused.json")["features"]
    assert vector("validation/config_margin_negative.json")["features"] == ["margin"]
    assert vector("validation/config_cache_zero.json")["features"] == []
