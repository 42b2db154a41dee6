"""Drift: regenerating every vector in memory reproduces spec/vectors/ byte for byte.

A change to the core, the scenarios or the generator that changes any expectation shows
up here, and is resolved deliberately with `affinity vectors generate` (and a review of
the diff), never silently.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from affinity_conformance.generate import build_vectors, verify_tree, write_tree
from affinity_conformance.vector_format import MANIFEST_NAME, load_manifest

ROOT = Path(__file__).resolve().parents[2] / "spec" / "vectors"


@pytest.fixture(scope="module")
def regenerated() -> dict[str, dict[str, Any]]:
    return build_vectors()


def test_committed_vectors_equal_a_fresh_generation(
        regenerated: dict[str, dict[str, Any]]) -> None:
    problems = verify_tree(ROOT, regenerated)
    assert not problems, "run `affinity vectors generate` and review the diff:\n" + "\n".join(
        problems[:30])


def test_generation_is_deterministic(regenerated: dict[str, dict[str, Any]]) -> None:
    assert build_vectors() == regenerated


def test_manifest_lists_every_file_with_its_digest(
        regenerated: dict[str, dict[str, Any]]) -> None:
    manifest = load_manifest(ROOT)
    assert set(manifest["files"]) == set(regenerated)
    assert manifest["cases"] == len(regenerated) >= 150
    assert sum(manifest["suites"].values()) == len(regenerated)


def test_drift_is_detected(tmp_path: Path, regenerated: dict[str, dict[str, Any]]) -> None:
    """The check can fail: an edited, a deleted and an extra file are each reported."""
    tree = tmp_path / "vectors"
    write_tree(tree, regenerated)
    assert verify_tree(tree, regenerated) == []
    edited = tree / "margin" / "boundary_is_inclusive.json"
    edited.write_text(edited.read_text().replace('"server_id":"s1"', '"server_id":"s2"', 1))
    (tree / "legacy" / "first_tie_avalanche.json").unlink()
    shutil.copy(tree / "legacy" / "single_server_takes_everything.json",
                tree / "legacy" / "zz_extra.json")
    problems = "\n".join(verify_tree(tree, regenerated))
    assert "drift: margin/boundary_is_inclusive.json" in problems
    assert "missing: legacy/first_tie_avalanche.json" in problems
    assert "stale: legacy/zz_extra.json" in problems
    (tree / MANIFEST_NAME).unlink()
    assert f"missing: {MANIFEST_NAME}" in verify_tree(tree, regenerated)
