"""Static purity of affinity_engine (R-PURE-1) and its documentation conventions.

Theory of operation
-------------------
Every module of the package is parsed with :mod:`ast` (never imported for this check),
and the tree is searched for what a pure, deterministic core must not contain:

* imports of I/O, clock, randomness, logging or concurrency modules, in any form
  (``import x``, ``import x.y``, ``from x import y``, ``from x.y import z``);
* calls to the builtins ``hash`` (salted per process), ``open``, ``print`` and ``input``;
* float literals, since no routing decision may depend on binary floating point.

Each offence is reported with its file and line. The same walk checks the conventions:
a module docstring with a "Theory of operation" section (except ``__init__``), an
``__all__`` in every public module, and the ``py.typed`` marker.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import affinity_engine

PACKAGE = Path(affinity_engine.__file__).parent
MODULES = sorted(PACKAGE.glob("*.py"))
FORBIDDEN_MODULES = frozenset({
    "random", "time", "datetime", "os", "socket", "logging", "io", "pathlib", "subprocess",
    "threading", "asyncio",
})
FORBIDDEN_CALLS = frozenset({"hash", "open", "print", "input"})


def offences(source: str) -> list[str]:
    """What in ``source`` breaks R-PURE-1, as ``line: description`` strings."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        imported: list[str] = []
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported = [node.module]
        for name in imported:
            if name.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{line}: imports {name}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in FORBIDDEN_CALLS):
            found.append(f"{line}: calls builtin {node.func.id}()")
        if isinstance(node, ast.Constant) and isinstance(node.value, float):
            found.append(f"{line}: float literal {node.value!r}")
    return found


def test_the_package_has_modules() -> None:
    """The walk below must see the real package, not an empty directory."""
    names = {m.stem for m in MODULES}
    assert {"__init__", "machine", "policy", "config", "state"} <= names


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_module_is_pure(module: Path) -> None:
    """R-PURE-1: no I/O, clock, randomness, builtin hash(), floats or logging."""
    assert offences(module.read_text(encoding="utf-8")) == [], module.name


@pytest.mark.parametrize(("snippet", "offence"), [
    ("import random", "imports random"),
    ("import os.path", "imports os.path"),
    ("from time import monotonic", "imports time"),
    ("from logging.handlers import X", "imports logging.handlers"),
    ("import asyncio as aio", "imports asyncio"),
    ("x = hash('a')", "calls builtin hash()"),
    ("print(1)", "calls builtin print()"),
    ("with open('f') as f: pass", "calls builtin open()"),
    ("x = 1.5", "float literal 1.5"),
    ("x = 1e3", "float literal 1000.0"),
])
def test_checker_catches_each_offence(snippet: str, offence: str) -> None:
    """The checker itself can fail: each forbidden form is reported."""
    assert offences(snippet) == [f"1: {offence}"]


def test_checker_allows_what_the_core_needs() -> None:
    """Relative imports, zlib, fractions, methods named hash and int constants pass."""
    clean = ("from .hashing import stable_hash\nimport zlib\nfrom fractions import Fraction\n"
             "x = obj.hash(1) + 3\ny = Fraction(3, 2)\nfrom .time import z\n")
    assert offences(clean) == []


@pytest.mark.parametrize("module", [m for m in MODULES if m.stem != "__init__"],
                         ids=lambda p: p.stem)
def test_module_docstring_has_theory_of_operation(module: Path) -> None:
    """Project convention: each logic module explains itself in a header docstring."""
    docstring = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8")))
    assert docstring is not None and "Theory of operation" in docstring, module.name


@pytest.mark.parametrize("module", [m for m in MODULES if not m.stem.startswith("_")
                                    or m.stem == "__init__"], ids=lambda p: p.stem)
def test_public_module_defines_all(module: Path) -> None:
    """Project convention: every public module declares its exports."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    names = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(t, ast.Name)}
    assert "__all__" in names, module.name


def test_py_typed_marker_exists() -> None:
    """PEP 561: the package ships its inline types."""
    assert (PACKAGE / "py.typed").is_file()
