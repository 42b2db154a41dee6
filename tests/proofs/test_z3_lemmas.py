"""The bounded Z3 facts have witnesses and their controls have none (R-SKEW-4, R-GATE-2);
the BMC finds no skew trace for the margin and one for the off-by-one rule (R-SKEW-1)."""

from __future__ import annotations

import pytest
from affinity_proofs.z3_bmc import shortest_trace
from affinity_proofs.z3_lemmas import LEMMAS, Lemma, run_lemma
from affinity_proofs.z3_mutants import by_name


@pytest.mark.parametrize("lemma", LEMMAS, ids=lambda x: x.name)
def test_lemma_holds(lemma: Lemma) -> None:
    for n in range(lemma.min_n, 5):
        result = run_lemma(lemma, n)
        assert result.holds, (n, result.verdict, result.model)


@pytest.mark.parametrize("lemma", LEMMAS, ids=lambda x: x.name)
def test_the_control_of_a_fact_has_no_witness(lemma: Lemma) -> None:
    for n in range(lemma.min_n, 5):
        result = run_lemma(lemma, n, control=True)
        assert result.verdict == "proved", (n, result.verdict, result.model)


def test_only_facts_are_bounded() -> None:
    """Every guarantee is an all-N lemma; what stays bounded is existential."""
    assert [x.name for x in LEMMAS] == ["legacy_violates_skew", "gate_no_constant_bound"]
    assert all(x.expect_sat and x.control for x in LEMMAS)


def test_per_decision_skew_has_no_bmc_trace_but_the_off_by_one_rule_does() -> None:
    """R-SKEW-1 with adversarial releases, bounded: none for the margin, one for m + 1."""
    assert not shortest_trace(3, 2, 6, margin=1, bad="decision_skew", bound=1).found
    broken = shortest_trace(3, 2, 6, margin=1, bad="decision_skew", bound=1,
                            parts=by_name("keep_band_plus_one").parts)
    assert broken.found and broken.steps[-1].op == "acquire"


def test_global_skew_is_unbounded_even_with_margin_zero() -> None:
    """R-SKEW-4: releases are the environment's, so max - min exceeds any bound."""
    found = shortest_trace(2, 1, 10, margin=0, bad="global_skew", bound=2)
    assert found.found and max(found.final_loads) - min(found.final_loads) > 2
