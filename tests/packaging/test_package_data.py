"""Package data comes from the canonical trees (fast; no build).

``spec/vectors/`` and ``proofs/counterexamples/`` are linked into the packages that read
them (affinity_conformance/shipped.py); these tests fail if a link stops pointing at its
canonical tree, if a file of the tree is not matched by the package-data globs in
pyproject.toml (so a wheel would silently lack it), or if the CLI reads another copy.
"""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

import pytest

from affinity_conformance.check import DEFAULT_VECTORS
from affinity_conformance.shipped import shipped_counterexamples, shipped_vectors

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
LINKS = {  # link inside a package -> canonical tree
    ROOT / "affinity_conformance" / "vectors": ROOT / "spec" / "vectors",
    ROOT / "proofs" / "affinity_proofs" / "counterexamples": ROOT / "proofs" / "counterexamples",
}
# What a non-Python consumer reads but the Python package does not need at run time.
NOT_SHIPPED = ("consumers/*",)


def test_links_point_at_the_canonical_trees() -> None:
    for link, tree in LINKS.items():
        assert link.is_symlink(), f"{link} must be a symbolic link to {tree}, not a copy"
        assert link.resolve() == tree.resolve()
    assert shipped_vectors().resolve() == (ROOT / "spec" / "vectors").resolve()
    assert shipped_counterexamples().resolve() == (ROOT / "proofs" / "counterexamples").resolve()
    assert DEFAULT_VECTORS.resolve() == (ROOT / "spec" / "vectors").resolve()


def test_the_spec_ships_with_the_vectors() -> None:
    """spec/vectors/SPEC.md links to spec/SPEC.md (one canonical copy) and is package data,
    so the wheel carries the spec that the vectors' README links to."""
    link = ROOT / "spec" / "vectors" / "SPEC.md"
    assert link.is_symlink(), f"{link} must be a symbolic link to ../SPEC.md, not a copy"
    assert link.resolve() == (ROOT / "spec" / "SPEC.md").resolve()
    assert (shipped_vectors() / "SPEC.md").read_bytes() == (ROOT / "spec" / "SPEC.md").read_bytes()
    patterns = _package_data()["affinity_conformance"]
    assert any(_glob_match("vectors/SPEC.md", pattern) for pattern in patterns)


def _package_data() -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    data: dict[str, list[str]] = config["tool"]["setuptools"]["package-data"]
    return data


@pytest.mark.parametrize(("package", "prefix", "tree"), [
    ("affinity_conformance", "vectors", ROOT / "spec" / "vectors"),
    ("affinity_proofs", "counterexamples", ROOT / "proofs" / "counterexamples"),
])
def test_package_data_globs_cover_every_file(package: str, prefix: str, tree: Path) -> None:
    patterns = _package_data()[package]
    files = [p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file()]
    assert len(files) >= 5
    uncovered = [f for f in files
                 if not any(fnmatch.fnmatch(f, n) for n in NOT_SHIPPED)
                 and not any(_glob_match(f"{prefix}/{f}", pat) for pat in patterns)]
    assert not uncovered, f"not shipped in the wheel (extend package-data): {uncovered[:5]}"


def _glob_match(path: str, pattern: str) -> bool:
    """setuptools' package-data glob: ``*`` never crosses a ``/``."""
    parts, pats = path.split("/"), pattern.split("/")
    if len(parts) != len(pats):
        return False
    return all(fnmatch.fnmatch(a, b) for a, b in zip(parts, pats, strict=True))
