"""The record of one audit mutant: an exact source edit of one file of ``affinity_engine``.

Kept apart from the catalogues so that each catalogue module (``catalogue.py``, the
third set's ``catalogue_operators.py``) can import it without importing the other.
"""

from __future__ import annotations

import attrs

__all__ = ["SourceMutant", "mutant"]


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
    """A mutant of ``affinity_engine/<path>``: ``old`` (occurring exactly once) -> ``new``."""
    return SourceMutant(id, f"affinity_engine/{path}", old, new, description, equivalent)
