"""Static purity of the reference and the engine (R-PURE-1), and their conventions.

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

The reference, ``affinity_core``, is held to more (:func:`reference_offences`): no
module-level mutable state (a module-level name bound to a list, dict or set display or
comprehension, or to a call of ``list``/``dict``/``set``/``bytearray``/``OrderedDict``/
``defaultdict``/``deque``, and no ``global`` statement) and no ``object.__setattr__``
outside an ``__init__``: its values are frozen, and nothing changes after import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import affinity_core
import affinity_engine

REFERENCE = Path(affinity_core.__file__).parent
ENGINE = Path(affinity_engine.__file__).parent
REFERENCE_MODULES = sorted(REFERENCE.glob("*.py"))
MODULES = REFERENCE_MODULES + sorted(ENGINE.glob("*.py"))
MUTABLE_FACTORIES = frozenset({"list", "dict", "set", "bytearray", "OrderedDict",
                               "defaultdict", "deque", "Counter"})
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


def reference_offences(source: str) -> list[str]:
    """Module-level mutable state and frozen values rewritten, as ``line: description``."""
    found: list[str] = []
    tree = ast.parse(source)
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        mutable = isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp,
                                     ast.DictComp, ast.SetComp)) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in MUTABLE_FACTORIES)
        names = [t.id for t in (node.targets if isinstance(node, ast.Assign) else
                                [node.target] if isinstance(node, ast.AnnAssign) else [])
                 if isinstance(t, ast.Name)]
        if mutable and names != ["__all__"]:  # the export list is read, never written
            found.append(f"{node.lineno}: module-level mutable value")

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, ast.Global):
            found.append(f"{node.lineno}: global statement")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "__setattr__"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "object"
                and function != "__init__"):
            found.append(f"{node.lineno}: object.__setattr__ outside __init__")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def test_the_packages_have_modules() -> None:
    """The walk below must see the real packages, not empty directories."""
    for package in (REFERENCE, ENGINE):
        names = {m.stem for m in package.glob("*.py")}
        assert {"__init__", "machine", "policy", "state"} <= names, package


@pytest.mark.parametrize("module", REFERENCE_MODULES, ids=lambda p: p.stem)
def test_reference_module_has_no_mutable_state(module: Path) -> None:
    """affinity_core: no module-level mutable state, no frozen value rewritten."""
    assert reference_offences(module.read_text(encoding="utf-8")) == [], module.name


@pytest.mark.parametrize(("snippet", "offence"), [
    ("CACHE = {}", "module-level mutable value"),
    ("CACHE: dict[str, int] = {}", "module-level mutable value"),
    ("SEEN = set()", "module-level mutable value"),
    ("LOG = [x for x in y]", "module-level mutable value"),
    ("def f():\n    global N", "global statement"),
    ("def f(v):\n    object.__setattr__(v, 'a', 1)", "object.__setattr__ outside __init__"),
])
def test_reference_checker_catches_each_offence(snippet: str, offence: str) -> None:
    """The reference checker itself can fail: each forbidden form is reported."""
    assert [o.split(": ", 1)[1] for o in reference_offences(snippet)] == [offence]


def test_reference_checker_allows_frozen_tables_and_init_writes() -> None:
    clean = ("from types import MappingProxyType\nT = MappingProxyType({1: 2})\n"
             "K = (1, 2)\nclass V:\n    def __init__(self):\n"
             "        object.__setattr__(self, 'a', 1)\n")
    assert reference_offences(clean) == []


def test_the_engine_is_what_the_reference_checker_refuses() -> None:
    """A live control: the engine keeps caches, so the same checker flags it."""
    flagged = [m.name for m in sorted(ENGINE.glob("*.py"))
               if reference_offences(m.read_text(encoding="utf-8"))]
    assert "machine.py" in flagged


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


@pytest.mark.parametrize("package", [REFERENCE, ENGINE], ids=lambda p: p.name)
def test_py_typed_marker_exists(package: Path) -> None:
    """PEP 561: the package ships its inline types."""
    assert (package / "py.typed").is_file()
