"""Conformance levels: one verdict per level, and which levels an implementation claims.

Theory of operation
-------------------
Every vector declares the levels it counts toward (``levels``, computed by
:func:`~affinity_conformance.vector_format.levels_of`): ``core`` -- verl's semantics through
verl's API (routing decisions, status, rejections) -- then one level per feature
(``margin``, ``full_determinism``, ...), and ``strict-config``: the spec's construction-time
refusals, several of which verl deliberately does not make (SPEC section 18). A generated
trace counts toward the levels of its family's features, or ``core``.

A level's verdict is ``fail`` if a case or trace of it failed, ``pass`` if one ran and none
failed, ``unsupported`` if none could run. An implementation *claims* the levels given with
``--level``; by default it claims ``core`` and every feature level it supports (its
constructor accepts the option) in which something ran. ``strict-config`` is never claimed
by default: like the JSON Schema test suite's ``optional/`` tests it is reported, and a
failure there reads "N deviations (SPEC §18)", not a bare FAIL. ``affinity check`` exits 0
iff every claimed level passes (an unsupported claimed level does not pass).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from .vector_format import FEATURES, LEVELS, STRICT_CONFIG

__all__ = ["LEVELS", "STRICT_CONFIG", "LevelResult", "check_claims", "default_claims",
           "family_levels", "level_words"]


@attrs.define
class LevelResult:
    level: str
    passed: int = 0
    failed: int = 0
    unsupported: int = 0
    traces_passed: int = 0
    traces_failed: int = 0
    random_ties: int = 0  # acquires where the implementation took another allowed server
    missing: set[str] = attrs.field(factory=set)

    @property
    def verdict(self) -> str:
        if self.failed or self.traces_failed:
            return "fail"
        return "pass" if self.passed or self.traces_passed else "unsupported"

    @property
    def ran(self) -> bool:
        return bool(self.passed or self.failed or self.traces_passed or self.traces_failed)

    def to_json(self) -> dict[str, object]:
        return {"verdict": self.verdict, "passed": self.passed, "failed": self.failed,
                "unsupported": self.unsupported, "traces_passed": self.traces_passed,
                "traces_failed": self.traces_failed, "random_ties": self.random_ties,
                "missing_features": sorted(self.missing)}


def family_levels(features: Iterable[str]) -> list[str]:
    """The levels of a generated trace whose family needs ``features``."""
    wanted = set(features)
    return [f for f in FEATURES if f in wanted] or ["core"]


def default_claims(results: dict[str, LevelResult], supported: Iterable[str]) -> list[str]:
    """``core`` plus every supported feature level in which something ran."""
    have = set(supported)
    return [name for name in LEVELS if name == "core"
            or (name in have and name in results and results[name].ran)]


def level_words(result: LevelResult, tie_mode: str) -> str:
    """One level's verdict in words, e.g. ``pass (random ties)`` or ``6 deviations (SPEC §18)``."""
    failures = result.failed + result.traces_failed
    if result.verdict == "fail":
        if result.level == STRICT_CONFIG:
            return f"{failures} deviation{'s' * (failures != 1)} (SPEC §18)"
        return f"FAIL ({failures} failing)"
    if result.verdict == "unsupported":
        needs = ", ".join(sorted(result.missing)) or "nothing ran"
        return f"unsupported (needs {needs})"
    if tie_mode == "any" and result.random_ties:
        return "pass (random ties)"
    return "pass"


def check_claims(claimed: Sequence[str]) -> list[str]:
    """Validate ``--level`` names; the message names the value and the accepted ones."""
    unknown = [c for c in claimed if c not in LEVELS]
    if unknown:
        raise ValueError(f"unknown level {unknown[0]!r}; levels: {', '.join(LEVELS)}")
    return list(dict.fromkeys(claimed))
