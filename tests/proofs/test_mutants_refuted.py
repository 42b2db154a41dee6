"""Applying a mutant of the core makes the relevant obligation's check fail, and leaving
the context restores the core (R-KEEP-1, R-BREAK-1, R-CNT-1, R-LRU-5, R-POOL-4, R-LEASE-5
and the other ids of the mutants' obligations)."""

from __future__ import annotations

import pytest
from affinity_proofs.bfs_tasks import run_mutant, run_spec
from affinity_proofs.mutants import MUTANTS, by_name
from affinity_proofs.scopes import scope_named
from affinity_proofs.verify import BFS_OBLIGATIONS

from affinity_engine import Acquire, Acquired, Config, Path, initial_state, step

SMALL = scope_named("small")
BFS_PAIRS = [(m.name, ob) for m in MUTANTS for ob in m.obligations if ob in BFS_OBLIGATIONS]


@pytest.mark.parametrize(("mutant", "obligation"), BFS_PAIRS)
def test_bfs_refutes_the_mutant_with_its_obligations_checks(mutant: str,
                                                           obligation: int) -> None:
    found = run_mutant(mutant, obligation, SMALL.bfs_runs)
    assert found.violation is not None, f"{mutant} survived obligation {obligation}"
    # The search of obligation k refutes the mutant with k's check, or with a crash of step
    # (R-OUT-1) or a state outside the domain found on the way: both are counterexamples
    # the search of k found, and the row of k reports them.
    assert found.obligation == obligation
    assert found.violation.obligation == obligation or \
        found.violation.check == "step_total" or found.violation.check.startswith("domain_")
    assert found.violation.trace  # a counterexample trace from the initial state


def test_the_correct_core_passes_the_same_runs() -> None:
    run = next(r for r in SMALL.bfs_runs if r.label == "margin 1, first ties")
    assert run_spec(run).violations == ()


def test_strict_keep_rule_fails_selectivity_with_a_two_step_trace() -> None:
    run = next(r for r in SMALL.bfs_runs if r.label == "margin 1, first ties")
    with by_name("keep_strict_lt").applied():
        result = run_spec(run)
    failed = {v.check for v in result.violations}
    assert "selectivity" in failed
    selectivity = next(v for v in result.violations if v.check == "selectivity")
    assert [type(e).__name__ for e in selectivity.trace] == ["Acquire", "Acquire"]


def test_mutants_restore_the_core() -> None:
    config = Config(affinity_break_margin=1)
    state = initial_state(config, ["s0", "s1"])
    state = step(config, state, Acquire(request_id="a")).state
    before = step(config, state, Acquire(request_id="a"))
    for mutant in MUTANTS:
        with mutant.applied():
            pass
    assert step(config, state, Acquire(request_id="a")) == before
    assert isinstance(before.outcome, Acquired)
    assert before.outcome.path is Path.KEPT  # load 1 <= min 0 + 1 (R-KEEP-1)


def test_unknown_mutant_name_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="unknown mutant 'nope'"):
        by_name("nope")
