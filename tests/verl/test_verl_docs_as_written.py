"""docs/verl.md's "runnable without a GPU" examples run as written, each on its own.

The other tests exec the examples inside the test process, after their own setup; this
one runs them the way a reader does -- a new ``python`` in an empty folder holding only
the documented example files (``# example-file: NAME`` blocks, such as ``router.yaml``)
-- so a setup step the docs do not show (such as loading verl's router module without
torch) makes it fail.

Every ``# example: NAME`` block runs **alone**, in its own process and folder: a reader
copies one block, not the page. (Running them concatenated in one process hid a block
that worked only because an earlier block had loaded verl's router module.) A block that
really continues another declares it on its second line, ``# continues: OTHER``, and then
runs after OTHER (and what OTHER continues) in the same process -- a declared group, as
the reader is told to run it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "verl.md"
FENCE = re.compile(r"```(\w+)\n# (example|example-file): (\S+)\n(.*?)```", re.DOTALL)
CONTINUES = re.compile(r"\A# continues: (\S+)\n")


def _blocks() -> tuple[dict[str, str], dict[str, str]]:
    """(runnable examples, example files), each by name, in page order."""
    examples: dict[str, str] = {}
    files: dict[str, str] = {}
    for _lang, kind, name, body in FENCE.findall(DOCS.read_text(encoding="utf-8")):
        (files if kind == "example-file" else examples)[name] = body
    return examples, files


EXAMPLES, FILES = _blocks()


def script_for(name: str, examples: dict[str, str]) -> str:
    """The block ``name`` preceded by the blocks it declares it continues."""
    chain: list[str] = []
    current: str | None = name
    while current is not None:
        if current in chain:
            raise AssertionError(f"docs/verl.md: '# continues:' loop at {current}")
        if current not in examples:
            raise AssertionError(f"docs/verl.md: {chain[-1]} continues unknown {current}")
        chain.append(current)
        found = CONTINUES.match(examples[current])
        current = found.group(1) if found else None
    return "\n".join(f"# --- {part}\n{examples[part]}" for part in reversed(chain))


def test_the_page_has_the_examples_and_files_it_names() -> None:
    # A renamed marker would silently drop a block from the parametrisation below.
    assert {"yaml-preflight", "yaml-plugin", "injection", "plain-ray", "band-yaml"} <= \
        set(EXAMPLES), sorted(EXAMPLES)
    assert {"router.yaml", "band-router.yaml"} <= set(FILES), sorted(FILES)


def test_a_continuation_runs_after_what_it_continues() -> None:
    examples = {"a": "x = 1\n", "b": "# continues: a\nassert x == 1\n"}
    assert script_for("b", examples).index("x = 1") < script_for("b", examples).index("assert")
    assert script_for("a", examples) == "# --- a\nx = 1\n"
    with pytest.raises(AssertionError, match="unknown"):
        script_for("c", {"c": "# continues: nowhere\n"})


@pytest.mark.ray
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_runs_alone_as_written(name: str, tmp_path: Path) -> None:
    for file_name, body in FILES.items():
        (tmp_path / file_name).write_text(body, encoding="utf-8")
    script = script_for(name, EXAMPLES)
    script += "\nimport ray\nray.shutdown()\nprint('example ran')\n"
    # PYTHONPATH is kept: when set (scripts/test.sh, a worktree) it names the package roots
    # under test, exactly what an installed wheel provides -- and nothing from tests/.
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "disabled")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"docs/verl.md example {name} fails when run alone:\n" + \
        done.stdout[-2000:] + done.stderr[-4000:]
    assert "example ran" in done.stdout
    if name == "plain-ray":
        assert "'affinity_break_margin': 2" in done.stdout  # it prints the status
