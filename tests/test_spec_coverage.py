"""Requirement traceability between spec/SPEC.md and the checks that cite it.

Theory of operation
-------------------
spec/SPEC.md defines each requirement id once, as a bold anchor at the start of a list
item (``- **R-LRU-1** A membership test ...``). Tests, proofs and conformance vectors cite
an id by writing it literally: in a docstring, a comment, or a vector's ``requirements``
list. Ranges such as ``R-ACQ-1..8`` cite only their first id; write each id out.

This module checks the two directions of that link:

* every id defined in the spec is cited by at least one test, proof or vector (a
  requirement nobody checks is a wish, not a requirement);
* every id cited anywhere is defined in the spec (catches typos such as ``R-LRU-9`` and
  ids left behind after the spec renumbered).

It also keeps docs/requirement-ids.md, the short working list, in step with the spec.

The id grammar and the file discovery live in :class:`Traceability`, so other checks (a
report command, a vector linter) can reuse them without a separate package.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# An id is R-<AREA>-<N>: upper-case area letters, a positive decimal number. The word
# boundaries keep R-LRU-1 from matching inside R-LRU-10 or PR-LRU-1.
REQUIREMENT_ID = re.compile(r"\bR-[A-Z]+-[0-9]+\b")
# A definition: a list item whose text starts with the bold id.
DEFINITION = re.compile(r"^[ \t]*[-*][ \t]+\*\*(R-[A-Z]+-[0-9]+)\*\*", re.MULTILINE)
# Any bold id, wherever it stands (to catch anchors that are not at a list item's start).
BOLD_ID = re.compile(r"\*\*(R-[A-Z]+-[0-9]+)\*\*")

# (directory relative to the repository root, glob of files that may cite ids)
CITATION_SOURCES: tuple[tuple[str, str], ...] = (
    ("tests", "*.py"),
    ("proofs", "*.py"),
    ("spec/vectors", "*.json"),
)

# A spec this size defines many dozens of ids; far fewer means the anchor regex broke.
MIN_DEFINED_IDS = 50


@dataclass(frozen=True)
class Traceability:
    """Where ids are defined and where they are cited, for one repository checkout."""

    root: Path = ROOT

    @property
    def spec_path(self) -> Path:
        return self.root / "spec" / "SPEC.md"

    @property
    def working_list_path(self) -> Path:
        return self.root / "docs" / "requirement-ids.md"

    def spec_text(self) -> str:
        return self.spec_path.read_text(encoding="utf-8")

    def definitions(self) -> list[str]:
        """Ids defined in SPEC.md, in document order, duplicates kept."""
        return DEFINITION.findall(self.spec_text())

    def citation_files(self) -> list[Path]:
        """Files that may cite ids; this module (which names ids as examples) excluded."""
        this_file = Path(__file__).resolve()
        found: list[Path] = []
        for directory, pattern in CITATION_SOURCES:
            base = self.root / directory
            if not base.is_dir():  # proofs/ and spec/vectors/ may not exist yet
                continue
            for path in sorted(base.rglob(pattern)):
                resolved = path.resolve()
                if resolved != this_file and resolved != self.spec_path.resolve():
                    found.append(path)
        return found

    def citations(self) -> dict[str, list[Path]]:
        """Every id cited in the citation files -> the files citing it."""
        cited: dict[str, list[Path]] = {}
        for path in self.citation_files():
            text = path.read_text(encoding="utf-8", errors="replace")
            for rid in sorted(set(REQUIREMENT_ID.findall(text))):
                cited.setdefault(rid, []).append(path)
        return cited


def sort_ids(ids: Iterable[str]) -> list[str]:
    """Sort by area, then numerically (R-ACQ-2 before R-ACQ-10)."""

    def key(rid: str) -> tuple[str, int]:
        _, area, number = rid.split("-")
        return area, int(number)

    return sorted(ids, key=key)


def duplicates(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    repeated: set[str] = set()
    for item in items:
        (repeated if item in seen else seen).add(item)
    return sort_ids(repeated)


def _relative(paths: Iterable[Path]) -> Iterator[str]:
    for path in paths:
        yield str(path.relative_to(ROOT))


TRACE = Traceability()


def test_spec_defines_enough_unique_ids() -> None:
    defined = TRACE.definitions()
    assert len(defined) >= MIN_DEFINED_IDS, (
        f"spec/SPEC.md defines only {len(defined)} requirement ids (expected >= "
        f"{MIN_DEFINED_IDS}); are the anchors still written as '- **R-AREA-N** ...'?"
    )
    assert duplicates(defined) == [], f"ids defined more than once: {duplicates(defined)}"


def test_every_bold_id_in_the_spec_is_a_definition() -> None:
    """A bold id that is not at a list item's start would be silently ignored."""
    text = TRACE.spec_text()
    stray = Counter(BOLD_ID.findall(text)) - Counter(DEFINITION.findall(text))
    assert not stray, f"bold ids outside a definition anchor: {sort_ids(stray)}"


def test_every_id_the_spec_mentions_is_defined() -> None:
    """Cross-references inside SPEC.md point at ids SPEC.md defines."""
    defined = set(TRACE.definitions())
    undefined = set(REQUIREMENT_ID.findall(TRACE.spec_text())) - defined
    assert not undefined, f"spec/SPEC.md refers to undefined ids: {sort_ids(undefined)}"


def test_every_defined_id_is_cited() -> None:
    """Each requirement is checked by at least one test, proof or vector."""
    cited = TRACE.citations()
    uncited = [rid for rid in sort_ids(set(TRACE.definitions())) if rid not in cited]
    searched = ", ".join(f"{d}/**/{g}" for d, g in CITATION_SOURCES)
    assert not uncited, (
        f"{len(uncited)} requirement ids defined in spec/SPEC.md are cited nowhere in "
        f"{searched}:\n  " + "\n  ".join(uncited)
    )


def test_every_cited_id_is_defined() -> None:
    """A citation of an id the spec does not define is a typo or a stale reference."""
    defined = set(TRACE.definitions())
    unknown = {rid: paths for rid, paths in TRACE.citations().items() if rid not in defined}
    lines = [f"{rid}: {', '.join(_relative(unknown[rid]))}" for rid in sort_ids(unknown)]
    assert not unknown, "cited ids not defined in spec/SPEC.md:\n  " + "\n  ".join(lines)


def test_working_list_matches_the_spec() -> None:
    """docs/requirement-ids.md lists exactly the ids SPEC.md defines."""
    listed = re.findall(r"^- (R-[A-Z]+-[0-9]+)\b", TRACE.working_list_path.read_text(
        encoding="utf-8"), re.MULTILINE)
    defined = set(TRACE.definitions())
    missing = sort_ids(defined - set(listed))
    extra = sort_ids(set(listed) - defined)
    assert not missing and not extra and not duplicates(listed), (
        f"docs/requirement-ids.md is out of step with spec/SPEC.md: missing {missing}, "
        f"not in the spec {extra}, listed twice {duplicates(listed)}"
    )


def test_id_grammar_and_discovery_can_fail() -> None:
    """The regexes reject near misses, so the checks above are not vacuous."""
    assert REQUIREMENT_ID.findall("R-LRU-1, R-LRU-10; PR-LRU-2 R-lru-3 R-LRU-x") == [
        "R-LRU-1", "R-LRU-10"]
    sample = "- **R-ACQ-1** rule\ntext **R-ACQ-2** inline\n  * **R-ACQ-3** nested\n"
    assert DEFINITION.findall(sample) == ["R-ACQ-1", "R-ACQ-3"]
    assert duplicates(["R-A-1", "R-A-2", "R-A-1"]) == ["R-A-1"]
    assert sort_ids(["R-ACQ-10", "R-ACQ-2", "R-CFG-1"]) == ["R-ACQ-2", "R-ACQ-10", "R-CFG-1"]
    assert Path(__file__).resolve() not in {p.resolve() for p in TRACE.citation_files()}
