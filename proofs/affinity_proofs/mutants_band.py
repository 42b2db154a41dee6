"""Mutants of the context band (SPEC section 7.5): the band's negative controls.

Theory of operation
-------------------
Each mutant replaces the band's width ``min(m + c // T, cap)`` by a plausible slip --
no cap, a ceiling, ``c * T``, ``c % T``, the margin forgotten, the band evaluated under
``full_determinism``, the context read although ``T`` is null -- and patches it into the
real core twice: as ``policy.keep_band`` (for every caller of the width) and, through
:func:`~.mutants_base._keep_patch`, as the keep rule ``machine.keep_pin`` /
``policy.keep_pin`` calls. The keep rule of a mutant *wraps* the original: it calls the
unpatched ``keep_pin`` with a margin-only configuration whose margin is the mutated width,
so the only rule text here is the broken width, and the patch still bites if the core
inlines the width into ``keep_pin``.

The BFS searches them under obligation 20 (the band's checks, on the band's runs) or,
for ``context_without_tokens``, under obligation 1 (the decision ignores the context
when ``T`` is null, R-BAND-3); the wide encoding sweep and the decision table refute them
too, with the same checkers as the spec. ``band_tokens_zero_accepted`` is a control of the
configuration table (R-CFG-6).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import attrs

import affinity_engine.policy as policy
from affinity_engine import Config, LoadTable

from .mutants_base import _ORIGINAL_KEEP, Mutant, Patch, _keep_patch, patched

__all__ = ["BAND_MUTANTS", "BAND_WIDE_MUTANTS", "_ORIGINAL_BAND"]

_ORIGINAL_BAND = policy.keep_band
config_mod = importlib.import_module("affinity_core.config")

Width = Callable[[int, int, int, int], int]  # (m, T, cap, c) -> the band's width


@functools.lru_cache(maxsize=1024)
def _margin_only(config: Config, width: int) -> Config:
    """The configuration whose plain margin rule keeps exactly within ``width``."""
    return attrs.evolve(config, affinity_break_margin=width, affinity_break_tokens=None,
                        affinity_break_band_cap=None, full_determinism=False)


def _band_patch(width: Width | None, *, under_det: bool = False,
                without_tokens: bool = False) -> Patch:
    """Patch the band's width to ``width`` (None: the original), the keep rule with it."""

    def band(config: Config, context_tokens: int | None) -> int | None:
        m, tokens = config.affinity_break_margin, config.affinity_break_tokens
        c = context_tokens or 0
        if m is not None and tokens is None and without_tokens:
            return m + c  # the context widens the margin although T is null
        if m is None or tokens is None or width is None:
            return _ORIGINAL_BAND(config, context_tokens)
        cap = config.affinity_break_band_cap
        assert cap is not None
        return width(m, tokens, cap, c)

    def keep(config: Config, pool: LoadTable, pinned: str,
             context_tokens: int | None = None) -> bool:
        banded = config.affinity_break_tokens is not None
        if config.full_determinism and not (under_det and banded):
            return _ORIGINAL_KEEP(config, pool, pinned, context_tokens)
        b = band(config, context_tokens)
        if b is None or not (banded or without_tokens):
            return _ORIGINAL_KEEP(config, pool, pinned, context_tokens)
        return _ORIGINAL_KEEP(_margin_only(config, b), pool, pinned)

    def patch() -> Iterator[None]:
        with patched(policy, "keep_band", band), contextmanager(_keep_patch(keep))():
            yield

    return patch


def _tokens_zero_accepted() -> Iterator[None]:
    original = config_mod.validate_optional_positive

    def mutated(value: object, key: str) -> int | None:
        return 0 if value == 0 and not isinstance(value, bool) else original(value, key)

    with patched(config_mod, "validate_optional_positive", mutated):
        yield


def _no_cap(m: int, t: int, cap: int, c: int) -> int:
    return m + c // t


def _ceil(m: int, t: int, cap: int, c: int) -> int:
    return min(m + -(-c // t), cap)


def _times(m: int, t: int, cap: int, c: int) -> int:
    return min(m + c * t, cap)


def _mod(m: int, t: int, cap: int, c: int) -> int:
    return min(m + c % t, cap)


def _forgets_margin(m: int, t: int, cap: int, c: int) -> int:
    return min(c // t, cap)


BAND_MUTANTS: tuple[Mutant, ...] = (
    Mutant("band_no_cap", "context band: min(..., cap) forgotten, width m + c // T", (20,),
           _band_patch(_no_cap)),
    Mutant("band_ceil_division", "context band: ceil(c / T) instead of c // T", (20,),
           _band_patch(_ceil)),
    Mutant("band_times_tokens", "context band: c * T instead of c // T", (20,),
           _band_patch(_times)),
    Mutant("band_mod_not_div", "context band: c % T instead of c // T", (20,),
           _band_patch(_mod)),
    Mutant("band_forgets_margin", "context band: min(c // T, cap), below the margin", (20,),
           _band_patch(_forgets_margin)),
    Mutant("band_under_determinism", "context band applied under full_determinism", (20,),
           _band_patch(None, under_det=True)),
    Mutant("context_without_tokens", "T null, yet the context widens the margin (m + c)",
           (1,), _band_patch(None, without_tokens=True)),
    Mutant("band_tokens_zero_accepted", "affinity_break_tokens (and band_cap) 0 accepted", (19,),
           _tokens_zero_accepted),
)

# The band's controls of the wide encoding sweep (jobs_param.WIDE_MUTANTS): every one
# that changes a decision.
BAND_WIDE_MUTANTS: tuple[str, ...] = tuple(
    m.name for m in BAND_MUTANTS if m.obligations != (19,))
