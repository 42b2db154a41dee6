"""docs/conformance.md's "any empty folder" transcripts are real, and need no checkout.

The transcripts for verl 0.9.1's class and Affinity's verl adapter are presented as runs
from any empty folder of an environment with the wheel installed (they once passed
``--vectors spec/vectors``, which exists only in a checkout). Each command runs here,
in-process, with an empty temporary folder as the working directory; every output line
the page shows must be a line of the real output, in order (a line with ``...`` stands for
a line starting with the text before it; a verdict's time ``(in 0.9s)`` and the ``(random ties)``
note, which depends on the run's own draws, are not compared), and
``[exit N]`` must be the exit status.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from affinity_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "conformance.md"
FIRST, END = "### verl 0.9.1's real class", "### An independent implementation"


def transcripts() -> list[list[tuple[str, list[str], int]]]:
    """Per fenced block of the section: (command, shown output lines, exit status)."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index(FIRST):text.index(END)]
    blocks = []
    for block in re.findall(r"^```\n(\$ affinity .*?)^```", section, re.M | re.S):
        runs: list[tuple[str, list[str], int]] = []
        for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, *lines = chunk.rstrip("\n").split("\n")
            status = 0
            if lines and (found := re.fullmatch(r"\[exit (\d+)\]", lines[-1])):
                status, lines = int(found.group(1)), lines[:-1]
            runs.append((command, [ln.rstrip() for ln in lines if ln.strip()], status))
        blocks.append(runs)
    return blocks


TIME = re.compile(r" \(in [\d.]+s\)$")
# Whether a class whose ties are its own happened to take another allowed server in this
# run (unkeyed requests under `hashed` fall back to the adapter's unseeded draw).
RANDOM_TIES = " (random ties)"


def _stable(line: str) -> str:
    return TIME.sub("", line).replace(RANDOM_TIES, "")


def matches(shown: str, real: str) -> bool:
    if "..." in shown:
        return real.startswith(shown.split("...")[0].rstrip())
    return _stable(real) == _stable(shown)


def test_the_section_has_the_transcripts() -> None:
    commands = [command for block in transcripts() for command, _, _ in block]
    assert commands[0] == "affinity vectors export vectors"
    assert sum(c.startswith("affinity check ") for c in commands) == 3
    assert not any("spec/vectors" in c or "tests/" in c for c in commands)


@pytest.mark.verl  # the transcripts load verl 0.9.1's class
@pytest.mark.parametrize("index", range(len(transcripts())))
def test_a_transcript_runs_in_an_empty_folder(index: int, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    block = transcripts()[index]
    if not block[0][0].startswith("affinity vectors export"):
        block = [*transcripts()[0][:1], *block]  # the export the page shows first
    for command, shown, status in block:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(command.split()[1:])
        real = [line.rstrip() for line in out.getvalue().splitlines() if line.strip()]
        assert code == status, f"$ {command}: exit {code}, the page says {status}\n" + \
            "\n".join(real[-20:])
        at = 0
        for line in shown:
            if line.strip() == "...":
                continue
            while at < len(real) and not matches(line, real[at]):
                at += 1
            assert at < len(real), f"$ {command}: shown line not in the output (in order): " \
                f"{line!r}\n" + "\n".join(real)
            at += 1
