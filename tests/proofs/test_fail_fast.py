"""``affinity verify`` fails fast and says where: a violation stops its
search with the counterexample; counts outside their domain are violations, not states; a
crash of ``step`` is a counterexample to R-OUT-1; a negative control that crashes in its
own code is "control inconclusive" and hides no failure of the core; every job has a
budget, and an overrun is a FAIL row naming the job."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import pytest
from affinity_proofs import jobs, mutants, verify
from affinity_proofs.bfs import (
    Check,
    ControlError,
    explore,
    out_of_domain,
)
from affinity_proofs.bfs_envs import FreeEnv, Universe
from affinity_proofs.bfs_tasks import run_mutant
from affinity_proofs.budget import BudgetPool, Crashed, Overrun, Task
from affinity_proofs.mutants import patched
from affinity_proofs.report import MutantVerdict, Row, obligation_passed
from affinity_proofs.scopes import scope_named

from affinity_engine import Config, Release, initial_state
from affinity_engine.machine import TRANSITIONS
from affinity_engine.values import evolve

U2 = Universe(("s0", "s1"), ("s0", "s1"), ("a", "b"), unkeyed=True)
CONFIG = Config(affinity_break_margin=1, max_cache_size=2)


def _explore(checks: list[Check], **kw: object) -> object:
    return explore(CONFIG, U2.servers, U2.initial_pool, FreeEnv(U2), checks,
                   load_cap=2, **kw)  # type: ignore[arg-type]


def test_the_first_violation_stops_the_search() -> None:
    seen: list[int] = []

    def always(edge: object) -> str:
        seen.append(1)
        return "always false"

    result = _explore([Check("always", 3, lambda c: True, always)])
    assert len(result.violations) == 1 and result.truncated  # type: ignore[attr-defined]
    assert len(seen) == 1 and result.edges == 1  # type: ignore[attr-defined]
    assert result.violations[0].trace and result.violations[0].obligation == 3  # type: ignore


def test_a_negative_count_is_a_violation_not_a_state() -> None:
    with mutants.by_name("release_not_clamped").applied():
        start = time.process_time()
        result = _explore([])
    assert time.process_time() - start < 5
    (v,) = result.violations  # type: ignore[attr-defined]
    assert v.check == "domain_count" and v.obligation == 9
    assert "below 0" in v.message and len(v.trace) == 1


def test_domain_bounds() -> None:
    state = initial_state(CONFIG, ["s0"])
    assert out_of_domain(CONFIG, state, 4) is None
    negative = evolve(state, pool=state.pool.add_load("s0", -1))
    assert out_of_domain(CONFIG, negative, 4)[0] == "count"  # type: ignore[index]
    wrong_total = evolve(state, pool=evolve(state.pool, total=3))
    assert "total" in out_of_domain(CONFIG, wrong_total, 4)[1]  # type: ignore[index]
    full = state.lru
    for rid in "abc":
        full = evolve(full.put(rid, "s0"), capacity=5)
    assert out_of_domain(CONFIG, attrs.evolve(state, lru=full), 4)[0] == "cache"  # type: ignore


def _release_raises(config: object, state: object, event: object) -> object:
    raise KeyError("boom")


def test_a_crash_of_step_is_a_counterexample_to_r_out_1() -> None:
    with patched(TRANSITIONS, Release, _release_raises):
        result = _explore([])
        # Found by a mutant search of obligation 8: the refutation is that job's.
        search = run_mutant("counts_first_placements", 8, scope_named("small").bfs_runs)
    (v,) = result.violations  # type: ignore[attr-defined]
    assert v.check == "step_total" and v.obligation == 11
    assert v.message.startswith("R-OUT-1: step raised KeyError")
    assert search.violation is not None and search.obligation == 8


@contextmanager
def _control_that_crashes() -> Iterator[None]:
    """A control whose own code (in affinity_proofs/mutants.py) raises: as after a core
    refactoring the monkeypatch no longer fits."""
    namespace: dict[str, object] = {}
    code = "def handler(config, state, event):\n    raise AttributeError('no such field')\n"
    exec(compile(code, mutants.__file__, "exec"), namespace)
    with patched(TRANSITIONS, Release, namespace["handler"]):
        yield


def test_a_crashing_control_is_inconclusive_and_hides_no_core_failure() -> None:
    with _control_that_crashes(), pytest.raises(ControlError):
        _explore([])
    job = verify.Job("BFS mutant x #8", jobs.bfs_mutant_job,
                     ("counts_first_placements", 8, (), False), obligation=8,
                     serves=frozenset({8}))
    search = verify._outcome(job, Crashed("Traceback ...\nAttributeError: no such field"))
    assert search["inconclusive"] and not search["refuted"]
    assert "control inconclusive" in search["evidence"]
    unsure = MutantVerdict("x", "x", False, search["evidence"], inconclusive=True)
    refuted = MutantVerdict("y", "y", True, "trace")
    ok_row = Row(8, "BFS", "-", True, 0.0, (unsure, refuted))
    assert ok_row.passed and obligation_passed(8, [ok_row])[0]
    # ... but it cannot hide a failing property, nor stand in for a refuted control.
    assert not Row(8, "BFS", "-", False, 0.0, (unsure, refuted)).passed
    assert not obligation_passed(8, [Row(8, "BFS", "-", True, 0.0, (unsure,))])[0]


def test_a_crashing_job_fails_every_obligation_it_serves() -> None:
    job = verify.Job("BFS margin 1", jobs.bfs_spec_job, (), serves=frozenset({3, 6}))
    rows = verify._outcome(job, Crashed("Traceback\nValueError: bad"))
    assert [r.obligation for r in rows] == [3, 6]
    assert all(not r.passed and "BFS margin 1" in r.method and "ValueError: bad" in r.detail
               for r in rows)


def test_budget_overrun_kills_the_job_and_the_pool_goes_on() -> None:
    tasks = [Task("spin", sum, (range(10**13),), budget=0.5),
             Task("sleep", time.sleep, (600,), budget=0.1),
             Task("quick", sum, ((1, 2, 3),), budget=5.0),
             Task("crash", int, ("not a number",), budget=5.0)]
    start = time.perf_counter()
    # Wall cap = 20 x budget + 2 s: 3 s for the sleeper, 12 s for the spinner (which needs
    # 0.5 s of CPU first, also on a loaded machine).
    pool = BudgetPool({"cpu": 2}, wall_factor=20.0, wall_slack=1.0, poll=0.1)
    results = dict((t.name, v) for t, v in pool.run(tasks))
    assert time.perf_counter() - start < 60
    assert isinstance(results["spin"], Overrun) and results["spin"].limit == "cpu"
    assert isinstance(results["sleep"], Overrun) and results["sleep"].limit == "wall"
    assert results["quick"] == 6
    assert isinstance(results["crash"], Crashed) and "ValueError" in results["crash"].last_line


def test_verify_reports_an_overrun_as_a_fail_row_naming_the_job() -> None:
    scope = attrs.evolve(scope_named("small"), job_budget=0.0)
    rows, extra, _ = verify.run(scope, workers=1, only=frozenset({19}), fail_fast=True)
    (row,) = [r for r in rows if r.obligation == 19]
    assert not row.passed and row.method == "configuration table (overran)"
    assert "budget" in row.detail
    assert extra["stopped_at"] == "configuration table"
