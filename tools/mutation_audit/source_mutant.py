"""The record of one audit mutant: an exact source edit of one file of the core.

A mutant names a file by its name alone. The values every package shares (``config``,
``events``, ``outcomes``, ``hashing``) live in the reference, ``affinity_core``; everything
else is the engine's, ``affinity_engine``, whose codec re-exports the reference's for all but
states, except the checker artefacts the proofs judge with (``invariants``, the naive
``legacy`` model), which live in ``affinity_conformance``. :func:`mutant` resolves the name to
the file whose text holds ``old`` exactly once, in that order; a snippet found nowhere
resolves to the engine's path, which ``python -m tools.mutation_audit.run --check`` and
tests/proofs/test_audit_catalogue_applies.py report.

Kept apart from the catalogues so that each catalogue module (``catalogue.py``, the
third set's ``catalogue_operators.py``) can import it without importing the other.
"""

from __future__ import annotations

from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("affinity_engine", "affinity_core", "affinity_conformance")

__all__ = ["PACKAGES", "ROOT", "SourceMutant", "mutant"]


@attrs.frozen
class SourceMutant:
    id: str
    path: str  # relative to the repository root
    old: str
    new: str
    description: str
    equivalent: str | None = None  # why no observable behaviour differs


def mutant(id: str, path: str, old: str, new: str, description: str,
           equivalent: str | None = None) -> SourceMutant:
    """A mutant of ``<package>/<path>``: ``old`` (occurring exactly once) -> ``new``."""
    for package in PACKAGES:
        source = ROOT / package / path
        if source.is_file() and source.read_text(encoding="utf-8").count(old) == 1:
            return SourceMutant(id, f"{package}/{path}", old, new, description, equivalent)
    return SourceMutant(id, f"{PACKAGES[0]}/{path}", old, new, description, equivalent)
