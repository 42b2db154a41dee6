"""docs/ci-recipe.md's commands agree with each other and install Affinity from where it
is published: its repository, not a package index (fast; the job itself runs, from a
built wheel, in test_installed_package.py).

The GitHub Actions job installed ``affinity-routing`` by name, which no index has, so it
failed as written.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "docs" / "ci-recipe.md"
FENCE = re.compile(r"```(\w+)\n# ci-recipe: (\S+)\n(.*?)```", re.DOTALL)
DISTRIBUTION = "affinity-routing"


def _blocks() -> dict[str, str]:
    return {m.group(2): m.group(3) for m in FENCE.finditer(RECIPE.read_text(encoding="utf-8"))}


def _job_commands() -> list[str]:
    lines = _blocks()["job"].replace("\\\n", " ").splitlines()
    return [" ".join(line.split("#")[0].split()) for line in lines
            if line and not line.startswith(("#", "set "))]


def _actions_job() -> dict[str, Any]:
    workflow = yaml.safe_load(_blocks()["github-actions"])
    (job,) = workflow["jobs"].values()
    assert isinstance(job, dict)
    return job


def _pip_installs(text: str) -> list[list[str]]:
    """The arguments of every ``pip install`` in ``text`` (options dropped)."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line.split(" #")[0], posix=True) if "pip" in line else []
        for i, word in enumerate(words[:-1]):
            if word.endswith("pip") and words[i + 1] == "install":
                found.append([w for w in words[i + 2:] if not w.startswith("-")])
    return found


def test_actions_job_clones_affinity_then_runs_the_jobs_commands() -> None:
    job = _actions_job()
    runs = [" ".join(step["run"].split()) for step in job["steps"] if "run" in step]
    clone, rest = runs[0], runs[1:]
    assert rest == _job_commands()
    assert clone.startswith("git clone ") and "AFFINITY_GIT_URL" in clone
    assert shlex.split(clone)[-1] == "$AFFINITY_PACKAGE"  # the clone is what gets installed
    assert job["env"]["AFFINITY_PACKAGE"] and "AFFINITY_GIT_URL" in job["env"]


def test_no_block_installs_affinity_from_a_package_index() -> None:
    blocks = _blocks()
    installs = [args for name in ("job", "github-actions") for args in
                _pip_installs(blocks[name])]
    assert installs, "the recipe installs nothing?"
    for args in installs:
        for requirement in args:
            name = re.split(r"[\[<>=@ ]", requirement, maxsplit=1)[0]
            assert name.lower() != DISTRIBUTION, f"installs {requirement!r} from an index"
    text = "\n".join(blocks.values())
    assert f":-{DISTRIBUTION}" not in text  # no fallback to the index name either
    assert DISTRIBUTION not in yaml.safe_load(blocks["github-actions"])["jobs"]["affinity"][
        "env"].values()


def test_job_without_a_package_stops_with_a_message(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AFFINITY_", "PYTHON"))}
    done = subprocess.run(["bash", "-c", _blocks()["job"]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "AFFINITY_PACKAGE: set it to a clone of Affinity" in done.stderr, done.stderr


def test_pre_commit_hook_runs_the_plugin() -> None:
    hook = yaml.safe_load(_blocks()["pre-commit"])["repos"][0]["hooks"][0]
    assert "--affinity-impl" in hook["entry"] and hook["language"] == "system"
