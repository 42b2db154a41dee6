"""Every Z3 lemma holds at small N and every encoded mutant paired with it is refuted
(R-LEG-1, R-DET-4, R-SKEW-1..5, R-KEEP-1, R-KEEP-3, R-KEEP-4, R-BREAK-1, R-GATE-1/2)."""

from __future__ import annotations

import pytest
from affinity_proofs.z3_bmc import shortest_trace
from affinity_proofs.z3_lemmas import LEMMAS, Lemma, run_lemma
from affinity_proofs.z3_model import Rules


@pytest.mark.parametrize("lemma", LEMMAS, ids=lambda x: x.name)
def test_lemma_holds(lemma: Lemma) -> None:
    for n in range(max(lemma.min_n, 1), 5):
        result = run_lemma(lemma, n)
        assert result.holds, (n, result.verdict, result.model)


@pytest.mark.parametrize(("lemma", "mutant", "rules"),
                         [(x, name, rules) for x in LEMMAS for name, rules in x.mutants],
                         ids=lambda v: getattr(v, "name", v) if not isinstance(v, Rules)
                         else "")
def test_encoded_mutant_is_refuted(lemma: Lemma, mutant: str, rules: Rules) -> None:
    result = run_lemma(lemma, 3, rules, mutant)
    assert result.verdict == "counterexample" and result.model


def test_every_obligation_with_a_lemma_has_a_mutant_or_is_a_fact() -> None:
    for lemma in LEMMAS:
        assert lemma.mutants or lemma.expect_sat, lemma.name


def test_per_decision_skew_has_no_bmc_trace_but_the_off_by_one_rule_does() -> None:
    """R-SKEW-1 with adversarial releases, bounded: none for the margin, one for m + 1."""
    assert not shortest_trace(3, 2, 6, margin=1, bad="decision_skew", bound=1).found
    broken = shortest_trace(3, 2, 6, margin=1, bad="decision_skew", bound=1,
                            rules=Rules(keep_slack=1))
    assert broken.found and broken.steps[-1].op == "acquire"


def test_global_skew_is_unbounded_even_with_margin_zero() -> None:
    """R-SKEW-4: releases are the environment's, so max - min exceeds any bound."""
    found = shortest_trace(2, 1, 10, margin=0, bad="global_skew", bound=2)
    assert found.found and max(found.final_loads) - min(found.final_loads) > 2
