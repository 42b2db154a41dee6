"""Output paths checked before a command starts its work.

Theory of operation
-------------------
A command that writes a report or a directory at the end of a long run (``verify
--json``, ``simulate --png``, ``check --out``) would otherwise find out only then that the
path is a directory, sits under a file or cannot be written, and die with a traceback
after minutes of work. These checks run when the options are parsed: they look at the path
and its nearest existing ancestor and create nothing, so a bad path fails at
configuration time, changes nothing, and the message names the option, the path and
what is wrong. They cannot promise the write will succeed (a disk can fill up later);
they catch the mistakes a person makes on the command line.

:data:`output_file` and :data:`output_dir` are argparse ``type=`` functions (the error
becomes ``affinity CMD: error: argument --json: ...``, exit status 2);
:func:`file_problem` and :func:`dir_problem` return the message, or None, for a path
computed later (a default name in the working directory). :data:`existing_dir` is the
same for an input directory: one that is missing or a file would otherwise read as an
empty one.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["dir_problem", "existing_dir", "file_problem", "output_dir", "output_file"]


def _existing_ancestor(path: Path) -> Path:
    # The first ancestor that exists: where a write (or mkdir -p) would actually start.
    current = path.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def _ancestor_problem(path: Path, what: str) -> str | None:
    ancestor = _existing_ancestor(path.parent)
    if not ancestor.is_dir():
        return f"{path}: {ancestor} is a file, so {what} cannot be created under it"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{path}: directory {ancestor} is not writable"
    return None


def file_problem(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (None if nothing is evidently wrong)."""
    if path.is_dir():
        return f"{path} is a directory; expected a file name"
    if path.exists():
        return None if os.access(path, os.W_OK) else f"{path} exists and is not writable"
    if not path.parent.absolute().exists():
        return f"{path}: directory {path.parent} does not exist"
    return _ancestor_problem(path, "the file")


def dir_problem(path: Path) -> str | None:
    """Why a directory cannot be made (with parents) or written at ``path``."""
    if path.exists():
        if not path.is_dir():
            return f"{path} exists and is not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable"
    return _ancestor_problem(path, "the directory")


def _checked(problem: Callable[[Path], str | None]) -> Callable[[str], Path]:
    def parse(text: str) -> Path:
        if not text:
            raise argparse.ArgumentTypeError("expected a path, got an empty string")
        path = Path(text)
        why = problem(path)
        if why is not None:
            raise argparse.ArgumentTypeError(why)
        return path

    return parse


output_file = _checked(file_problem)
"""argparse type: a file the command will write."""

output_dir = _checked(dir_problem)
"""argparse type: a directory the command will create (with parents) and write into."""

def _input_dir_problem(path: Path) -> str | None:
    if not path.exists():
        return f"{path}: no such directory"
    return None if path.is_dir() else f"{path} is a file; expected a directory"


existing_dir = _checked(_input_dir_problem)
"""argparse type: a directory the command reads."""
