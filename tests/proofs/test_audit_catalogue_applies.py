"""Every mutant of the independent audit catalogues applies to the current source.

The audit (tools/mutation_audit) takes hours and refuses to start while any snippet fails
to apply, so a mutant whose target text moved or was rewritten would surface only then.
This checks each one of both catalogues -- the engine's and the reference's
(``affinity_core``) -- without running verify and without writing: its file exists, its
snippet occurs exactly once, its edit changes the text and the mutated module parses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.mutation_audit.catalogue import CATALOGUE
from tools.mutation_audit.catalogue_core import CORE_CATALOGUE
from tools.mutation_audit.run import apply, check, selected
from tools.mutation_audit.source_mutant import PACKAGES, ROOT, SourceMutant, locate, mutant


def test_every_catalogued_mutant_applies() -> None:
    assert len(CATALOGUE) >= 180  # the catalogues were found, not empty tuples
    assert len(CORE_CATALOGUE) >= 80
    assert check(ROOT, selected("all")) == []


def test_ids_are_unique_and_paths_are_in_the_mutated_packages() -> None:
    ids = [m.id for m in selected("all")]
    assert len(set(ids)) == len(ids)
    assert {m.path.split("/")[0] for m in CATALOGUE} <= set(PACKAGES)
    assert {m.package for m in CATALOGUE} == {"engine"}


def test_the_core_catalogue_edits_only_the_reference() -> None:
    """Each core mutant is a bug of affinity_core, whatever the engine's files hold."""
    assert {m.package for m in CORE_CATALOGUE} == {"core"}
    assert all(m.path.startswith("affinity_core/") for m in CORE_CATALOGUE)
    modules = {m.path.removeprefix("affinity_core/") for m in CORE_CATALOGUE}
    assert {"config.py", "events.py", "outcomes.py", "hashing.py", "sticky.py", "state.py",
            "leases.py", "status.py", "policy.py", "machine.py", "allowed.py",
            "codec.py"} <= modules


def test_the_core_catalogue_repeats_no_engine_entry() -> None:
    """Written apart: no core mutant is an engine mutant's edit of the same file."""
    engine = {(m.path, m.old, m.new) for m in CATALOGUE}
    assert [m.id for m in CORE_CATALOGUE if (m.path, m.old, m.new) in engine] == []


def test_locate_resolves_in_the_tree_it_is_given(tmp_path: Path) -> None:
    """The runner mutates an archived commit: a snippet is looked up there, not in the
    work tree."""
    (tmp_path / "affinity_engine").mkdir()
    (tmp_path / "affinity_core").mkdir()
    (tmp_path / "affinity_engine" / "m.py").write_text("a = 1\n", encoding="utf-8")
    (tmp_path / "affinity_core" / "m.py").write_text("b = 2\n", encoding="utf-8")
    engine = SourceMutant("e", "affinity_engine/m.py", "b = 2", "b = 3", "a control")
    assert locate(engine, tmp_path).path == "affinity_core/m.py"
    core = SourceMutant("c", "affinity_core/m.py", "a = 1", "a = 3", "a control", None, "core")
    assert locate(core, tmp_path).path == "affinity_core/m.py"  # never the engine's file
    assert check(tmp_path, [locate(core, tmp_path)]) == [
        "c: snippet occurs 0 times in affinity_core/m.py, expected exactly once"]


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
