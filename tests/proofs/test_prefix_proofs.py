"""Prefix-aware placement's proofs (SPEC section 8.1) and group pins' (section 7.6): each
all-N lemma is proved and its encoded mutants refuted, and the encoding sweep agrees with
the reference while refuting a drifted reference and a drifted encoding."""

from __future__ import annotations

import pytest
from affinity_proofs import conformance_prefix, jobs_param
from affinity_proofs.scopes import scope_named
from affinity_proofs.z3_group_lemmas import GROUP_LEMMAS
from affinity_proofs.z3_param_kit import ParamLemma, run
from affinity_proofs.z3_prefix_lemmas import PREFIX_LEMMAS, PREFIX_MUTANTS

PREFIX_REQUIREMENTS = {f"R-PFX-{i}" for i in range(1, 7)}


@pytest.mark.parametrize("lemma", (*GROUP_LEMMAS, *PREFIX_LEMMAS), ids=lambda x: x.name)
def test_lemma_proved_and_each_mutant_refuted(lemma: ParamLemma) -> None:
    assert run(lemma, timeout_s=30).verdict == "proved"
    assert lemma.mutants, f"{lemma.name} ships no negative control"
    for variant in lemma.mutants:
        assert run(lemma, variant, timeout_s=30).verdict == "counterexample", variant.name


def test_every_encoded_prefix_mutant_is_some_lemmas_control() -> None:
    used = {v.name for lemma in PREFIX_LEMMAS for v in lemma.mutants}
    assert used == set(PREFIX_MUTANTS)


def test_prefix_lemmas_trace_the_placement_requirements() -> None:
    traced = {r for lemma in PREFIX_LEMMAS for r in lemma.requirements}
    assert traced >= PREFIX_REQUIREMENTS


def test_sweep_points_cover_the_shapes_that_matter() -> None:
    pts = conformance_prefix.points(150)
    assert {p.sticky for p in pts} == {"miss", "hit", "removed"}
    assert any(p.det for p in pts) and any(p.placement is None for p in pts)
    # equal best estimates on unequal loads: where R-PFX-3's load tie-break decides
    assert any(len({(c, load) for c, load in zip(p.cached, p.loads, strict=True)
                    if c == max(p.cached)}) > 1 for p in pts)


def test_sweep_agrees_with_the_reference() -> None:
    result = conformance_prefix.run(150)
    assert result.failure is None and result.points == 150


@pytest.mark.parametrize("mutant", conformance_prefix.SWEEP_MUTANTS, ids=lambda m: m.name)
def test_sweep_refutes_each_control(mutant: conformance_prefix.SweepMutant) -> None:
    result = conformance_prefix.run_with(mutant, 150)
    assert result.failure is not None and "the reference permits" in result.failure


def test_a_control_leaves_the_reference_as_it_was() -> None:
    with conformance_prefix.SWEEP_MUTANTS[0].applied():
        pass
    assert conformance_prefix.run(40).failure is None


def test_sweep_job_row_passes_with_every_control_refuted() -> None:
    [row] = jobs_param.prefix_sweep_job(scope_named("small"))
    assert row.passed and row.mutants and all(v.refuted for v in row.mutants)
    assert {"R-PFX-2", "R-PFX-3"} <= set(row.requirements)
