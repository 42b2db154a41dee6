"""Runtime code never imports test or conformance tooling.

The adapters (``affinity_verl``, ``affinity_vllm``), the runtime helpers
(``affinity_runtime``) and the pure core run in production; ``affinity_conformance``,
``tests`` and the test frameworks check them. An import in the wrong direction drags the
checker into the router (and makes the checker's bugs the router's); the decision-log
writer was one such import until it moved to ``affinity_runtime``. Checked by parsing
every module's imports, including ones inside functions; the ``testing`` subpackages of
the adapters are tooling and exempt.

The checker artefacts -- the named invariant predicates and the naive legacy model -- live
in ``affinity_conformance`` and judge the engine from outside: the engine has no copy of
them, and no module of the runtime or of the adapters (their ``testing`` subpackages
included) reaches them, directly or through the conformance modules it imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_PACKAGES = ("affinity_engine", "affinity_runtime", "adapters/affinity_verl",
                    "adapters/affinity_vllm")
EXEMPT_PARTS = ("testing",)  # affinity_verl.testing: drivers and replay helpers for tests
FORBIDDEN = ("affinity_conformance", "tests", "pytest", "hypothesis", "_pytest")
CHECKER_ARTEFACTS = ("affinity_conformance.invariants", "affinity_conformance.legacy")
# Where the repository's top-level packages live (setuptools' package roots).
PACKAGE_ROOTS = (ROOT, ROOT / "adapters", ROOT / "proofs", ROOT / "sim")


def forbidden_imports(source: str) -> list[str]:
    """The modules ``source`` imports that runtime code must not."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [n for n in names if n.split(".")[0] in FORBIDDEN]
    return found


def runtime_modules() -> list[Path]:
    files = []
    for package in RUNTIME_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not any(part in EXEMPT_PARTS for part in path.relative_to(ROOT).parts):
                files.append(path)
    return files


def test_runtime_code_imports_no_test_or_conformance_tooling() -> None:
    modules = runtime_modules()
    assert len(modules) >= 30, modules  # the globs found the packages
    offenders = {str(p.relative_to(ROOT)): bad for p in modules
                 if (bad := forbidden_imports(p.read_text(encoding="utf-8")))}
    assert offenders == {}


def test_negative_control_the_scan_sees_every_import_form() -> None:
    source = ("import os\nfrom affinity_conformance.decision_log import read_log\n"
              "def f():\n    import pytest\n    from tests.vllm import fleet\n"
              "from . import sibling\nimport affinity_engine\n")
    assert forbidden_imports(source) == ["affinity_conformance.decision_log", "pytest",
                                         "tests.vllm"]


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    for base in PACKAGE_ROOTS:
        for candidate in (base.joinpath(*parts).with_suffix(".py"),
                          base.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def _module_name(path: Path) -> str:
    base = max((b for b in PACKAGE_ROOTS if path.is_relative_to(b)), key=lambda b: len(b.parts))
    rel = path.relative_to(base).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, relative imports resolved;
    ``from pkg import name`` counts ``pkg.name`` too, in case ``name`` is a module."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def reachable(start: Iterable[tuple[str, str, bool]]) -> set[str]:
    """The repository modules reachable by imports from ``(source, module, is_package)``."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        source, module, is_package = todo.pop()
        for name in imported_modules(source, module, is_package):
            parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)]
            for candidate in parents:  # importing a.b.c runs a/__init__ and a/b/__init__
                path = _module_file(candidate)
                if path is None or candidate in seen:
                    continue
                seen.add(candidate)
                todo.append((path.read_text(encoding="utf-8"), candidate,
                             path.name == "__init__.py"))
    return seen


def _sources(packages: Iterable[str]) -> list[tuple[str, str, bool]]:
    out = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            out.append((path.read_text(encoding="utf-8"), _module_name(path),
                        path.name == "__init__.py"))
    return out


def test_the_engine_holds_no_checker_artefacts() -> None:
    assert not (ROOT / "affinity_engine" / "invariants.py").exists()
    assert not (ROOT / "affinity_engine" / "legacy.py").exists()
    for name in CHECKER_ARTEFACTS:  # they moved, not vanished
        assert _module_file(name) is not None, name


def test_no_runtime_or_adapter_module_reaches_the_checker_artefacts() -> None:
    packages = [*RUNTIME_PACKAGES, "affinity_core"]  # adapters' testing included here
    sources = _sources(packages)
    assert len(sources) >= 40, len(sources)
    reached = reachable(sources)
    assert "affinity_engine.machine" in reached  # the walk follows imports at all
    assert sorted(set(CHECKER_ARTEFACTS) & reached) == []
    assert [m for _, m, _ in sources if m.endswith((".invariants", ".legacy"))] == []


def test_negative_control_the_walk_sees_artefacts_through_other_modules() -> None:
    """scenario.py imports the invariants; a module importing scenario reaches them, in
    every import form."""
    forms = ["import affinity_conformance.scenario\n",
             "from affinity_conformance import scenario\n",
             "def f():\n    from affinity_conformance.scenario import features_of\n",
             "from .. import legacy\n"]
    reached = [reachable([(form, "affinity_conformance.sub.mod", False)]) for form in forms]
    assert all("affinity_conformance.invariants" in r for r in reached[:3]), reached
    assert "affinity_conformance.legacy" in reached[3]
    assert reachable([("import affinity_engine\n", "x", False)]).isdisjoint(
        CHECKER_ARTEFACTS)
