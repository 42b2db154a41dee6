"""The checkers' band is SPEC §7.5 restated, and it equals the reference's keep band.

:func:`affinity_conformance.invariants.spec_band` is written from the SPEC, not imported
from a policy module, so that ``within_band`` and ``no_starvation`` would not agree with a
wrong policy. Here it must equal :func:`affinity_core.policy.keep_band` (and the engine's)
on every valid configuration of a small grid and every context of a range that crosses
several multiples of T and the cap; each deliberately wrong band below must be told apart
by the same comparison.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from affinity_conformance.invariants import spec_band
from affinity_core import policy as reference_policy
from affinity_core.config import Config, ConfigError, DualThreshold
from affinity_engine import policy as engine_policy

Band = Callable[[Config, int | None], int | None]

MARGINS = (None, 0, 1, 2, 3)
TOKENS = (None, 1, 2, 3, 7)
CAPS = (None, 1, 2, 3, 4, 6)
CONTEXTS = (None, *range(0, 30), 10**9)


def _configs() -> list[Config]:
    configs = [Config(dual_threshold=DualThreshold(1)),
               Config(affinity_break_margin=1, affinity_break_tokens=2,
                      affinity_break_band_cap=3, full_determinism=True)]
    for margin, tokens, cap in itertools.product(MARGINS, TOKENS, CAPS):
        try:
            configs.append(Config(affinity_break_margin=margin, affinity_break_tokens=tokens,
                                  affinity_break_band_cap=cap))
        except ConfigError:
            continue  # R-CFG-6 refuses it: not a configuration the band is defined on
    return configs


CONFIGS = _configs()


def disagreements(band: Band, reference: Band) -> list[tuple[Config, int | None]]:
    return [(config, c) for config in CONFIGS for c in CONTEXTS
            if band(config, c) != reference(config, c)]


def test_the_grid_covers_every_case_of_the_band() -> None:
    with_band = [c for c in CONFIGS if c.affinity_break_tokens is not None]
    assert len(with_band) >= 40
    assert any(c.affinity_break_margin is None for c in CONFIGS)  # legacy and the gate
    assert any(c.affinity_break_margin is not None and c.affinity_break_tokens is None
               for c in CONFIGS)  # margin alone
    # some (config, c) is capped and some is not
    assert any(spec_band(c, 10**9) == c.affinity_break_band_cap for c in with_band)
    assert any(spec_band(c, 0) == c.affinity_break_margin for c in with_band)


@pytest.mark.parametrize("reference", [reference_policy.keep_band, engine_policy.keep_band],
                         ids=["affinity_core", "affinity_engine"])
def test_restated_band_equals_keep_band(reference: Band) -> None:
    assert disagreements(spec_band, reference) == []


def _band_parts(config: Config) -> tuple[int, int, int] | None:
    m, t, cap = (config.affinity_break_margin, config.affinity_break_tokens,
                 config.affinity_break_band_cap)
    return None if m is None or t is None or cap is None else (m, t, cap)


def _no_cap(config: Config, c: int | None) -> int | None:
    parts = _band_parts(config)
    return spec_band(config, c) if parts is None else parts[0] + (c or 0) // parts[1]


def _ceiling(config: Config, c: int | None) -> int | None:
    parts = _band_parts(config)
    if parts is None:
        return spec_band(config, c)
    m, t, cap = parts
    return min(m + -(-(c or 0) // t), cap)


def _off_by_one(config: Config, c: int | None) -> int | None:
    parts = _band_parts(config)
    return spec_band(config, c) if parts is None else min(parts[0] + (c or 0) // parts[1] + 1,
                                                          parts[2])


def _margin_only(config: Config, c: int | None) -> int | None:
    return config.affinity_break_margin


def _absent_is_one_step(config: Config, c: int | None) -> int | None:
    parts = _band_parts(config)
    return spec_band(config, parts[1] if c is None and parts else c)


def _gate_has_band_zero(config: Config, c: int | None) -> int | None:
    return 0 if config.dual_threshold is not None else spec_band(config, c)


@pytest.mark.parametrize("wrong", [_no_cap, _ceiling, _off_by_one, _margin_only,
                                   _absent_is_one_step, _gate_has_band_zero])
def test_negative_control_a_wrong_band_is_told_apart(wrong: Band) -> None:
    assert disagreements(wrong, reference_policy.keep_band) != []
