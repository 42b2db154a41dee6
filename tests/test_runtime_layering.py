"""Runtime code never imports test or conformance tooling.

The adapters (``affinity_verl``, ``affinity_vllm``), the runtime helpers
(``affinity_runtime``) and the pure core run in production; ``affinity_conformance``,
``tests`` and the test frameworks check them. An import in the wrong direction drags the
checker into the router (and makes the checker's bugs the router's); the decision-log
writer was one such import until it moved to ``affinity_runtime``. Checked by parsing
every module's imports, including ones inside functions; the ``testing`` subpackages of
the adapters are tooling and exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_PACKAGES = ("affinity_engine", "affinity_runtime", "adapters/affinity_verl",
                    "adapters/affinity_vllm")
EXEMPT_PARTS = ("testing",)  # affinity_verl.testing: drivers and replay helpers for tests
FORBIDDEN = ("affinity_conformance", "tests", "pytest", "hypothesis", "_pytest")


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
