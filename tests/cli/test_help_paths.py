"""Every ``--help`` reads true from an installed wheel: a path that exists only in the
source repository (``docs/...``, ``spec/...``, ``sim/README.md``) is named as such.

The wheel ships the code, the vectors and SPEC.md but not the repository's docs, so a
help text that says "see docs/check-router.md" sends a user of the wheel to a file they
do not have. A repository path may appear only with "in a checkout" or "source
repository" next to it.
"""

from __future__ import annotations

import re

import pytest

from affinity_cli.main import SUBCOMMANDS

from .clirun import run

# A relative repository path: not part of an absolute path (the printed defaults are real
# paths of this install, so they are fine wherever they point).
REPO_PATH = re.compile(r"(?<![\w/.-])(?:docs|spec|sim|benchmarks|tests|proofs|scripts)/[\w./-]*")
QUALIFIERS = ("in a checkout", "source repository")

HELPS = [[], *([name] for name in sorted(SUBCOMMANDS)),
         ["vectors", "generate"], ["vectors", "verify"], ["vectors", "export"]]


def unqualified_paths(text: str) -> list[str]:
    """Repository paths in ``text`` with no qualifier within the same sentence."""
    flat = " ".join(text.split())
    found = []
    for match in REPO_PATH.finditer(flat):
        start = max(flat.rfind(". ", 0, match.start()), flat.rfind("(", 0, match.start()), 0)
        end = min((i for i in (flat.find(". ", match.end()), flat.find(")", match.end()))
                   if i >= 0), default=len(flat))
        if not any(q in flat[start:end] for q in QUALIFIERS):
            found.append(match.group(0).rstrip("."))
    return found


@pytest.mark.parametrize("argv", HELPS, ids=lambda a: " ".join(a) or "affinity")
def test_help_names_no_repository_only_path_unqualified(argv: list[str]) -> None:
    code, out, _ = run(*argv, "--help")
    assert code == 0
    if "unavailable here" in out:
        pytest.skip(f"affinity {' '.join(argv)}: its extra is not installed here")
    assert not unqualified_paths(out), f"affinity {' '.join(argv)} --help"


def test_the_check_finds_an_unqualified_path() -> None:
    """Negative control: the help texts as they stood would fail."""
    assert unqualified_paths("Findings for them: docs/check-router.md.") == [
        "docs/check-router.md"]
    assert unqualified_paths("the conformance vectors (spec/vectors/)") == ["spec/vectors/"]
    assert unqualified_paths("see docs/check-router.md in Affinity's source repository.") == []
    assert unqualified_paths("output directory (in a checkout: spec/vectors); kept") == []
    assert unqualified_paths("default: /opt/x/proofs/affinity_proofs/counterexamples") == []
