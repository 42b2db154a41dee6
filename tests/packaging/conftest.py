"""Shared by the packaging tests that build the distributions: a copy of the checkout's
files as a clean clone would have them, so a build never writes into the work tree."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SKIP = (".venv", ".git", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache",
         ".pytest_cache", ".hypothesis")


def source_files() -> list[str]:
    """The checkout's files as a clean clone would have them (untracked new files too)."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, text=True)
        if out.returncode == 0:
            return sorted({p for p in out.stdout.split("\0") if p})
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                  if not p.is_dir() and not any(part.startswith(_SKIP)
                                                for part in p.relative_to(ROOT).parts))


@pytest.fixture(scope="session")
def copy_source() -> Callable[[Path], Path]:
    """``copy_source(dest)`` copies the checkout's files (links kept) to ``dest``."""

    def copy(dest: Path) -> Path:
        for rel in source_files():
            origin, target = ROOT / rel, dest / rel
            if not os.path.lexists(origin):
                continue  # deleted in the work tree
            target.parent.mkdir(parents=True, exist_ok=True)
            if origin.is_symlink():
                target.symlink_to(os.readlink(origin))
            elif origin.is_file():
                shutil.copy2(origin, target)
        return dest

    return copy
