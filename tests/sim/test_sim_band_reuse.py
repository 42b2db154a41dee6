"""The context band fed by observed reuse (``band-...-reuse``): what the simulated adapter sends.

Cites SPEC R-BAND-6 (the reuse-scaled context: what the simulated adapter sends), R-BAND-1
(the core decides with whatever ``context_tokens`` arrives) and R-BAND-3 (a band whose context
is 0 is the margin rule). The reuse source is an adapter choice: the core configuration is
the same as the plain band's. The meter itself is tested in tests/runtime/test_reuse_meter.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from affinity_sim.routing import PolicyError, ReuseMeter, parse_policy
from affinity_sim.simulate import simulate_step

from affinity_engine import step

from .test_sim_routing import tiny_workload


def test_reuse_policies_parse_to_the_same_core_config_as_the_plain_band() -> None:
    plain, reuse = parse_policy("band-m1-T8192-cap4"), parse_policy("band-m1-T8192-cap4-reuse")
    assert reuse.config() == plain.config()
    assert (plain.context_source, reuse.context_source) == ("prompt", "reuse")
    assert reuse.describe()["context_source"] == "reuse"
    table = parse_policy({"name": "r", "affinity_break_margin": 1, "affinity_break_tokens": 64,
                          "affinity_break_band_cap": 3, "context_source": "reuse"})
    assert table.context_source == "reuse"


@pytest.mark.parametrize(("spec", "fragment"), [
    ({"name": "r", "affinity_break_margin": 1, "context_source": "cached"},
     "context_source must be one of ['prompt', 'reuse'], got 'cached'"),
    ("band-m1-T8192-cap4-reused", "band-mM-TT-capC-reuse"),
])
def test_bad_context_sources_name_the_value(spec: Any, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(spec)
    assert fragment in str(info.value)


def _sent_contexts(monkeypatch: pytest.MonkeyPatch, policy: str, **changes: object
                   ) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []

    def recording_step(config, state, event):  # type: ignore[no-untyped-def]
        if type(event).__name__ == "Acquire":
            seen.append((event.request_id, event.context_tokens))
        return step(config, state, event)

    monkeypatch.setattr("affinity_engine.cursor.step", recording_step)
    simulate_step(tiny_workload(**changes), parse_policy(policy), seed=3)
    return seen


def test_a_warm_cache_sends_almost_the_whole_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny workload's pool holds everything: continuing turns hit all full blocks."""
    plain = _sent_contexts(monkeypatch, "band-m1-T50-cap3")
    reuse = _sent_contexts(monkeypatch, "band-m1-T50-cap3-reuse")
    plain_turns, reuse_turns = _by_request(plain), _by_request(reuse)
    assert plain_turns.keys() == reuse_turns.keys()
    ratios = []
    for rid, sent in reuse_turns.items():
        assert len(sent) == len(plain_turns[rid]) == 3  # three turns each
        for c_reuse, c_plain in zip(sent, plain_turns[rid], strict=True):
            assert 0 <= c_reuse <= c_plain
            ratios.append(c_reuse / c_plain)
    assert min(ratios) >= 0.5 and max(ratios) == 1.0  # first turns: the prompt length
    assert sum(ratios) / len(ratios) < 1.0  # block rounding: the last partial block misses


def test_a_replica_that_reuses_nothing_sends_zero_context(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A replica whose continuing turns never hit (a thrashing cache) scales every later
    context to 0, so the band there is the margin m (R-BAND-3); before its first evidence
    the prompt length is sent."""
    class NothingCached(ReuseMeter):
        def record(self, server_id: str, prompt_tokens: int, cached_tokens: int) -> None:
            super().record(server_id, prompt_tokens, 0)

    monkeypatch.setattr("affinity_sim.simulate.ReuseMeter", NothingCached)
    plain = _sent_contexts(monkeypatch, "band-m1-T50-cap3")
    reuse = _sent_contexts(monkeypatch, "band-m1-T50-cap3-reuse")
    assert sum(1 for _, c in reuse if c == 0) > 0
    by_turn = _by_request(plain)
    for rid, sent in _by_request(reuse).items():
        assert sent[0] == by_turn[rid][0]  # a first turn has no pinned replica yet
        for c_reuse, c_plain in zip(sent, by_turn[rid], strict=True):
            assert c_reuse in (0, c_plain)


def _by_request(seen: list[tuple[str, int]]) -> dict[str, list[int]]:
    """Each session's sent contexts in turn order (acquires of one session are sequential)."""
    turns: dict[str, list[int]] = {}
    for rid, sent in seen:
        turns.setdefault(rid, []).append(sent)
    return turns


def test_the_reuse_run_uses_the_evidence_runs_workloads_on_fresh_seeds() -> None:
    from pathlib import Path

    from affinity_sim.presets import load_sweep

    examples = Path(__file__).resolve().parents[2] / "sim" / "examples"
    reuse = load_sweep(examples / "context-band-reuse.toml")
    evidence = load_sweep(examples / "context-band.toml")
    assert reuse.workloads == evidence.workloads
    assert reuse.seed_list()[0] == 200 and len(reuse.seed_list()) == 100
    used = set(range(0, 130))  # seeds of every earlier band run (0-29, 30-129)
    assert used.isdisjoint(reuse.seed_list())
    names = [p.name for p in reuse.policies]
    assert {"band-m1-T8192-cap4", "band-m1-T8192-cap4-reuse", "margin-2"} <= set(names)
