"""The checks of affinity verify beyond the small world: all-N Z3 lemmas, data-structure
checks at every boundary, the wide encoding-conformance sweep -- each must hold for the
spec and refute its mutants."""

from __future__ import annotations

import pytest
from affinity_proofs import conformance_wide, jobs_param, structures
from affinity_proofs.mutants_beyond import BEYOND_SMALL_MUTANTS, beyond_by_name
from affinity_proofs.report import Row, to_json
from affinity_proofs.scopes import scope_named
from affinity_proofs.z3_param_kit import run
from affinity_proofs.z3_param_lemmas import PARAM_LEMMAS
from affinity_proofs.z3_structures import MERGE_LEMMAS, MergeLemma, run_merge

REQUIRED_ALL_N = {  # the obligations that must hold for every N
    "default_null_equivalence", "determinism_ignores_load_margin_gate", "per_decision_skew",
    "arrivals_spread_inductive", "margin_zero_least_loaded", "keep_monotone_in_margin",
    "selectivity", "break_correct", "no_starvation", "gate_bound",
}


def test_required_lemmas_are_all_n_with_mutants() -> None:
    names = {lemma.name for lemma in PARAM_LEMMAS}
    assert names >= REQUIRED_ALL_N
    assert all(lemma.mutants for lemma in PARAM_LEMMAS)


@pytest.mark.parametrize("lemma", PARAM_LEMMAS, ids=lambda x: x.name)
def test_all_n_lemma_proved_and_mutants_refuted(lemma: object) -> None:
    from affinity_proofs.z3_param_kit import ParamLemma

    assert isinstance(lemma, ParamLemma)
    assert run(lemma, timeout_s=30).verdict == "proved"
    for variant in lemma.mutants:
        r = run(lemma, variant, timeout_s=30)
        assert r.verdict == "counterexample", (variant.name, r.verdict)
        assert r.model is not None and r.model["n"] >= 1


def test_negative_hash_counterexample_is_concrete() -> None:
    lemma = next(x for x in PARAM_LEMMAS if x.name.startswith("determinism"))
    abs_mod = next(v for v in lemma.mutants if v.name == "hash_abs_mod")
    r = run(lemma, abs_mod)
    assert r.model is not None
    n, h = r.model["n"], r.model["hash"]
    # the counterexample is real: abs(h) % n and abs(h + n) % n differ for this h, n
    assert abs(h) % n != abs(r.model["other_hash"]) % n
    assert h % n == r.model["other_hash"] % n


@pytest.mark.parametrize("structure", ["load_table", "sticky_lru"])
def test_structures_match_plain_definitions(structure: str) -> None:
    r = structures.run(structure, 40)
    assert r.failure is None, r.failure
    assert r.operations >= 40 * 6


@pytest.mark.parametrize("structure,mutant", [
    (s, m) for s, names in jobs_param.STRUCTURE_MUTANTS.items() for m in names])
def test_structure_mutants_refuted(structure: str, mutant: str) -> None:
    with beyond_by_name(mutant).applied():
        r = structures.run(structure, 60)
    assert r.failure is not None, mutant


def test_structure_sizes_cross_every_boundary() -> None:
    assert {1, 31, 32, 33, 1024, 1025} <= set(structures.LOAD_SIZES)
    assert {1, 2} <= set(structures.LRU_CAPACITIES) and max(structures.LRU_CAPACITIES) > 1024


@pytest.fixture(scope="module")
def wide_points() -> list[conformance_wide.WidePoint]:
    return conformance_wide.points(scope_named("small").wide_conformance_points)


@pytest.fixture(scope="module")
def band_points() -> list[conformance_wide.WidePoint]:
    """The context band's points, as conformance_wide_job draws them (R-BAND-1, R-BAND-3)."""
    return conformance_wide.points(scope_named("small").wide_conformance_points // 2, band=True)


def test_wide_points_reproducible_and_wide(
        wide_points: list[conformance_wide.WidePoint]) -> None:
    again = conformance_wide.points(len(wide_points))
    assert again == wide_points
    assert max(len(p.loads) for p in wide_points) >= 65
    assert max(max(p.loads) for p in wide_points) >= 10**6
    assert any(p.det and p.request_hash < 0 for p in wide_points)
    assert any(p.gate is not None and min(p.loads) >= 4 for p in wide_points)
    assert any(not p.keyed and p.tie_break == "hashed" for p in wide_points)


def test_wide_conformance_spec_agrees(wide_points: list[conformance_wide.WidePoint],
                                      band_points: list[conformance_wide.WidePoint]) -> None:
    r = conformance_wide.run(0, sample=wide_points + band_points)
    assert r.failures == ()
    assert r.band_points >= len(band_points) and r.band_hits_at_edge >= 10


@pytest.mark.parametrize("mutant", jobs_param.WIDE_MUTANTS)
def test_wide_mutants_refuted(mutant: str, wide_points: list[conformance_wide.WidePoint],
                              band_points: list[conformance_wide.WidePoint]) -> None:
    with beyond_by_name(mutant).applied():
        r = conformance_wide.run(0, max_failures=1, sample=band_points + wide_points)
    assert r.failures, mutant


def test_every_beyond_small_mutant_has_a_job() -> None:
    attached = {*jobs_param.WIDE_MUTANTS,
                *(m for names in jobs_param.STRUCTURE_MUTANTS.values() for m in names)}
    assert {m.name for m in BEYOND_SMALL_MUTANTS} <= attached


def test_rows_carry_their_scope_kind() -> None:
    rows = [Row(3, "Z3 lemma, all N", jobs_param.ALL_N_SCOPE, True, 0.1, all_n=True),
            Row(3, "BFS", "3 servers", True, 0.1)]
    doc = to_json("small", rows, 0.2, [], {})
    scopes = [(r["scope_kind"], r["scope"]) for r in doc["rows"]]
    assert scopes[0][0] == "all N" and scopes[0][1].startswith("all N: N >= 1")
    assert scopes[1] == ("bounded", "bounded: 3 servers")


def test_z3_param_job_row_is_all_n_only_when_proved() -> None:
    [row] = jobs_param.z3_param_job("per_decision_skew")
    assert row.all_n and row.passed and row.mutants and all(m.refuted for m in row.mutants)


def test_contradictory_hypotheses_are_vacuous_not_proved() -> None:
    import z3
    from affinity_proofs.z3_param_kit import ParamLemma

    n = z3.Int("n")
    lemma = ParamLemma("contradiction", 0, (), "n >= 1 and n < 1 prove anything",
                       lambda v: (z3.And(n >= 1, n < 1), n == 5), ())
    assert run(lemma).verdict == "vacuous"


@pytest.mark.parametrize("lemma", MERGE_LEMMAS, ids=lambda x: x.name)
def test_load_table_merge_proved_and_mutants_refuted(lemma: MergeLemma) -> None:
    assert run_merge(lemma)[0] == "proved"
    for mutant in lemma.mutants:
        assert run_merge(lemma, mutant)[0] == "counterexample", mutant


def test_merge_job_row_is_all_sizes() -> None:
    [row] = jobs_param.merge_job()
    assert row.passed and row.all_n and len(row.mutants) >= 6
    assert all(m.refuted for m in row.mutants)


def test_wide_points_do_not_depend_on_what_was_imported_first() -> None:
    import subprocess
    import sys

    script = ("{pre}\nimport hashlib\nfrom affinity_proofs import conformance_wide as cw\n"
              "print(hashlib.sha256(repr(cw.points(40)).encode()).hexdigest())")
    outputs = {subprocess.run(
        [sys.executable, "-c", script.format(pre=pre)], capture_output=True, text=True,
        check=True, env={"PYTHONHASHSEED": "0", "PATH": ""}).stdout
        for pre in ("", "import affinity_proofs.verify, affinity_proofs.scopes")}
    assert len(outputs) == 1, outputs


def test_verify_plans_every_beyond_small_job() -> None:
    from affinity_proofs.verify import plan

    for scope in ("small", "default", "deep"):
        names = {job.name for job in plan(scope_named(scope))}
        assert {f"Z3 all-N {lemma.name}" for lemma in PARAM_LEMMAS} <= names
        assert {"structure load_table", "structure sticky_lru", "Z3 load table merge",
                "encoding conformance (wide)"} <= names
