"""The reference core against the spec's text, the vectors and the engine.

* SPEC §10's acquire table is ``affinity_core.ACQUIRE_RULES``, row for row;
* every shipped vector's outcomes and ``allowed`` sets hold for the reference itself, not
  only for the engine;
* the engine's abstraction function and its inverse round-trip;
* the refinement comparison finds an engine mutant (a control of the comparison itself).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from affinity_proofs.refinement import ENGINE_MUTANTS, refinement_run, wide_traces

import affinity_core
import affinity_engine
from affinity_conformance.shipped import shipped_vectors
from affinity_conformance.vector_format import Case, EventStep, load_case, vector_files
from affinity_core import ACQUIRE_RULES, Acquire, Config, Lookup, outcome_to_json
from affinity_engine.abstraction import from_reference, to_reference

SPEC = Path(__file__).resolve().parents[2] / "spec" / "SPEC.md"


def _spec_table() -> list[list[str]]:
    text = SPEC.read_text(encoding="utf-8")
    block = re.search(r"<!-- acquire-rules -->\n(.*?)<!-- /acquire-rules -->", text, re.S)
    assert block is not None, "SPEC §10 lost its acquire-rules table"
    rows = [line.strip("|").split("|") for line in block.group(1).splitlines()[2:]]
    return [[cell.strip() for cell in row] for row in rows]


def _code_table() -> list[list[str]]:
    def words(**flags: bool) -> str:
        return " ".join(name for name, flag in flags.items() if flag)

    return [[lookup.value, rule.path.value, rule.recency.value, rule.group_recency.value,
             rule.choice.value, words(request=rule.write_pin, group=rule.write_group_pin),
             words(previous=rule.reports_previous, evicted=rule.reports_eviction,
                   evicted_group=rule.reports_group_eviction),
             rule.counter.value] for lookup, rule in ACQUIRE_RULES.items()]


def test_spec_acquire_table_is_the_code_table() -> None:
    assert _spec_table() == _code_table()
    assert set(ACQUIRE_RULES) == set(Lookup)


def test_the_table_comparison_can_fail() -> None:
    changed = _code_table()
    changed[1][5] = ""  # a miss that does not write its pin
    assert _spec_table() != changed


CASES = [load_case(p) for p in vector_files(shipped_vectors())]


@pytest.mark.parametrize("case", [c for c in CASES if c.valid], ids=lambda c: c.name)
def test_every_vector_holds_for_the_reference(case: Case) -> None:
    config = case.config
    assert config is not None and case.initial_state is not None
    state = to_reference(case.initial_state)
    for item in case.steps:
        if not isinstance(item, EventStep) or item.event is None:
            continue
        if item.allowed is not None:
            assert isinstance(item.event, Acquire)
            permitted = affinity_core.allowed(config, state, item.event)
            assert [s for s in state.pool if s in permitted] == list(item.allowed), item.index
        transition = affinity_core.step(config, state, item.event)
        assert outcome_to_json(transition.outcome) == item.expect, (case.path, item.index)
        state = transition.state


def test_vectors_were_found() -> None:
    assert sum(c.valid for c in CASES) > 100


def test_abstraction_round_trips() -> None:
    seen = 0
    for config, servers, events in wide_traces(5, 60)[:40]:
        state = affinity_engine.initial_state(config, servers)
        for event in events:
            state = affinity_engine.step(config, state, event).state
            reference = to_reference(state)
            assert to_reference(from_reference(config, reference)) == reference
            assert affinity_engine.state_digest(state) == affinity_core.state_digest(reference)
            seen += 1
    assert seen > 1000


def test_refinement_holds_and_refutes_an_engine_mutant() -> None:
    assert refinement_run(3, 60, with_vectors=False).failure is None
    mutant = next(m for m in ENGINE_MUTANTS if m.name == "engine_old_version_keeps_evicted")
    with mutant.patch():
        assert refinement_run(3, 120, with_vectors=False).failure is not None


def test_reference_config_is_the_engines() -> None:
    """One definition of the values: the engine re-exports the reference's classes."""
    assert affinity_engine.Config is Config
    assert affinity_engine.Acquire is affinity_core.Acquire
    assert affinity_engine.Acquired is affinity_core.Acquired
