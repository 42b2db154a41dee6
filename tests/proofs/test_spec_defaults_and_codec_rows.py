"""The verify checks that kill the ``operator_`` mutants of tools/mutation_audit:
SPEC's Default column (``check_defaults`` with its control), and the encoding clauses
for an integral ``balance_rel_threshold``, an explicit external load of 0 and a negative
initial load. Each is clean on the core and sees the bug the audit's survivor planted."""

from __future__ import annotations

from fractions import Fraction

import pytest
from affinity_proofs import input_table, predicate_table
from affinity_proofs.mutants import by_name

import affinity_conformance.invariants as inv
import affinity_core.codec as reference_codec
import affinity_engine.codec as codec
from affinity_core.outcomes import Acquired, Path
from affinity_engine import Config, DualThreshold, initial_state
from affinity_engine.codec import CodecError
from affinity_engine.machine import Transition
from affinity_engine.values import evolve


def test_defaults_match_spec_and_see_their_control() -> None:
    checked, problems = input_table.check_defaults()
    assert checked == 12 and problems == []
    with by_name("cache_default_shifted").applied():
        _, found = input_table.check_defaults()
    assert found and "max_cache_size = 10001" in found[0]
    assert input_table.check_defaults() == (checked, [])  # the control was undone


def test_integral_rel_is_written_p(monkeypatch: pytest.MonkeyPatch) -> None:
    """R-CODEC-1: ``"p"`` when q is 1 (operator_codec_rel_slash wrote ``"3/1"``)."""
    data = codec.config_to_json(Config(dual_threshold=DualThreshold(1, 3)))
    assert data["dual_threshold"]["balance_rel_threshold"] == "3"
    assert input_table.check_codec()[1] == []
    monkeypatch.setattr(reference_codec, "_rel_text",
                        lambda rel: f"{rel.numerator}/{rel.denominator}")
    _, found = input_table.check_codec()
    assert any("encodes as '1/1'; SPEC: '1'" in p for p in found)


def test_zero_external_and_negative_loads_on_decoding() -> None:
    """A state stores only non-zero external loads; counts are >= 0 (R-CONS-1)."""
    plain = Config()
    zero = codec.state_from_json(plain, {"servers": [["a", 1]], "external": {"a": 0}})
    assert dict(zero.external) == {} and inv.well_formed(plain, zero)
    with pytest.raises(CodecError, match="loads must be >= 0"):
        codec.state_from_json(plain, {"servers": [["a", -1]]})


def test_counter_exhibits() -> None:
    """R-CNT-2 and R-ST-2 on the counters: the clauses operator_inv_counters_2 and
    operator_inv_wf_broken loosened are each false on a built violation."""
    config = Config(affinity_break_margin=0)
    pre = initial_state(config, ["s0"])
    outcome = Acquired("s0", Path.NEW)
    assert not inv.counters_monotonic(pre, Transition(evolve(pre, affinity_kept=2), outcome))
    assert not inv.well_formed(config, evolve(pre, affinity_broken=-1))
    whats = {what for _, what, _, _ in predicate_table.EXHIBITS}
    assert "a negative broken counter (R-ST-2)" in whats
    assert "a counter that moves by two in one step (R-CNT-2)" in whats
    assert predicate_table.check_exhibits()[1] == []


def test_rel_default_is_three_halves() -> None:
    assert DualThreshold(1).balance_rel_threshold == Fraction(3, 2)
