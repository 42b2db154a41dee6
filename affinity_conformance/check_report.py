"""The report of ``affinity check``: failures, per-suite and per-level tallies, and the
vector loader.

Theory of operation
-------------------
:func:`load_vectors` parses every vector of a directory and refuses a tree whose files
disagree with their ``_info.sha256`` or the manifest, so an edited or missing case is
reported instead of silently skipped. :class:`Failure` is one diagnosed divergence (the
shrunk trace, the first divergent step in words with its requirement ids, the vector it
was written as); :class:`SuiteResult` and :class:`CheckReport` hold the tallies that
:mod:`affinity_conformance.check` fills and :mod:`affinity_conformance.cli_check`
prints. A suite's verdict is ``fail`` if any case or trace failed, ``pass`` if one ran
and none failed, ``unsupported`` if nothing could run; the report's verdict is ``pass``
iff every claimed level passes (:mod:`affinity_conformance.levels`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from .levels import LevelResult
from .lockstep import Divergence
from .vector_format import (
    MANIFEST_NAME,
    Case,
    VectorError,
    case_digest,
    file_digest,
    load_case,
    load_manifest,
    vector_files,
)

__all__ = ["CheckReport", "Failure", "SuiteResult", "load_vectors"]


@attrs.frozen
class Failure:
    suite: str
    origin: str  # "vector legacy/x.json" or "trace legacy_first seed 17"
    divergence: Divergence
    trace: tuple[str, ...]  # the minimal trace, events in words
    original_length: int
    vector_path: str | None
    strict_config: bool = False  # a refusal of the strict-config level (SPEC section 18)

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "origin": self.origin, "step": self.divergence.index + 1,
                "event": self.divergence.event, "diagnosis": self.divergence.words,
                "requirements": list(self.divergence.requirements),
                "context": list(self.divergence.context), "minimal_trace": list(self.trace),
                "original_length": self.original_length, "vector": self.vector_path}

    def render(self) -> list[str]:
        """The diagnosis in words: origin, minimal trace, first divergence, vector file."""
        d = self.divergence
        head = "DEVIATION (strict-config, SPEC §18)" if self.strict_config else "FAIL"
        lines = [f"{head} {self.suite}: {self.origin}"]
        if self.trace:
            lines.append(f"  minimal trace ({len(self.trace)} of {self.original_length} "
                         f"events): {'; '.join(self.trace)}")
        where = d.render() if d.index >= 0 else f"{d.words} [{', '.join(d.requirements)}]"
        lines.append(f"  first divergence: {where}")
        if self.vector_path:
            lines.append(f"  as a vector: {self.vector_path}")
        return lines


@attrs.define
class SuiteResult:
    suite: str
    passed: int = 0
    failed: int = 0
    unsupported: int = 0
    traces_passed: int = 0
    traces_failed: int = 0
    missing: set[str] = attrs.field(factory=set)
    failures: list[Failure] = attrs.field(factory=list)

    @property
    def verdict(self) -> str:
        if self.failed or self.traces_failed:
            return "fail"
        return "pass" if self.passed or self.traces_passed else "unsupported"


@attrs.define
class CheckReport:
    impl: str
    convention: str
    features: list[str]
    tie_mode: str
    budget: int
    seed: int
    vectors_dir: str
    suites: dict[str, SuiteResult]
    levels: dict[str, LevelResult] = attrs.field(factory=dict)
    claimed: list[str] = attrs.field(factory=list)
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        """``pass`` iff every claimed level passes (affinity_conformance.levels)."""
        return "pass" if all(self.level(c).verdict == "pass" for c in self.claimed) else "fail"

    def level(self, name: str) -> LevelResult:
        return self.levels.get(name) or LevelResult(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "impl": self.impl, "constructor": self.convention, "features": self.features,
            "tie_break": self.tie_mode, "budget": self.budget, "seed": self.seed,
            "vectors": self.vectors_dir, "verdict": self.verdict, "seconds": round(self.seconds, 2),
            "claimed_levels": self.claimed,
            "levels": {name: r.to_json() for name, r in self.levels.items()},
            "suites": {name: {
                "verdict": r.verdict, "passed": r.passed, "failed": r.failed,
                "unsupported": r.unsupported, "traces_passed": r.traces_passed,
                "traces_failed": r.traces_failed, "missing_features": sorted(r.missing),
                "failures": [f.to_json() for f in r.failures]}
                for name, r in self.suites.items()},
        }


# ------------------------------------------------------------------ vectors
def load_vectors(root: Path) -> list[Case]:
    """Parse every vector under ``root`` and check it against its digests."""
    if root.exists() and not root.is_dir():
        hint = (f" (use {root.parent}, the directory that holds it)"
                if root.name == MANIFEST_NAME else "")
        raise VectorError(f"{root} is a file; --vectors takes the vector directory{hint}")
    if not root.is_dir():
        raise VectorError(f"{root}: no such vector directory")
    files = vector_files(root)
    if not files:
        raise VectorError(f"{root}: no vectors (<suite>/<case>.json) found")
    manifest = load_manifest(root) if (root / MANIFEST_NAME).exists() else None
    cases = []
    for path in files:
        case = load_case(path)
        info = case.data.get("_info")
        if not isinstance(info, dict) or info.get("sha256") != case_digest(case.data):
            raise VectorError(f"{path}: _info.sha256 does not match the case's canonical JSON "
                              "(edited by hand? regenerate: `affinity vectors generate --out DIR`)")
        if manifest is not None:
            rel = str(path.relative_to(root))
            want = manifest["files"].get(rel)
            if want != file_digest(path.read_bytes()):
                raise VectorError(f"{path}: not listed in {MANIFEST_NAME} with this sha256 "
                                  "(regenerate with `affinity vectors generate --out DIR`)")
        cases.append(case)
    if manifest is not None:
        on_disk = {str(p.relative_to(root)) for p in files}
        absent = sorted(set(manifest["files"]) - on_disk)
        if absent:
            raise VectorError(f"{root / MANIFEST_NAME} lists {len(absent)} file(s) that are "
                              f"missing, e.g. {absent[0]} (every listed case must be run)")
    return cases
