"""The report of ``affinity verify``: obligations, rows, mutants, JSON.

Theory of operation
-------------------
A :class:`Row` is one (obligation, method) pair: what was checked, on which scope, with
which result, how long it took, and the mutants the *same* checker refuted in the *same*
run. A row passes when its property holds (or its stated fact has a witness) **and** every
mutant attached to it was refuted. An obligation passes when all its rows pass and at
least one mutant of the core was refuted for it; the run passes when every obligation
does. Rows for obligation 0 check the checkers themselves (encoding conformance,
symmetry soundness).

:func:`to_json` is the ``--json`` document: every row with its evidence (states, Ns,
counterexamples, traces), the obligation summary and the mutant catalogue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["OBLIGATIONS", "MutantVerdict", "Obligation", "Row", "obligation_passed", "to_json"]


@attrs.frozen
class Obligation:
    number: int
    title: str
    requirements: tuple[str, ...]


OBLIGATIONS: tuple[Obligation, ...] = (
    Obligation(0, "Checker soundness (encoding conformance, symmetry)",
               ("R-REL-1", "R-KEEP-1", "R-TIE-1")),
    Obligation(1, "Default-null equivalence with the legacy model",
               ("R-LEG-1", "R-LEASE-1", "R-LRU-1", "R-LRU-2", "R-LRU-3", "R-RLS-1",
                "R-CLR-1", "R-STAT-1", "R-BAND-3")),
    Obligation(2, "Determinism under full_determinism",
               ("R-DET-1", "R-DET-2", "R-DET-3", "R-DET-4", "R-HASH-1")),
    Obligation(3, "Bounded skew per decision", ("R-SKEW-1", "R-SKEW-2", "R-SKEW-3", "R-SKEW-4",
                                                "R-PLACE-1", "R-OBS-2", "R-OBS-3")),
    Obligation(4, "Margin 0 picks a least-loaded server", ("R-SKEW-5",)),
    Obligation(5, "Monotonicity in the margin", ("R-KEEP-4",)),
    Obligation(6, "Selectivity: a pin inside the band is kept", ("R-KEEP-1", "R-KEEP-2",
                                                                  "R-KEEP-4")),
    Obligation(7, "Break correctness", ("R-BREAK-1", "R-BREAK-2", "R-PLACE-1")),
    Obligation(8, "Counter accounting", ("R-CNT-1", "R-CNT-2", "R-CNT-3")),
    Obligation(9, "Conservation", ("R-CONS-1", "R-CONS-2", "R-ACQ-7", "R-HAZ-1", "R-OBS-3")),
    Obligation(10, "Cache bound", ("R-LRU-5", "R-ST-2")),
    Obligation(11, "Liveness of the pool", ("R-POOL-4", "R-ACQ-5", "R-ACQ-6", "R-OUT-1",
                                             "R-OUT-2")),
    Obligation(12, "No starvation", ("R-KEEP-3",)),
    Obligation(13, "The #6533 gate, side by side with the margin", ("R-GATE-1", "R-GATE-2",
                                                                    "R-POL-1")),
    Obligation(14, "Lease accounting", ("R-LEASE-1", "R-LEASE-2", "R-LEASE-3", "R-LEASE-4",
                                        "R-LEASE-5")),
    Obligation(15, "Outcomes and effects of every event", (
        "R-OUT-3", "R-ACQ-1", "R-ACQ-2", "R-ACQ-3", "R-ACQ-4", "R-ACQ-8", "R-TIE-1",
        "R-TIE-2", "R-TIE-3", "R-TIE-4", "R-RLS-1", "R-POOL-1", "R-POOL-2", "R-POOL-3",
        "R-CLR-1", "R-OBS-1", "R-LRU-3", "R-LRU-4", "R-REL-1")),
    Obligation(16, "Status view, also after observed loads", ("R-STAT-1", "R-OBS-2")),
    Obligation(17, "Lease counters", ("R-LEASE-3", "R-LEASE-6")),
    Obligation(18, "Deterministic mode: inputs and index", ("R-ACQ-9", "R-DET-2", "R-DET-3",
                                                            "R-HASH-1")),
    Obligation(19, "Configuration validation", ("R-CFG-1", "R-CFG-2", "R-CFG-3", "R-CFG-4",
                                                "R-CFG-5", "R-CFG-6", "R-POL-1")),
    Obligation(20, "The context band: exact, capped, monotone, selective, inert when off",
               ("R-BAND-1", "R-BAND-2", "R-BAND-3", "R-BAND-4", "R-BAND-5")),
    Obligation(21, "The engine refines the reference", ("R-REF-1",)),
)
_BY_NUMBER = {o.number: o for o in OBLIGATIONS}
# Rows whose subject is the reference's own values: validation and the encoding.
_REFERENCE_VALUE_METHODS = frozenset({
    "exhaustive edge-value table", "event edge-value table", "encoding round trip",
    "derived configuration flags", "configuration defaults",
    "BFS of the reference, group pins"})

# Rows that run the same check on both packages and compare them.
_BOTH_PACKAGES_METHODS = frozenset({"unread acquire inputs"})


@attrs.frozen
class MutantVerdict:
    name: str
    description: str
    refuted: bool
    evidence: str  # the counterexample (or why the mutant survived)
    # The control's own code crashed (e.g. a monkeypatch that no longer fits a refactored
    # core): neither a refutation nor a failure of the core; the row does not fail on it.
    inconclusive: bool = False


@attrs.frozen
class Row:
    obligation: int
    method: str
    scope: str
    holds: bool  # the property (or the stated fact) checked out
    seconds: float
    mutants: tuple[MutantVerdict, ...] = ()
    detail: str = ""
    requirements: tuple[str, ...] = ()  # defaults to the obligation's
    evidence: dict[str, Any] = attrs.field(factory=dict)
    # True only for a Z3 proof over a symbolic pool size (proved for every N >= 1); every
    # other row checks the sizes its scope names and is reported as "bounded".
    all_n: bool = False

    @property
    def package(self) -> str:
        """What the row checked: the engine, the reference values (configuration, events
        and the codec live in affinity_core), the two against each other, or a Z3
        encoding (itself checked against the engine by obligation 0)."""
        if self.obligation == 21 or self.method in _BOTH_PACKAGES_METHODS:
            return "affinity_engine vs affinity_core"
        if self.method.startswith("Z3") and "real core" not in self.method:
            return "Z3 encoding"
        if self.method in _REFERENCE_VALUE_METHODS:
            return "affinity_core"
        return "affinity_engine"

    @property
    def scope_kind(self) -> str:
        return "all N" if self.all_n else "bounded"

    @property
    def scope_text(self) -> str:
        """The scope as printed and in ``--json``: "all N: ..." or "bounded: ..."."""
        return f"{self.scope_kind}: {self.scope}"

    @property
    def passed(self) -> bool:
        return self.holds and all(m.refuted or m.inconclusive for m in self.mutants)

    @property
    def requirement_ids(self) -> tuple[str, ...]:
        return self.requirements or _BY_NUMBER[self.obligation].requirements

    @property
    def result(self) -> str:
        if not self.holds:
            return "FAIL"
        if not all(m.refuted or m.inconclusive for m in self.mutants):
            return "SURVIVOR"
        return "pass"

    @property
    def mutant_score(self) -> str:
        if not self.mutants:
            return "-"
        unsure = sum(m.inconclusive for m in self.mutants)
        return f"{sum(m.refuted for m in self.mutants)}/{len(self.mutants)}" + (
            f" ({unsure} inconclusive)" if unsure else "")


def obligation_passed(number: int, rows: Sequence[Row]) -> tuple[bool, str]:
    mine = [r for r in rows if r.obligation == number]
    if not mine:
        return False, "no rows"
    if not any(m.refuted for r in mine for m in r.mutants):
        return False, "no refuted mutant"
    failed = [r.method for r in mine if not r.passed]
    return (not failed), ("failed: " + ", ".join(failed)) if failed else "ok"


def _row_json(r: Row) -> dict[str, Any]:
    return {
        "obligation": r.obligation, "title": _BY_NUMBER[r.obligation].title,
        "requirements": list(r.requirement_ids), "method": r.method, "scope": r.scope_text,
        "package": r.package,
        "scope_kind": r.scope_kind,
        "result": r.result, "holds": r.holds, "passed": r.passed,
        "seconds": round(r.seconds, 3), "detail": r.detail,
        "mutants": [attrs.asdict(m) for m in r.mutants], "evidence": r.evidence,
    }


def to_json(scope: str, rows: Sequence[Row], seconds: float,
            catalogue: Sequence[dict[str, Any]], extra: dict[str, Any],
            only: frozenset[int] | None = None) -> dict[str, Any]:
    obligations = []
    for o in OBLIGATIONS:
        if only is not None and o.number not in only:
            continue
        ok, why = obligation_passed(o.number, rows)
        mine = [r for r in rows if r.obligation == o.number]
        obligations.append({
            "obligation": o.number, "title": o.title, "requirements": list(o.requirements),
            "passed": ok, "why": why, "methods": [r.method for r in mine],
            "mutants_refuted": sorted({m.name for r in mine for m in r.mutants if m.refuted}),
        })
    return {
        "format": "affinity-verify-report/1", "scope": scope, "seconds": round(seconds, 2),
        "passed": all(o["passed"] for o in obligations),
        "obligations": obligations, "rows": [_row_json(r) for r in rows],
        "mutant_catalogue": list(catalogue), **extra,
    }
