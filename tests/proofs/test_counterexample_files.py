"""The checked-in Z3 witnesses replay through the real core and show the documented
violation (R-SKEW-4; R-SKEW-1 for the legacy rule, R-SKEW-2 context for global skew)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from affinity_proofs import counterexamples

FILES = sorted(counterexamples.DIRECTORY.glob("*.json"))


def test_every_spec_has_a_checked_in_file() -> None:
    names = {p.stem for p in FILES}
    assert names == {s.name for s in counterexamples.COUNTEREXAMPLES}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_file_replays_and_violates_its_property(path: Path) -> None:
    doc = counterexamples.load(path)
    message = counterexamples.violation(doc)
    assert message is not None, f"{path.name} no longer shows {doc['property']}"
    assert "R-SKEW-4" in doc["requirements"]


def test_legacy_witness_is_a_kept_pin_above_the_band() -> None:
    """Legacy (margin None) keeps the pin however far above min + band it is."""
    doc = counterexamples.load(counterexamples.DIRECTORY / "legacy_decision_above_band_2.json")
    assert doc["config"]["affinity_break_margin"] is None
    trace = counterexamples.replay(doc)
    last = trace[-1]
    assert last.chosen == "s0" and last.loads_before == (3, 0, 0)


def test_the_margin_removes_the_legacy_violation() -> None:
    """Control: the same events with margin = band make the core break the pin, so the
    replay no longer matches the legacy expectations."""
    doc = counterexamples.load(counterexamples.DIRECTORY / "legacy_decision_above_band_1.json")
    tampered = copy.deepcopy(doc)
    tampered["config"]["affinity_break_margin"] = 1
    with pytest.raises(ValueError, match="expected"):
        counterexamples.replay(tampered)


def test_a_trace_without_the_violation_is_reported_as_such() -> None:
    doc = counterexamples.load(counterexamples.DIRECTORY / "margin_1_global_spread_above_3.json")
    shortened = copy.deepcopy(doc)
    shortened["steps"] = shortened["steps"][:-2]  # drop the adversarial releases
    assert counterexamples.violation(shortened) is None


def test_regenerated_witness_equals_the_checked_in_file() -> None:
    """Witnesses are canonical (lexicographically least shortest traces)."""
    spec = counterexamples.COUNTEREXAMPLES[0]
    regenerated = counterexamples.generate(spec)
    assert regenerated == counterexamples.load(counterexamples.DIRECTORY / f"{spec.name}.json")
