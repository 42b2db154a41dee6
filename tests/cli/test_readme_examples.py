"""README.md's sample output of ``affinity check`` against verl 0.9.1 is the real output.

The excerpt had drifted when vectors were added (it still showed margin 0/0/68,
full_determinism 9/0/12 and strict-config 4/6/20 where the command prints 0/0/108,
9/0/14 and 4/6/32). Each shown line must be a line of the output, in the same order; a
line with ``...`` in it stands for a line that starts with the text before the ``...``;
a line that is only ``...`` stands for any number of lines; the verdict line's time
``(in 1.0s)`` is left out.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from affinity_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "affinity check verl.workers.rollout.router:GlobalRequestLoadBalancer"


def readme_excerpt() -> tuple[list[str], list[str]]:
    """The command's arguments and the output lines README.md shows for it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^\$ (" + re.escape(COMMAND) + r".*?)\n(.*?)^```", text, re.M | re.S)
    assert block, "README.md no longer shows " + COMMAND
    argv = block.group(1).split("#")[0].split()[1:]
    return argv, [line.rstrip() for line in block.group(2).splitlines() if line.strip()]


def matches(shown: str, real: str) -> bool:
    if "..." in shown:
        return real.startswith(shown.split("...")[0].rstrip())
    # the verdict line ends with the run's time, which the README leaves out
    return real == shown or re.fullmatch(re.escape(shown) + r" \(in [\d.]+s\)", real) is not None


def test_readme_check_excerpt_is_the_real_output(tmp_path: Path) -> None:
    argv, shown = readme_excerpt()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--out", str(tmp_path)])
    assert code == 0
    real = [line.rstrip() for line in out.getvalue().splitlines() if line.strip()]
    at = 0
    for line in shown:
        if line.strip() == "...":
            continue
        while at < len(real) and not matches(line, real[at]):
            at += 1  # lines the excerpt leaves out
        assert at < len(real), f"README line not in the output (in order): {line!r}\n" + \
            "\n".join(real)
        at += 1
