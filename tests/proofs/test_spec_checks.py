"""Obligations 15-19: SPEC's plain rules on every BFS edge, the decision
table, the configuration table -- each passes on the real core and refutes its control."""

from __future__ import annotations

import pytest
from affinity_proofs import config_table, decision_table
from affinity_proofs.bfs_tasks import run_mutant, run_spec
from affinity_proofs.mutants import by_name
from affinity_proofs.scopes import scope_named

from affinity_engine import Config, ConfigError, DualThreshold

SMALL = scope_named("small").bfs_runs


@pytest.mark.parametrize(("mutant", "obligation", "check"), [
    ("evicted_not_reported", 15, "outcome_and_effect"),  # R-OUT-3
    ("status_total_counts_external", 16, "status_view"),  # R-STAT-1, R-OBS-2
    ("unknown_leases_not_counted", 17, "lease_counters"),  # R-LEASE-6
    ("stable_mode_demands_hash", 18, "deterministic_inputs"),  # R-ACQ-9 (positive)
    ("ties_last_in_order", 15, "outcome_and_effect"),  # R-TIE-2
])
def test_each_new_obligation_refutes_its_control(mutant: str, obligation: int,
                                                  check: str) -> None:
    found = run_mutant(mutant, obligation, SMALL)
    assert found.violation is not None, mutant
    assert found.violation.check == check


def test_the_real_core_passes_the_plain_rules_where_they_bite() -> None:
    for label in ("margin 1, observed loads", "margin 1, leases",
                  "margin 1, full_determinism caller", "margin 0, full_determinism stable"):
        (run,) = [r for r in SMALL if r.label == label]
        result = run_spec(run)
        assert not result.violations and not result.truncated, (label, result.violations)


def test_decision_table_passes_and_sees_the_tie_mutant() -> None:
    checked, failures = decision_table.check_table(2)
    assert checked > 10_000 and failures == []
    with by_name("ties_last_in_order").applied():
        _, found = decision_table.check_table(2)
    assert found and "SPEC says" in found[0]


def test_configuration_table_is_exact_and_sees_its_control() -> None:
    cases, problems = config_table.check_table()
    assert cases >= 140 and problems == []
    assert config_table.check_examples() == []
    with by_name("cache_size_zero_accepted").applied():
        _, found = config_table.check_table()
    assert any("max_cache_size=0 accepted" in p for p in found)


def test_the_table_speaks_spec_not_the_code() -> None:
    """A few rows of the table, restated from R-CFG-3/4/5, so a table edit cannot drift."""
    assert Config(affinity_break_margin=-0.0).affinity_break_margin == 0
    assert type(Config(affinity_break_margin=2.0).affinity_break_margin) is int
    assert DualThreshold(1, 1.1).balance_rel_threshold.denominator == 10
    for bad in ({"affinity_break_margin": True}, {"max_cache_size": 0},
                {"full_determinism": 1}, {"tie_break": "FIRST"}):
        with pytest.raises(ConfigError):
            Config(**bad)
