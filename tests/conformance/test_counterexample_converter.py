"""Proof counterexamples (and kept regression traces) become vectors.

The proof suite writes ``proofs/counterexamples/*.json``; the generator turns each into a
``counterexamples`` case whose expectations come from the core, after checking that every
recorded expectation agrees with the core. Tested on fixtures in the proof suite's shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from affinity_conformance.counterexamples import TraceError, load_traces, trace_to_vector
from affinity_conformance.generate import build_vectors
from affinity_conformance.vector_format import parse_case
from affinity_conformance.vector_runner import run_case

FIXTURE: dict[str, Any] = {
    "format": "affinity-counterexample/1",
    "name": "legacy-decision-above-band",
    "description": "margin null keeps a pin at any load",
    "property": "decision_above_band",
    "parameters": {"band": 1},
    "requirements": ["R-SKEW-4"],
    "config": {"affinity_break_margin": None, "max_cache_size": 10000},
    "servers": ["s0", "s1"],
    "steps": [
        {"event": {"op": "acquire", "request_id": "k0"},
         "expect": {"server_id": "s0", "path": "new"}},
        {"event": {"op": "acquire", "request_id": "k0"},
         "expect": {"server_id": "s0", "path": "kept"}},
        {"event": {"op": "acquire", "request_id": "k0"},
         "expect": {"server_id": "s0", "path": "kept"}},
        {"event": {"op": "release", "server_id": "s1"}, "expect": {"result": "at_zero"}},
    ],
    "generator": "fixture",
}


def test_counterexample_becomes_a_replayable_vector() -> None:
    data = trace_to_vector(FIXTURE, suite="counterexamples", case="legacy_band",
                           source="counterexample")
    assert data["requirements"] == ["R-SKEW-4"]
    assert data["description"] == "decision_above_band"
    assert [s["expect"]["kind"] for s in data["steps"] if "expect" in s] == [
        "acquired", "acquired", "acquired", "released"]
    assert run_case(parse_case({**data, "_info": {}}, "fixture")) is None


def test_disagreement_with_the_core_is_an_error() -> None:
    wrong = json.loads(json.dumps(FIXTURE))
    wrong["steps"][1]["expect"]["server_id"] = "s1"
    with pytest.raises(TraceError, match=r"steps\[1\].*recorded 's1', core 's0'"):
        trace_to_vector(wrong, suite="counterexamples", case="x", source="counterexample")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("servers"), "missing \\['servers'\\]"),
    (lambda d: d.update(config={"max_cache_size": 0}), "config"),
    (lambda d: d["steps"].append({"event": {"op": "fly"}}), "steps\\[4\\].event"),
    (lambda d: d.update(servers="s0"), "servers must be a list"),
])
def test_malformed_traces_are_reported(edit: Any, message: str) -> None:
    data = json.loads(json.dumps(FIXTURE))
    edit(data)
    with pytest.raises(TraceError, match=message):
        trace_to_vector(data, suite="counterexamples", case="x", source="counterexample")


def test_generator_absorbs_a_counterexample_directory(tmp_path: Path) -> None:
    (tmp_path / "legacy-decision-above-band.json").write_text(json.dumps(FIXTURE))
    assert len(load_traces(tmp_path, suite="counterexamples", source="counterexample")) == 1
    vectors = build_vectors(counterexample_dir=tmp_path, regression_dir=tmp_path / "none")
    assert "counterexamples/legacy-decision-above-band.json" in vectors
    assert vectors["counterexamples/legacy-decision-above-band.json"]["source"] == \
        "counterexample"
