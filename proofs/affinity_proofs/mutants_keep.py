"""The keep-rule mutants of the BFS catalogue (:data:`~.mutants.MUTANTS`).

Theory of operation
-------------------
Each function here replaces ``keep_pin`` (installed by :func:`~.mutants_base._keep_patch`)
and, where it can, *wraps* the unpatched rule: ``<`` is ``<=`` at margin ``m - 1``,
``+1`` is margin ``m + 1``, so the only rule text is the broken part. Every wrapper passes
the acquire's ``context_tokens`` through, so on a context-band configuration it changes
only what its name says (:func:`~.mutants_base._with_margin` keeps the band's cap valid).
"""

from __future__ import annotations

import attrs

from affinity_engine import Config, LoadTable

from .mutants_band import _ORIGINAL_BAND
from .mutants_base import _ORIGINAL_KEEP, _margin_case, _with_margin

__all__ = ["keep_flipped", "keep_gate_inverted", "keep_margin_zero_off", "keep_min_excludes_pin",
           "keep_min_over_busy", "keep_none_as_zero", "keep_plus_one", "keep_strict",
           "keep_under_determinism"]


def keep_strict(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    # load < min + m  <=>  load <= min + (m - 1); at m = 0 nothing is kept.
    m = _margin_case(config)
    if m is None:
        return _ORIGINAL_KEEP(config, pool, pinned, context_tokens)
    return m > 0 and _ORIGINAL_KEEP(_with_margin(config, m - 1), pool, pinned, context_tokens)


def keep_plus_one(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    m = _margin_case(config)
    if m is None:
        return _ORIGINAL_KEEP(config, pool, pinned, context_tokens)
    return _ORIGINAL_KEEP(_with_margin(config, m + 1), pool, pinned, context_tokens)


def keep_flipped(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    # load >= min + m  <=>  not (load <= min + m - 1)
    m = _margin_case(config)
    if m is None:
        return _ORIGINAL_KEEP(config, pool, pinned, context_tokens)
    return m == 0 or not _ORIGINAL_KEEP(_with_margin(config, m - 1), pool, pinned, context_tokens)


def keep_margin_zero_off(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    # `if margin:` instead of `if margin is not None:` -- margin 0 silently means "off".
    if config.affinity_break_margin == 0:
        return _ORIGINAL_KEEP(_with_margin(config, None), pool, pinned, context_tokens)
    return _ORIGINAL_KEEP(config, pool, pinned, context_tokens)


def keep_none_as_zero(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    if config.policy == "legacy":
        return _ORIGINAL_KEEP(_with_margin(config, 0), pool, pinned, context_tokens)
    return _ORIGINAL_KEEP(config, pool, pinned, context_tokens)


def keep_under_determinism(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    return _ORIGINAL_KEEP(attrs.evolve(config, full_determinism=False), pool, pinned,
                          context_tokens)


def _others_min(pool: LoadTable, pinned: str) -> int:
    # The natural buggy code: no default, so a one-server pool raises ValueError.
    return min(n for s, n in pool.items() if s != pinned)


def keep_min_excludes_pin(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    if config.full_determinism:
        return True
    m, gate = config.affinity_break_margin, config.dual_threshold
    if m is not None:
        return pool.load(pinned) <= _others_min(pool, pinned) + m
    if gate is None or gate.balance_abs_threshold <= 0:
        return True
    low, high, rel = _others_min(pool, pinned), pool.max_load, gate.balance_rel_threshold
    if pool.load(pinned) == low:
        return True
    return not (high - low > gate.balance_abs_threshold
                and high * rel.denominator > low * rel.numerator)


def keep_min_over_busy(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    # "ignore idle (warming-up) servers" when computing the band's floor
    m = _margin_case(config)
    if m is None:
        return _ORIGINAL_KEEP(config, pool, pinned, context_tokens)
    busy = [n for _, n in pool.items() if n > 0]
    band = _ORIGINAL_BAND(config, context_tokens)  # the margin, or the context band's width
    return pool.load(pinned) <= (min(busy) if busy else 0) + (m if band is None else band)


def keep_gate_inverted(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    # `abs > 0` where the PR says `abs <= 0` disables the gate: the gate never fires.
    gate = config.dual_threshold
    if gate is not None and not config.full_determinism and gate.balance_abs_threshold > 0:
        return True
    return _ORIGINAL_KEEP(config, pool, pinned, context_tokens)
