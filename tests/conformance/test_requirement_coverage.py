"""Every requirement of spec/SPEC.md is backed by a conformance vector or a proof.

tests/test_spec_coverage.py accepts a citation anywhere (tests included). This check is
stricter and narrower: unit tests do not count, because another team cannot run them
against its implementation; only the portable evidence does -- a vector in
spec/vectors/ (its ``requirements`` list) or an artefact of the proof suite under
proofs/ (code, obligation tables, counterexample traces; test files excluded).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from affinity_conformance.vector_format import vector_files

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec" / "SPEC.md"
WORKING_LIST = ROOT / "docs" / "requirement-ids.md"
VECTORS = ROOT / "spec" / "vectors"
PROOFS = ROOT / "proofs"

REQUIREMENT_ID = re.compile(r"\bR-[A-Z]+-[0-9]+\b")
DEFINITION = re.compile(r"^[ \t]*[-*][ \t]+\*\*(R-[A-Z]+-[0-9]+)\*\*", re.MULTILINE)
LISTED = re.compile(r"^- (R-[A-Z]+-[0-9]+)\b", re.MULTILINE)
PROOF_SUFFIXES = (".py", ".md", ".json", ".txt", ".smt2")

# Ids that no event sequence can observe, so no vector can check them. Each names the unit
# test that does, and why; the list must stay tiny (see the test below).
UNOBSERVABLE: dict[str, tuple[str, str]] = {
    "R-LRU-1": ("tests/core/test_lru.py",
                "a membership test is always followed by a refreshing lookup (SPEC section "
                "10, step 2), so whether membership refreshes cannot change any outcome or "
                "state; the rule constrains the primitive and needs a proof citation"),
    "R-LOG-1": ("tests/conformance/test_replay_cli.py",
                "the decision-log format is a file format written by the adapters, not a "
                "routing behaviour: a vector cannot express it; affinity replay's tests "
                "check good, rotated, tampered and truncated logs"),
    "R-LOG-2": ("tests/runtime/test_decision_log_writer.py",
                "one writer per decision log is a property of the adapters' file handling "
                "(an OS lock, write errors, a log deleted underneath), not of routing: no "
                "event sequence can express it; the writer's tests run two writers, a full "
                "device and a deleted file, each with a negative control"),
    "R-LOG-3": ("tests/vllm/test_warm_restart.py",
                "warm restart is a property of an adapter restarting on its own log file, "
                "not of routing: no event sequence can express it; the router is killed "
                "under load and restarted (with a cold-start negative control), and replay's "
                "tests check warm and cold restart headers"),
}


def defined_ids() -> list[str]:
    """Ids defined in SPEC.md (or, before it exists, listed in the working list)."""
    if SPEC.is_file():
        return sorted(set(DEFINITION.findall(SPEC.read_text(encoding="utf-8"))))
    return sorted(set(LISTED.findall(WORKING_LIST.read_text(encoding="utf-8"))))


def vector_ids(root: Path = VECTORS) -> dict[str, list[str]]:
    cited: dict[str, list[str]] = {}
    for path in vector_files(root):
        for rid in json.loads(path.read_text(encoding="utf-8")).get("requirements", []):
            cited.setdefault(rid, []).append(str(path.relative_to(root)))
    return cited


def _is_test(path: Path) -> bool:
    return any(p == "tests" or p.startswith("test_") or p == "conftest.py" for p in path.parts)


def proof_ids(root: Path = PROOFS) -> dict[str, list[str]]:
    cited: dict[str, list[str]] = {}
    if not root.is_dir():
        return cited
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or path.suffix not in PROOF_SUFFIXES or _is_test(rel):
            continue
        for rid in set(REQUIREMENT_ID.findall(path.read_text(encoding="utf-8", errors="replace"))):
            cited.setdefault(rid, []).append(str(rel))
    return cited


def uncovered(defined: Iterable[str], *sources: dict[str, list[str]]) -> list[str]:
    return [rid for rid in defined if not any(rid in s for s in sources)]


def test_every_requirement_has_a_vector_or_a_proof() -> None:
    ids = defined_ids()
    assert len(ids) >= 50, "the id anchors were not found; has the spec format changed?"
    missing = [rid for rid in uncovered(ids, vector_ids(), proof_ids())
               if rid not in UNOBSERVABLE]
    assert not missing, (
        f"{len(missing)} requirement ids have neither a vector (spec/vectors/*/*.json "
        f"'requirements') nor a proof citation (proofs/, tests excluded): {missing}")


def test_unobservable_exemptions_are_few_and_backed() -> None:
    """An exemption names a defined id, the test file that checks it, and a reason."""
    assert len(UNOBSERVABLE) <= 4  # the three decision-log rules and R-LRU-1
    defined = set(defined_ids())
    for rid, (test_file, reason) in UNOBSERVABLE.items():
        assert rid in defined and len(reason) > 40
        assert rid in (ROOT / test_file).read_text(encoding="utf-8"), (rid, test_file)
        assert rid not in vector_ids(), f"{rid} now has a vector: drop the exemption"


def test_vectors_cite_only_defined_ids() -> None:
    defined = set(defined_ids())
    unknown = {rid: files[:3] for rid, files in vector_ids().items() if rid not in defined}
    assert not unknown, f"vectors cite ids the spec does not define: {unknown}"


def test_most_requirements_are_checked_by_vectors() -> None:
    """Vectors, not proofs, carry the behavioural requirements: at least 90% of them."""
    ids = defined_ids()
    by_vector = [rid for rid in ids if rid in vector_ids()]
    assert len(by_vector) >= 0.9 * len(ids), sorted(set(ids) - set(by_vector))


def test_coverage_check_can_fail(tmp_path: Path) -> None:
    """An id cited only by a test file does not count; one cited by a proof does."""
    fake = ["R-" + "ZZZ" + f"-{n}" for n in (1, 2, 3)]  # spelled so no scanner sees an id
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(f"# {fake[0]}\n")
    (tmp_path / "test_y.py").write_text(f"# {fake[1]}\n")
    (tmp_path / "model.py").write_text(f'"""{fake[2]} is proved here."""\n')
    proofs = proof_ids(tmp_path)
    assert set(proofs) == {fake[2]}
    assert uncovered(fake, proofs, {}) == fake[:2]
