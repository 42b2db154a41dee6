"""``affinity_runtime.ReuseMeter``: the reuse-scaled context of SPEC R-BAND-6.

c = prompt * H_p // Q_p over the kept turns recorded for the pinned server p; the prompt
length while Q_p = 0; a refused report changes nothing; a server that leaves loses its sums.
"""

from __future__ import annotations

import pytest

from affinity_runtime import ReuseMeter
from affinity_runtime.reuse import MAX_TOKENS


def test_the_meter_scales_by_each_servers_reuse_with_integer_arithmetic() -> None:
    meter = ReuseMeter()
    assert meter.scaled("a", 9000) == 9000  # no evidence yet: the prompt length
    meter.record("a", 1000, 250)
    meter.record("a", 3000, 750)  # a: 1,000 of 4,000 looked-up tokens were cached
    meter.record("b", 500, 500)
    assert meter.scaled("a", 9000) == 2250
    assert meter.scaled("a", 3) == 0  # floor, never a float
    assert meter.scaled("b", 777) == 777
    assert meter.scaled("c", 123) == 123
    assert meter.reuse("a") == (1000, 4000)
    assert meter.reuse("c") == (0, 0)


def test_a_zero_prompt_report_is_evidence_of_nothing() -> None:
    meter = ReuseMeter()
    meter.record("a", 0, 0)
    assert meter.scaled("a", 100) == 100  # Q_p is still 0


@pytest.mark.parametrize(("prompt", "cached", "fragment"), [
    (1000, -1, "cached_tokens must be in [0, prompt_tokens=1000], got -1"),
    (1000, 1001, "cached_tokens must be in [0, prompt_tokens=1000], got 1001"),
    (1000, True, "cached_tokens must be in [0, prompt_tokens=1000], got True"),
    (1000, 2.0, "cached_tokens must be in [0, prompt_tokens=1000], got 2.0"),
    (-5, 0, f"prompt_tokens must be an integer in [0, {MAX_TOKENS}], got -5"),
    ("10", 0, f"prompt_tokens must be an integer in [0, {MAX_TOKENS}], got '10'"),
    # Found by a new user: a corrupt 4,299-digit report was recorded and outweighed every
    # honest one.
    (2**63, 0, f"prompt_tokens must be an integer in [0, {MAX_TOKENS}], got {2**63}"),
])
def test_bad_reports_name_the_value_and_change_nothing(prompt: object, cached: object,
                                                       fragment: str) -> None:
    meter = ReuseMeter()
    meter.record("a", 4000, 1000)
    with pytest.raises(ValueError) as info:
        meter.record("a", prompt, cached)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert meter.reuse("a") == (1000, 4000)


def test_a_server_that_leaves_starts_afresh() -> None:
    meter = ReuseMeter()
    meter.record("a", 1000, 0)
    assert meter.scaled("a", 5000) == 0
    meter.forget("a")
    meter.forget("never-seen")  # no error
    assert meter.scaled("a", 5000) == 5000


def test_the_largest_64_bit_report_is_accepted() -> None:
    meter = ReuseMeter()
    meter.record("a", MAX_TOKENS, MAX_TOKENS)
    assert MAX_TOKENS == 2**63 - 1 and meter.reuse("a") == (MAX_TOKENS, MAX_TOKENS)


@pytest.mark.parametrize("prompt", [-7, 1.5, True, None, "10"])
@pytest.mark.parametrize("evidence", [False, True])
def test_a_bad_prompt_length_to_scale_is_refused(prompt: object, evidence: bool) -> None:
    # Found by a new user: -7 at half reuse came out -4, 1.5 came out 0.0, and without evidence any
    # value was passed through unchanged.
    meter = ReuseMeter()
    if evidence:
        meter.record("a", 10, 5)
    with pytest.raises(ValueError) as info:
        meter.scaled("a", prompt)  # type: ignore[arg-type]
    assert str(info.value) == f"prompt_tokens must be an integer >= 0, got {prompt!r}"
    assert meter.reuse("a") == ((5, 10) if evidence else (0, 0))
