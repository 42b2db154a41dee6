"""Every committed vector and the manifest validate against their JSON Schemas.

The schema is the machine-readable half of spec/vectors/README.md: a consumer in another
language can validate with it before loading. The negative cases prove the schema is not
vacuous (each mutation breaks one rule the README states).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from affinity_conformance.vector_format import vector_files

ROOT = Path(__file__).resolve().parents[2] / "spec" / "vectors"
SCHEMA = json.loads((ROOT / "schema" / "vector.schema.json").read_text(encoding="utf-8"))
MANIFEST_SCHEMA = json.loads((ROOT / "schema" / "manifest.schema.json").read_text(
    encoding="utf-8"))
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _load(rel: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / rel).read_text(encoding="utf-8"))
    return data


def test_schemas_are_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator.check_schema(MANIFEST_SCHEMA)


def test_every_vector_matches_the_schema() -> None:
    files = vector_files(ROOT)
    assert len(files) >= 150
    problems = []
    for path in files:
        for error in VALIDATOR.iter_errors(json.loads(path.read_text(encoding="utf-8"))):
            problems.append(f"{path.relative_to(ROOT)}: {list(error.absolute_path)}: "
                            f"{error.message[:200]}")
    assert not problems, "\n".join(problems[:20])


def test_manifest_matches_its_schema() -> None:
    jsonschema.validate(_load("MANIFEST.json"), MANIFEST_SCHEMA)


def _set(data: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    target: Any = out
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


_DELETE = object()


@pytest.mark.parametrize(("rel", "path", "value"), [
    ("margin/boundary_is_inclusive.json", ["format"], "affinity-vector/2"),
    ("margin/boundary_is_inclusive.json", ["steps", 0, "expect", "path"], "sticky"),
    ("margin/boundary_is_inclusive.json", ["steps", 0, "expect", "server_id"], ""),
    ("margin/boundary_is_inclusive.json", ["config", "affinity_break_margin"], -1),
    ("margin/boundary_is_inclusive.json", ["config", "tie_break"], _DELETE),
    ("margin/boundary_is_inclusive.json", ["requirements", 0], "KEEP-1"),
    ("margin/boundary_is_inclusive.json", ["_info", "sha256"], "abc"),
    ("legacy/empty_pool_then_add.json", ["steps", 0, "valid"], _DELETE),
    ("legacy/release_unknown_or_idle_is_ignored.json", ["steps", 0, "event", "op"], "free"),
    ("validation/config_cache_zero.json", ["error"], _DELETE),
    ("validation/config_cache_zero.json", ["error", "stage"], "event"),
])
def test_schema_rejects_broken_vectors(rel: str, path: list[Any], value: Any) -> None:
    original = _load(rel)
    assert VALIDATOR.is_valid(original)
    assert not VALIDATOR.is_valid(_set(original, path, value))
