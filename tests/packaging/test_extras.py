"""The optional extras, read from pyproject.toml (fast; no install).

test_extras_alone.py installs each extra into a fresh venv and runs its doc; these check
what an install there cannot show quickly: that ``[verl]`` carries every third-party module
verl's router module imports, and that no extra forces a version change on an existing
verl or vLLM environment.
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from affinity_conformance.upstream import upstream_package_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
EXTRAS: dict[str, list[str]] = tomllib.loads(
    (ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
IMPORT_TO_DISTRIBUTION = {"yaml": "pyyaml"}


def _extra(name: str) -> dict[str, Requirement]:
    requirements = (Requirement(text) for text in EXTRAS[name])
    return {r.name.lower(): r for r in requirements}


def _verl_requirement(name: str) -> Requirement:
    try:
        declared = importlib.metadata.requires("verl") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("verl is not installed (scripts/test.sh installs verl==0.9.1)")
    for text in declared:
        requirement = Requirement(text)
        if requirement.name.lower() == name and requirement.marker is None:
            return requirement
    raise AssertionError(f"verl declares no {name} requirement: {declared}")


def test_verl_extra_has_every_module_verls_router_imports() -> None:
    """Without a GPU verl is installed with --no-deps, so [verl] must bring what its router
    module imports (cachetools was missing: the docs' first example failed)."""
    router = upstream_package_dir() / "workers" / "rollout" / "router.py"
    tree = ast.parse(router.read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    third_party = {IMPORT_TO_DISTRIBUTION.get(m, m) for m in imported
                   if m not in sys.stdlib_module_names and m != "verl"}
    assert {"cachetools", "omegaconf", "ray"} <= third_party  # the parse found them
    missing = sorted(third_party - set(_extra("verl")))
    assert not missing, f"[verl] lacks {missing}, which verl's router module imports"


def test_verl_extra_accepts_every_ray_verl_accepts() -> None:
    """[verl] pinned ray==2.60.0, so installing it into a working verl environment changed
    its Ray; now any Ray that verl 0.9.1 itself accepts is accepted."""
    ours = _extra("verl")["ray"].specifier
    verls = _verl_requirement("ray").specifier
    probes = ["2.41.0", "2.44.1", "2.49.2", "2.55.0", "2.60.0", "2.61.0", "2.99.0"]
    assert [v for v in probes if verls.contains(v)], "no probe inside verl's own range"
    refused = [v for v in probes if verls.contains(v) and not ours.contains(v)]
    assert not refused, f"[verl] ray{ours} refuses Ray {refused}, which verl ray{verls} accepts"


@pytest.mark.parametrize("extra", ["verl", "vllm", "sim", "proofs"])
def test_no_user_extra_pins_or_caps_a_version(extra: str) -> None:
    """An exact pin or an upper bound would downgrade (or refuse) an existing environment's
    newer package; lower bounds say what the code needs."""
    for name, requirement in _extra(extra).items():
        capped = [s for s in requirement.specifier if s.operator not in (">=", ">", "!=")]
        assert not capped, f"[{extra}] {name}{requirement.specifier}: only lower bounds"
