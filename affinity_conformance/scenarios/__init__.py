"""Named conformance scenarios, one module per theme.

Each module exposes ``cases() -> Iterator[Scenario | dict]``: a :class:`Scenario` for
cases the core runs, or an already built vector dict for construction rejections (which
have no state to run). Expectations written in the scenarios (``expect=``, ``path=``,
``assert_loads`` ...) were worked out by hand from spec/SPEC.md; building fails if the
core disagrees with any of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from affinity_conformance.scenario import Scenario

from . import (
    band,
    counters,
    determinism,
    dual_threshold,
    eviction,
    extensions,
    failover,
    group,
    legacy,
    margin,
    prefix,
    validation,
)

__all__ = ["all_scenarios"]

MODULES = (legacy, eviction, failover, determinism, margin, band, counters, dual_threshold,
           extensions, group, prefix, validation)


def all_scenarios() -> Iterator[Scenario | dict[str, Any]]:
    for module in MODULES:
        yield from module.cases()
