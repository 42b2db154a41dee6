"""The record of one audit mutant: an exact source edit of one file, and the package it audits.

There are two catalogues, one per package that ``affinity verify`` must hold to the spec:

* ``engine`` (:mod:`.catalogue`, :mod:`.catalogue_operators`): bugs of what the adapters
  run -- ``affinity_engine``, the values it shares with the reference (``config``,
  ``events``, ``outcomes``, ``hashing`` and the codec of everything but states live in
  ``affinity_core``) and the checker artefacts the proofs judge with (``invariants``, the
  naive ``legacy`` model, in ``affinity_conformance``);
* ``core`` (:mod:`.catalogue_core`): bugs of the reference, ``affinity_core``, alone.

An engine mutant names a file by its name alone, and :func:`locate` resolves the name to
the package whose file holds ``old`` exactly once, in the order of :data:`PACKAGES`; a core
mutant's file is always under ``affinity_core/``. A snippet found nowhere resolves to the
first candidate's path, which ``python -m tools.mutation_audit.run --check`` and
tests/proofs/test_audit_catalogue_applies.py report. The runner resolves each mutant again
in the tree it mutates (an archived commit), so a file that differs between that commit
and the work tree is looked up where the edit is made.

Kept apart from the catalogues so that each catalogue module can import it without
importing the others.
"""

from __future__ import annotations

from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("affinity_engine", "affinity_core", "affinity_conformance")
# The packages whose files each catalogue's mutants may edit, in resolution order.
CANDIDATES = {"engine": PACKAGES, "core": ("affinity_core",)}

__all__ = ["CANDIDATES", "PACKAGES", "ROOT", "SourceMutant", "locate", "mutant"]


@attrs.frozen
class SourceMutant:
    id: str
    path: str  # relative to the repository root
    old: str
    new: str
    description: str
    equivalent: str | None = None  # why no observable behaviour differs
    package: str = "engine"  # the catalogue it belongs to: "engine" or "core"


def locate(m: SourceMutant, tree: Path) -> SourceMutant:
    """``m`` with its path resolved in ``tree``: the first candidate package whose file of
    that name holds the snippet exactly once (else the first candidate's file)."""
    name = m.path.split("/", 1)[1]
    candidates = CANDIDATES[m.package]
    for package in candidates:
        source = tree / package / name
        if source.is_file() and source.read_text(encoding="utf-8").count(m.old) == 1:
            return attrs.evolve(m, path=f"{package}/{name}")
    return attrs.evolve(m, path=f"{candidates[0]}/{name}")


def mutant(id: str, path: str, old: str, new: str, description: str,
           equivalent: str | None = None, package: str = "engine") -> SourceMutant:
    """A mutant of ``<package>/<path>``: ``old`` (occurring exactly once) -> ``new``."""
    unresolved = SourceMutant(id, f"{CANDIDATES[package][0]}/{path}", old, new, description,
                              equivalent, package)
    return locate(unresolved, ROOT)
