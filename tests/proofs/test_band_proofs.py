"""The context band's obligations in ``affinity verify``: the all-N lemmas of
R-BAND-1..5 each proved with its mutants refuted, the band's BFS runs and checks, the
decision and configuration tables (R-CFG-6), and the plain width the checks compare with."""

from __future__ import annotations

import itertools

import pytest
from affinity_proofs import config_table, decision_table, jobs_param
from affinity_proofs.bfs_band_checks import BAND_CHECKS, plain_band
from affinity_proofs.bfs_envs import contexts
from affinity_proofs.bfs_tasks import run_mutant, run_spec
from affinity_proofs.mutants import MUTANTS, by_name
from affinity_proofs.report import OBLIGATIONS
from affinity_proofs.scopes import scope_named
from affinity_proofs.verify import plan
from affinity_proofs.z3_all_n import param_lemma
from affinity_proofs.z3_band_lemmas import BAND_LEMMAS, BAND_OBLIGATION
from affinity_proofs.z3_param_kit import ParamLemma, run

from affinity_engine import Config, ConfigError
from affinity_engine.policy import keep_band

SMALL = scope_named("small").bfs_runs
BAND_RUNS = [r for r in SMALL if r.config.affinity_break_tokens is not None]

# What the issue asks to be proved for every N, and the slips it asks to be refuted.
REQUIRED = {"band_default_equivalence": "R-BAND-3", "band_skew": "R-BAND-2",
            "band_monotone_in_context": "R-BAND-4", "band_monotone_in_tokens": "R-BAND-4",
            "band_selectivity": "R-BAND-4", "band_ignored_under_determinism": "R-BAND-5",
            "band_no_starvation": "R-BAND-1", "band_break_correct": "R-BAND-1",
            "band_exact": "R-BAND-1"}
REQUIRED_MUTANTS = {"band_no_cap", "band_ceil_division", "band_times_tokens",
                    "band_under_determinism", "band_forgets_margin", "context_without_tokens"}


def test_the_band_is_obligation_20_citing_r_band_1_to_5() -> None:
    (ob,) = [o for o in OBLIGATIONS if o.number == BAND_OBLIGATION]
    assert set(ob.requirements) == {f"R-BAND-{i}" for i in range(1, 6)}
    assert "R-CFG-6" in next(o for o in OBLIGATIONS if o.number == 19).requirements


def test_required_band_lemmas_exist_with_their_ids_and_mutants() -> None:
    names = {lemma.name: lemma for lemma in BAND_LEMMAS}
    for name, rid in REQUIRED.items():
        assert rid in names[name].requirements and names[name].mutants, name
    encoded = {v.name for lemma in BAND_LEMMAS for v in lemma.mutants}
    assert encoded >= REQUIRED_MUTANTS
    assert {m.name for m in MUTANTS} >= REQUIRED_MUTANTS  # and as patches of the core


@pytest.mark.parametrize("lemma", BAND_LEMMAS, ids=lambda x: x.name)
def test_band_lemma_proved_for_all_n_and_mutants_refuted(lemma: ParamLemma) -> None:
    assert run(lemma, timeout_s=30).verdict == "proved"  # not "vacuous": hypotheses SAT
    for variant in lemma.mutants:
        r = run(lemma, variant, timeout_s=30)
        assert r.verdict == "counterexample", (variant.name, r.verdict)
        assert r.model is not None and r.model["n"] >= 1


def test_ceiling_counterexample_is_a_real_one() -> None:
    """The model Z3 gives for the ceiling mutant is a concrete disagreement of c // T."""
    lemma = param_lemma("band_exact")
    ceil = next(v for v in lemma.mutants if v.name == "band_ceil_division")
    model = run(lemma, ceil).model
    assert model is not None
    c, t, m, cap = model["ctx"], model["tokens"], model["margin"], model["cap"]
    assert c % t != 0 and min(m + c // t, cap) < min(m + -(-c // t), cap)


def test_band_job_rows_are_all_n_with_the_band_scope() -> None:
    [row] = jobs_param.z3_param_job("band_monotone_in_tokens")
    assert row.obligation == 20 and row.all_n and row.passed
    assert row.scope == jobs_param.BAND_SCOPE and "T >= 1" in row.scope
    assert all(m.refuted for m in row.mutants)


def test_verify_plans_every_band_job() -> None:
    names = {job.name for job in plan(scope_named("default"))}
    assert {f"Z3 all-N {lemma.name}" for lemma in BAND_LEMMAS} <= names
    assert {f"BFS {r.label}" for r in BAND_RUNS} <= names
    assert {f"BFS mutant {m} #20" for m in ("band_no_cap", "band_under_determinism")} <= names


def test_plain_band_is_the_cores_width() -> None:
    """R-BAND-1's width computed two ways, over margins, T, caps and contexts."""
    for m, t, cap in itertools.product(range(3), (1, 2, 3, 7), range(1, 5)):
        if cap < m:
            continue
        config = Config(affinity_break_margin=m, affinity_break_tokens=t,
                        affinity_break_band_cap=cap)
        for c in (None, 0, 1, t - 1, t, t + 1, 3 * t, 10**12):
            assert plain_band(config, c) == keep_band(config, c) == min(m + (c or 0) // t, cap)


def test_bfs_sends_contexts_only_with_the_band() -> None:
    assert contexts(Config(affinity_break_margin=1)) == (None,)
    band = Config(affinity_break_margin=0, affinity_break_tokens=2, affinity_break_band_cap=1)
    assert contexts(band) == (None, 0, 1, 2, 4, 10**9)
    assert {c.name for c in BAND_CHECKS} == {"context_ignored_without_band", "band_rule",
                                             "band_monotone"}


@pytest.mark.parametrize("run_", BAND_RUNS, ids=lambda r: r.label)
def test_band_runs_pass_on_the_real_core(run_: object) -> None:
    result = run_spec(run_)  # type: ignore[arg-type]
    assert result.states > 50 and not result.violations and not result.truncated


@pytest.mark.parametrize("mutant", sorted(REQUIRED_MUTANTS | {"band_mod_not_div"}))
def test_band_bfs_refutes_the_core_mutants(mutant: str) -> None:
    """Each core mutant of the band, by the BFS search of its obligation (20, or 1 for the
    context read with T null), with a counterexample trace."""
    (obligation,) = by_name(mutant).obligations
    found = run_mutant(mutant, obligation, SMALL)
    assert found.violation is not None and found.violation.trace, mutant
    assert found.violation.check in {c.name for c in BAND_CHECKS}


def test_decision_table_band_configs_pass_and_see_their_control() -> None:
    checked, failures = decision_table.check_table(2, configs=decision_table.BAND_CONFIGS)
    assert checked > 1_000 and failures == []
    with by_name("band_no_cap").applied():
        _, found = decision_table.check_table(2, configs=decision_table.BAND_CONFIGS)
    assert found and "SPEC says" in found[0] and "T=1 cap=1" in found[0]


def test_configuration_table_has_r_cfg_6_and_its_control() -> None:
    options = {case.option for case in config_table.CASES}
    assert {"affinity_break_tokens", "affinity_break_band_cap"} <= options
    assert config_table.check_table()[1] == []
    with by_name("band_tokens_zero_accepted").applied():
        _, found = config_table.check_table()
    assert any("affinity_break_tokens=0 accepted" in p for p in found)


def test_r_cfg_6_edges_restated() -> None:
    """A few rows restated from R-CFG-6 itself, so a table edit cannot drift."""
    assert Config(affinity_break_margin=2, affinity_break_tokens=1.0,
                  affinity_break_band_cap=2).affinity_break_tokens == 1
    for bad in ({"affinity_break_tokens": 0, "affinity_break_band_cap": 2},
                {"affinity_break_tokens": 4, "affinity_break_band_cap": 1},
                {"affinity_break_tokens": 4}, {"affinity_break_band_cap": 3}):
        with pytest.raises(ConfigError):
            Config(affinity_break_margin=2, **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Config(affinity_break_tokens=4, affinity_break_band_cap=3)
