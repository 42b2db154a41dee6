"""Every mutant of the independent audit catalogue applies to the current source.

The audit (tools/mutation_audit) takes hours and refuses to start while any snippet fails
to apply, so a mutant whose target text moved or was rewritten would surface only then.
This checks each one without running verify and without writing: its file exists, its
snippet occurs exactly once, its edit changes the text and the mutated module parses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.mutation_audit.catalogue import CATALOGUE
from tools.mutation_audit.run import apply, check
from tools.mutation_audit.source_mutant import PACKAGES, ROOT, SourceMutant, mutant


def test_every_catalogued_mutant_applies() -> None:
    assert len(CATALOGUE) >= 180  # the catalogue was found, not an empty tuple
    assert check(ROOT, list(CATALOGUE)) == []


def test_ids_are_unique_and_paths_are_in_the_mutated_packages() -> None:
    ids = [m.id for m in CATALOGUE]
    assert len(set(ids)) == len(ids)
    assert {m.path.split("/")[0] for m in CATALOGUE} <= set(PACKAGES)


def test_checker_artefacts_resolve_to_the_conformance_package() -> None:
    """invariants.py and legacy.py live with the checkers, not in the engine."""
    paths = {m.path for m in CATALOGUE}
    assert "affinity_conformance/invariants.py" in paths
    assert "affinity_conformance/legacy.py" in paths
    assert not any(p.startswith("affinity_engine/") and p.endswith(("/invariants.py",
                                                                   "/legacy.py"))
                   for p in paths)


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("this text is in no file of the core", "x", "snippet occurs 0 times"),
    ("return", "return", "snippet occurs"),  # ambiguous: many returns in policy.py
    ("def keep_band(", "def keep_band(", "unchanged"),
    ("def keep_band(", "def keep_band((", "no longer parses"),
])
def test_negative_control_check_reports_a_broken_mutant(old: str, new: str,
                                                        expected: str) -> None:
    broken = mutant("control", "policy.py", old, new, "a control")
    problems = check(ROOT, [broken])
    assert len(problems) == 1 and expected in problems[0], problems


def test_negative_control_a_missing_file_is_reported() -> None:
    ghost = SourceMutant("ghost", "affinity_engine/no_such_module.py", "a", "b", "a control")
    assert check(ROOT, [ghost]) == ["ghost: no file affinity_engine/no_such_module.py"]


def test_apply_rewrites_only_a_copy(tmp_path: Path) -> None:
    m = CATALOGUE[0]
    copy = tmp_path / m.path
    copy.parent.mkdir(parents=True)
    original = (ROOT / m.path).read_text(encoding="utf-8")
    copy.write_text(original, encoding="utf-8")
    assert apply(tmp_path, m) == original
    assert copy.read_text(encoding="utf-8") == original.replace(m.old, m.new)
    assert (ROOT / m.path).read_text(encoding="utf-8") == original
    with pytest.raises(ValueError, match="snippet occurs 0 times"):
        apply(tmp_path, m)  # already applied: the snippet is gone
