"""The context band (SPEC §7.5): R-BAND-1..5 and R-CFG-6 as small core scenarios.

The proof suite checks the same rules for every pool size; these pin the boundaries a
reader can check by hand.
"""

from __future__ import annotations

from typing import Any

import pytest

from affinity_core.events import Acquire, EventError
from affinity_engine import Config, ConfigError, initial_state, step
from affinity_engine.codec import config_from_json, config_to_json, event_from_json, event_to_json
from affinity_engine.policy import keep_band

from .driver import Run

BAND: dict[str, Any] = {"affinity_break_margin": 1, "affinity_break_tokens": 1000,
        "affinity_break_band_cap": 3}


def pinned_with_skew(skew: int, **options: Any) -> Run:
    """"conv" pinned to s0, with s0 at ``skew`` above the minimum (s1, s2 at 0)."""
    run = Run.of(**options).acquire("conv", expect="s0", path="new").release("s0")
    return run.set_loads(s0=skew, s1=0, s2=0)


@pytest.mark.parametrize(("context", "band"), [
    (None, 1), (0, 1), (999, 1), (1000, 2), (1999, 2), (2000, 3), (10**9, 3),
])
def test_band_widens_by_one_per_T_tokens_up_to_the_cap(context: int | None, band: int) -> None:
    """R-BAND-1, R-BAND-2: band = min(m + c // T, cap); absent context counts as 0."""
    assert keep_band(Config(**BAND), context) == band
    # The boundary itself: kept at skew == band, broken at band + 1 (R-BAND-1).
    pinned_with_skew(band, **BAND).acquire("conv", expect="s0", path="kept",
                                           context_tokens=context)
    pinned_with_skew(band + 1, **BAND).acquire("conv", expect="s1", path="broken",
                                               previous="s0", context_tokens=context)


def test_without_tokens_the_context_is_ignored() -> None:
    """R-BAND-3: with affinity_break_tokens null the margin rule holds for any context."""
    for context in (None, 0, 10**6):
        pinned_with_skew(2, affinity_break_margin=1).acquire(
            "conv", expect="s1", path="broken", context_tokens=context)
        pinned_with_skew(5).acquire("conv", expect="s0", path="kept",
                                    context_tokens=context)


def test_monotone_in_context_and_in_tokens_per_step() -> None:
    """R-BAND-4: more context, or fewer tokens per step of band, never breaks a kept pin."""
    for tokens in (1, 500, 1000, 3000):
        config = Config(affinity_break_margin=1, affinity_break_tokens=tokens,
                        affinity_break_band_cap=3)
        coarser = Config(affinity_break_margin=1, affinity_break_tokens=tokens * 2,
                         affinity_break_band_cap=3)
        bands = [keep_band(config, c) or 0 for c in range(0, 5000, 250)]
        assert bands == sorted(bands) and min(bands) >= 1 and max(bands) <= 3
        assert all((keep_band(coarser, c) or 0) <= (keep_band(config, c) or 0)
                   for c in range(0, 5000, 250))
    # And through the machine: a pin kept at context c stays kept at every larger c.
    for skew in range(5):
        kept = [pinned_with_skew(skew, **BAND).step(
            Acquire(request_id="conv", context_tokens=c)).path.value  # type: ignore[union-attr]
            for c in (0, 1000, 2000, 9000)]
        assert kept == sorted(kept, key=lambda p: p == "kept"), kept


def test_ignored_under_full_determinism() -> None:
    """R-BAND-5: full_determinism keeps every pin whatever the band says."""
    run = Run.of(full_determinism=True, **BAND)
    run.acquire("conv", expect="s0", path="new", request_hash=0).release("s0")
    run.set_loads(s0=9)
    run.acquire("conv", expect="s0", path="kept", request_hash=0, context_tokens=0)


@pytest.mark.parametrize(("options", "words"), [
    ({"affinity_break_tokens": 100, "affinity_break_band_cap": 2}, "set the margin too"),
    ({"affinity_break_margin": 1, "affinity_break_tokens": 100}, "set together"),
    ({"affinity_break_margin": 1, "affinity_break_band_cap": 2}, "set together"),
    ({"affinity_break_margin": 3, "affinity_break_tokens": 100,
      "affinity_break_band_cap": 2}, "affinity_break_band_cap must be an integer >= "),
    ({"affinity_break_margin": 1, "affinity_break_tokens": 0,
      "affinity_break_band_cap": 2}, "affinity_break_tokens must be null or an integer >= 1, "
                                     "got 0 (int)"),
    ({"affinity_break_margin": 1, "affinity_break_tokens": True,
      "affinity_break_band_cap": 2}, "got True (bool)"),
    ({"affinity_break_margin": 1, "affinity_break_tokens": 100,
      "affinity_break_band_cap": 2.5}, "got 2.5 (float)"),
])
def test_configuration_is_refused_with_the_values_named(options: dict[str, Any],
                                                        words: str) -> None:
    """R-CFG-6, R-CFG-1: refused at construction, the message names the value."""
    with pytest.raises(ConfigError, match=None) as info:
        Config(**options)
    assert words in str(info.value)


def test_integral_floats_are_accepted_and_encoding_is_unchanged_without_the_band() -> None:
    """R-CFG-6: 2.0 is 2; the encoding of a band-less config has no band keys."""
    config = Config(affinity_break_margin=1, affinity_break_tokens=100.0,
                    affinity_break_band_cap=2.0)
    assert (config.affinity_break_tokens, config.affinity_break_band_cap) == (100, 2)
    assert config_from_json(config_to_json(config)) == config
    assert "affinity_break_tokens" not in config_to_json(Config(affinity_break_margin=1))


@pytest.mark.parametrize("bad", [-1, True, 1.5, "10"])
def test_context_tokens_field_is_validated(bad: Any) -> None:
    """R-EV-2: context_tokens is null or an integer >= 0; the message names the value."""
    with pytest.raises(EventError, match="context_tokens must be null or an integer >= 0"):
        Acquire(request_id="r", context_tokens=bad)


def test_context_tokens_round_trips_and_a_rejection_leaves_no_trace() -> None:
    """R-EV-2: the field survives the codec; an unknown key is still refused."""
    event = Acquire(request_id="r", context_tokens=4096)
    assert event_from_json(event_to_json(event)) == event
    assert "context_tokens" not in event_to_json(Acquire(request_id="r"))
    state = initial_state(Config(**BAND), ["s0"])
    assert step(Config(**BAND), state, event).state.pool.load("s0") == 1


def test_config_error_for_servers_none() -> None:
    """R-CFG-2: a missing server list is a configuration error, not a TypeError."""
    with pytest.raises(ConfigError, match="servers must be a list of server ids, got None"):
        initial_state(Config(), None)  # type: ignore[arg-type]
