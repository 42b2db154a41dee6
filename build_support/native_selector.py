"""Selector of the compiled affinity_engine, installed as ``affinity_engine/_native/__init__.py``.

Theory of operation
-------------------
``build_support/native_build.py`` compiles the hot modules of ``affinity_engine`` with mypyc
and installs them, with this file and ``manifest.json``, in the subpackage
``affinity_engine/_native``. The pure sources stay where they are. ``affinity_engine._build``
imports this module first and calls :func:`activate`, which:

* reads ``AFFINITY_BUILD`` (``auto`` -- the default --, ``compiled`` or ``pure``);
* for ``pure``: changes nothing, so every module is the source;
* otherwise compares the SHA-256 of every source module named in the manifest with the
  digest it was compiled from. Any difference means the compiled module is not the
  source: ``auto`` falls back to the source, ``compiled`` raises ImportError naming the
  modules. When all agree, this directory goes in front of the package ``__path__``,
  so ``import affinity_engine.machine`` finds the compiled module.

The compiled build can therefore never silently run code other than the source next to
it. The proofs need the source itself (monkeypatches and CrossHair do not reach into
compiled code): ``affinity verify`` runs with ``AFFINITY_BUILD=pure``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["CHOICES", "MANIFEST", "STATUS", "activate", "stale_modules"]

CHOICES = ("auto", "compiled", "pure")
_HERE = Path(__file__).resolve().parent
MANIFEST: dict[str, object] = json.loads((_HERE / "manifest.json").read_text(encoding="utf-8"))
STATUS = "not selected yet"


def stale_modules(source_dir: Path) -> list[str]:
    """Modules whose source differs from the one they were compiled from."""
    sources = MANIFEST["sources"]
    assert isinstance(sources, dict)
    stale = []
    for name, digest in sorted(sources.items()):
        try:
            actual = hashlib.sha256((source_dir / f"{name}.py").read_bytes()).hexdigest()
        except OSError:
            actual = ""
        if actual != digest:
            stale.append(name)
    return stale


def activate(package_path: list[str]) -> str:
    """Put the compiled modules in front of the sources when wanted and current."""
    global STATUS
    choice = os.environ.get("AFFINITY_BUILD", "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ImportError(
            f"AFFINITY_BUILD must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "pure":
        STATUS = "pure (compiled build present, AFFINITY_BUILD=pure)"
        return "pure"
    stale = stale_modules(_HERE.parent)
    if stale:
        message = (f"the compiled build is stale: {', '.join(stale)} changed after it was "
                   "compiled")
        if choice == "compiled":
            raise ImportError(f"{message}; rebuild it or set AFFINITY_BUILD=pure")
        STATUS = f"pure ({message})"
        return "pure"
    if str(_HERE) not in package_path:
        package_path.insert(0, str(_HERE))
    STATUS = f"compiled (mypyc {MANIFEST['mypy']}, {len(MANIFEST['sources'])} modules)"  # type: ignore[arg-type]
    return "compiled"
