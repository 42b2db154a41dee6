"""docs/verl.md's "runnable without a GPU" examples run as written, in a fresh process.

The other tests exec the examples inside the test process, after their own setup; this
one runs them the way a reader does -- a new ``python`` in an empty folder holding only
the documented ``router.yaml`` and ``band-router.yaml`` -- so a setup step the docs do
not show (such as loading verl's router module without torch) makes it fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "verl.md"
FENCE = re.compile(r"```(\w+)\n# (example|example-file): (\S+)\n(.*?)```", re.DOTALL)
RUNNABLE = ("yaml-preflight", "yaml-plugin", "injection", "plain-ray", "band-yaml")
FILES = ("router.yaml", "band-router.yaml")


def test_runnable_examples_run_as_written(tmp_path: Path) -> None:
    blocks = {name: body for _lang, _kind, name, body in FENCE.findall(
        DOCS.read_text(encoding="utf-8"))}
    assert set(RUNNABLE) <= set(blocks), sorted(blocks)
    for name in FILES:
        (tmp_path / name).write_text(blocks[name], encoding="utf-8")
    script = "\n".join(f"# --- {name}\n{blocks[name]}" for name in RUNNABLE)
    script += "\nimport ray\nray.shutdown()\nprint('all examples ran')\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "all examples ran" in done.stdout
    assert "'affinity_break_margin': 2" in done.stdout  # plain-ray prints the status
