"""The second-language consumer (spec/vectors/consumers/node/consumer.mjs) replays the vectors.

Written in Node with its standard library only, from the spec and the consumer contract
in spec/vectors/README.md: it must pass every vector of the features it implements, check
every digest and the manifest, and report the supported / unsupported counts that the
README states. Negative controls: a wrong keep rule (``<`` for ``<=``) fails margin
vectors, a ceiling or a missing cap in the context band fails band vectors, and an edited
or missing file is reported. Tier ``node`` (tests/conftest.py): without ``node`` it is
skipped outside CI and fails under CI unless opted out (scripts/test.sh installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "spec" / "vectors"
CONSUMER = VECTORS / "consumers" / "node" / "consumer.mjs"
NODE = shutil.which("node")

pytestmark = pytest.mark.node  # tests/conftest.py: skipped or failed without node


def _consumer(root: Path, **env: str) -> tuple[int, dict[str, Any]]:
    assert NODE is not None
    done = subprocess.run([NODE, str(CONSUMER), str(root), "--json"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})
    return done.returncode, json.loads(done.stdout)


def test_every_supported_vector_passes_and_the_readme_states_the_count() -> None:
    code, result = _consumer(VECTORS)
    manifest = json.loads((VECTORS / "MANIFEST.json").read_text(encoding="utf-8"))
    assert code == 0, result["problems"] + result["failures"][:10]
    assert result["failed"] == 0 and result["integrity_errors"] == 0
    assert result["opened"] == result["listed"] == manifest["cases"]
    assert result["passed"] + result["unsupported"] == manifest["cases"]
    assert result["passed"] >= 150  # legacy, margin, determinism, ties, ... all supported
    for suite in ("legacy", "eviction", "failover", "margin", "counterexamples"):
        assert result["suites"][suite]["passed"] == manifest["suites"][suite], suite
    readme = (VECTORS / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"passes all (\d+) cases it supports and reports the other (\d+) as "
                       r"unsupported", readme)
    assert stated, "spec/vectors/README.md must state the Node consumer's counts"
    assert (int(stated.group(1)), int(stated.group(2))) == (result["passed"],
                                                           result["unsupported"])


def test_a_wrong_keep_rule_fails_margin_vectors() -> None:
    code, result = _consumer(VECTORS, AFFINITY_CONSUMER_MUTANT="keep_strict_lt")
    assert code == 1 and result["suites"]["margin"]["failed"] >= 10
    assert result["suites"]["legacy"]["failed"] == 0  # no margin, no keep decision


def test_the_band_suite_passes_and_band_mutants_fail_it() -> None:
    """The context band (SPEC section 7.5) from a second language: every band case but the
    gate one (no dual_threshold here) and the malformed events (core_events) passes; a
    ceiling for c // T and a missing cap each fail band vectors and nothing else."""
    code, result = _consumer(VECTORS)
    assert code == 0 and result["suites"]["band"]["passed"] >= 38
    assert result["suites"]["band"]["unsupported"] == 2
    for mutant in ("band_ceil", "band_uncapped"):
        code, result = _consumer(VECTORS, AFFINITY_CONSUMER_MUTANT=mutant)
        failing = {name for name, s in result["suites"].items() if s["failed"]}
        assert code == 1 and failing == {"band"}, (mutant, failing)


def test_edited_and_missing_files_are_reported(tmp_path: Path) -> None:
    copy = tmp_path / "vectors"
    shutil.copytree(VECTORS, copy, ignore=shutil.ignore_patterns("consumers"))
    edited = copy / "margin" / "boundary_is_inclusive.json"
    edited.write_text(edited.read_text(encoding="utf-8").replace('"s0"', '"s1"', 1),
                      encoding="utf-8")
    (copy / "legacy" / "added_server_starts_at_zero.json").unlink()
    code, result = _consumer(copy)
    assert code == 1
    joined = "\n".join(result["problems"])
    assert "margin/boundary_is_inclusive.json: sha256 differs from MANIFEST.json" in joined
    assert "legacy/added_server_starts_at_zero.json: listed but missing" in joined
    assert result["opened"] == result["listed"] - 1


@pytest.mark.parametrize(("args", "needle"), [
    (["{tmp}/missing"], "missing does not exist: expected a vector directory"),
    (["{tmp}"], "has no MANIFEST.json: expected a vector directory"),
    (["{tmp}/file.json"], "file.json is not a directory"),
    (["{tmp}/garbled"], "MANIFEST.json: not valid JSON"),
    (["--jsn"], "unknown option --jsn; accepted: [VECTOR_DIR] [--json]"),
    (["{tmp}", "{tmp}"], "one VECTOR_DIR expected, got 2"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                               needle: str) -> None:
    # A wrong directory is one line and exit 2, not a Node stack trace (ENOENT) and 1.
    assert NODE is not None
    (tmp_path / "file.json").write_text("{}")
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / "MANIFEST.json").write_text('{"files": ')
    argv = [a.format(tmp=tmp_path) for a in args]
    done = subprocess.run([NODE, str(CONSUMER), *argv], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("consumer.mjs: "), done.stderr
    assert needle in lines[0]
