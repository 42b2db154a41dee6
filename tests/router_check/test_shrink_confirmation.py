"""The shrunk trace's confirmation: how check-router decides a shrunk failure is real.

The real routers are not needed to test the decision itself: ``run_trace`` and the
shrinker are replaced by scripts, so each case states exactly which reruns fail. A router
that passes one rerun of a trace it failed before (seen once in CI with vllm-router) must
not throw the shrink away; a trace that passes every rerun must not be called confirmed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from affinity_conformance.router_check import runner
from affinity_conformance.router_check.claims import parse_claim
from affinity_conformance.router_check.harness import RunResult, StepDivergence
from affinity_conformance.router_check.presets import PRESETS
from affinity_conformance.router_check.target import SettlePlan
from affinity_conformance.router_check.trace import Op, TraceShape, describe, generate

OPS = generate(4, TraceShape(length=12, fail_percent=0, pool_percent=0))
DIVERGES_AT = 6                        # the prefix is OPS[:7]
MINIMAL = [OPS[0], OPS[1], OPS[4], OPS[5], OPS[6]]


def _divergence(index: int, op: Op) -> StepDivergence:
    return StepDivergence(index, describe(op), "the router chose b1", ("R-PLACE-1",),
                          {"b0": 0, "b1": 1, "b2": 1}, (), ())


def _shrink(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
            passing_calls: set[int]) -> tuple[runner.Failure, list[str], int]:
    """``_shrunk`` on OPS, where run number n (1 = the first rerun of the prefix) passes
    when n is in ``passing_calls`` and fails at its last op otherwise."""
    calls = 0

    async def run_trace(target: Any, fleet: Any, http: Any, ops: Sequence[Op], claim: Any,
                        plan: Any) -> RunResult:
        nonlocal calls
        calls += 1
        if calls in passing_calls:
            return RunResult(None)
        return RunResult(_divergence(len(ops) - 1, ops[-1]))

    async def shrink_ops(ops: Sequence[Op], fails: Any, max_runs: int,
                         deadline: float) -> list[Op]:
        return list(MINIMAL)

    monkeypatch.setattr(runner, "run_trace", run_trace)
    monkeypatch.setattr(runner, "shrink_ops", shrink_ops)
    options = runner.CheckOptions(PRESETS["vllm-router:sticky_least_loaded"],
                                  parse_claim("legacy"))
    notes: list[str] = []
    first = RunResult(_divergence(DIVERGES_AT, OPS[DIVERGES_AT]))
    unused: Any = SimpleNamespace()  # the scripted run_trace never reads these
    fleet: Any = SimpleNamespace(size=3)
    failure = asyncio.run(runner._shrunk(options, 4, list(OPS), first, unused, fleet, unused,
                                         SettlePlan(0.0, 1.0, "delay", "scripted"), tmp_path,
                                         1, notes))
    return failure, notes, calls


def test_a_trace_that_fails_on_every_rerun_is_confirmed_at_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    failure, notes, calls = _shrink(monkeypatch, tmp_path, set())
    assert failure.confirmed
    assert list(failure.minimal) == [describe(op) for op in MINIMAL]
    assert notes == []
    assert calls == 2  # the prefix's rerun, then one confirmation


def test_one_passing_rerun_does_not_throw_the_shrink_away(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    failure, notes, calls = _shrink(monkeypatch, tmp_path, {2})
    assert failure.confirmed
    assert list(failure.minimal) == [describe(op) for op in MINIMAL]
    assert len(notes) == 1 and "passed 1 rerun(s) before it failed again" in notes[0]
    assert calls == 3


def test_negative_control_a_trace_that_passes_every_rerun_is_not_confirmed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    failure, _, calls = _shrink(monkeypatch, tmp_path, {2, 3, 4, 5})
    assert not failure.confirmed
    assert list(failure.minimal) == [describe(op) for op in OPS[:DIVERGES_AT + 1]]
    assert calls == 1 + runner.RANDOM_TRIES
