"""Acceptance: the built wheel and sdist work outside the checkout.

Builds the sdist and, from it, the wheel (``python -m build``) out of a copy of the
checkout's files, and checks that the shipped vectors and counterexamples equal the
canonical trees byte for byte. Then, for each of the two, installs it -- not editable --
into a fresh venv outside the checkout:

* wheel: by running docs/ci-recipe.md's job block as written (venv, install, ``affinity
  verify``, the pytest plugin) in a small balancer project written into a temporary folder;
* sdist: with pip directly, then ``affinity verify``.

Both legs run ``affinity verify --scope small`` (quicker than the default scope, which
takes 50-60 s wall on a quiet 2-core machine and longer on a loaded one; .ci/run runs
it from the checkout).

and, from an empty temporary folder, runs ``affinity vectors verify``, ``affinity check``
against a small balancer module written into that folder, ``affinity replay`` on a
decision log written there by the installed verl adapter, and the pytest plugin against
the same class. All pass; the same check and plugin against a deliberately broken class
fail.

Takes about 4-6 minutes on two otherwise idle cores (PyPI or the local wheel cache for the
dependencies; far longer on a loaded machine); marked ``slow``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import venv
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
BALANCERS = ROOT / "tests" / "conformance" / "broken_balancers.py"
CANONICAL = {  # path inside the wheel -> canonical tree, relative to the source root
    "affinity_conformance/vectors": Path("spec", "vectors"),
    "affinity_proofs/counterexamples": Path("proofs", "counterexamples"),
}
LOG_SCRIPT = """
from affinity_verl import AffinityLoadBalancer
lb = AffinityLoadBalancer(servers={"s0": None, "s1": None}, affinity_break_margin=1,
                          decision_log="decisions.ndjson")
for rid in ["a", "b", "a", "a", "c", "a"]:
    lb.acquire_server(request_id=rid)
lb.release_server(server_id="s0")
lb.add_servers({"s2": None})
lb.acquire_server(request_id="d")
lb.clear_sticky_cache()
print(lb.get_status()["decision_log_ok"] if "decision_log_ok" in lb.get_status() else True)
"""

RECIPE_FENCE = re.compile(r"```(\w+)\n# ci-recipe: (\S+)\n(.*?)```", re.DOTALL)

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory,
          copy_source: Callable[[Path], Path]) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("build")
    src = copy_source(base / "src")
    out = base / "dist"
    built = _run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], base)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0], "src": src}


def _canonical_files(src: Path) -> dict[str, bytes]:
    """The canonical trees of the source the dists were built from (a snapshot of the
    checkout, so edits made during the build cannot race the comparison)."""
    files = {}
    for inside, canonical in CANONICAL.items():
        tree = src / canonical
        for path in tree.rglob("*"):
            rel = path.relative_to(tree).as_posix()
            if path.is_file() and not rel.startswith("consumers/"):
                files[f"{inside}/{rel}"] = path.read_bytes()
    return files


def test_license_and_metadata_are_shipped(dists: dict[str, Path]) -> None:
    """Apache-2.0 section 4(a): a copy of the license goes with every distribution."""
    license_text = (dists["src"] / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    project = tomllib.loads((dists["src"] / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"]
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = wheel.namelist()
        (shipped,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert wheel.read(shipped).decode("utf-8") == license_text
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = wheel.read(meta_name).decode("utf-8")
    assert f"Version: {project['version']}\n" in meta
    assert "License-Expression: Apache-2.0\n" in meta and "License-File: LICENSE\n" in meta
    for classifier in project["classifiers"]:
        assert f"Classifier: {classifier}\n" in meta
    for label, url in project["urls"].items():
        assert f"Project-URL: {label}, {url}\n" in meta
    assert f"Keywords: {','.join(project['keywords'])}\n" in meta
    with tarfile.open(dists["sdist"]) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        for name in ("LICENSE", "CHANGELOG.md", "CONTRIBUTING.md"):
            member = sdist.extractfile(f"{top}/{name}")
            assert member is not None and member.read() == (dists["src"] / name).read_bytes()


def test_shipped_data_equals_the_canonical_trees(dists: dict[str, Path]) -> None:
    want = _canonical_files(dists["src"])
    assert len(want) > 240
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = set(wheel.namelist())
        missing = sorted(set(want) - names)
        assert not missing, f"missing from the wheel: {missing[:5]}"
        differ = [n for n in want if wheel.read(n) != want[n]]
        assert not differ, f"the wheel's copy differs: {differ[:5]}"
    with tarfile.open(dists["sdist"]) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        for name, data in want.items():
            in_sdist = name.replace("affinity_proofs/", "proofs/affinity_proofs/", 1)
            member = sdist.extractfile(f"{top}/{in_sdist}")
            assert member is not None and member.read() == data, f"sdist: {name}"


def _project(folder: Path) -> Path:
    """A balancer project like a verl fork's, for the CI recipe."""
    (folder / "myfork").mkdir(parents=True)
    (folder / "myfork" / "__init__.py").write_text("", encoding="utf-8")
    (folder / "myfork" / "router.py").write_text(
        BALANCERS.read_text(encoding="utf-8") + "\n\nForkBalancer = MiniBalancer\n",
        encoding="utf-8")
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"'
        '\n\n[project]\nname = "myfork"\nversion = "0.0.1"\n\n[tool.setuptools]\n'
        'packages = ["myfork"]\n', encoding="utf-8")
    return folder


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_package_works_from_an_empty_folder(
        kind: str, dists: dict[str, Path], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    if kind == "wheel":  # docs/ci-recipe.md's job, as written
        project = _project(tmp_path / "project")
        env_dir = project / ".affinity-venv"
        recipe = _run(["bash", "-c", recipe_blocks()["job"]], project,
                      {**env, "AFFINITY_PACKAGE": str(dists["wheel"]),
                       "AFFINITY_IMPL": "myfork.router:ForkBalancer",
                       "AFFINITY_VERIFY_ARGS": "--scope small"})
        assert recipe.returncode == 0, recipe.stdout[-4000:] + recipe.stderr[-4000:]
        assert "mutants refuted" in recipe.stdout and " passed" in recipe.stdout
    else:
        env_dir = tmp_path / "venv-sdist"
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
        # The wheel leg has the default build (compiled core where mypyc and a C compiler
        # work, setup.py); the sdist is installed with the pure core, which builds in seconds.
        install = _run([str(env_dir / "bin" / "pip"), "install", "-q",
                        f"{dists[kind]}[proofs]", "pytest"], tmp_path,
                       {**env, "AFFINITY_BUILD": "pure"})
        assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    bindir = env_dir / "bin"
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"

    work = tmp_path / "empty"
    work.mkdir()
    python, affinity = str(bindir / "python"), str(bindir / "affinity")
    where = _run([python, "-c", "import affinity_conformance, affinity_proofs; "
                  "print(affinity_conformance.__file__); print(affinity_proofs.__file__)"],
                 work, env)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(env_dir)) for line in where.stdout.split()), where.stdout
    (work / "my_balancers.py").write_text(BALANCERS.read_text(encoding="utf-8"),
                                         encoding="utf-8")

    def ok(*cmd: str, expect: int = 0) -> str:
        done = _run(list(cmd), work, env)
        assert done.returncode == expect, (
            f"{' '.join(cmd)} -> {done.returncode} (want {expect})\n"
            f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return done.stdout

    if kind == "sdist":
        assert "mutants refuted" in ok(affinity, "verify", "--scope", "small")
    assert "vectors and the manifest match" in ok(affinity, "vectors", "verify")
    good = ok(affinity, "check", "my_balancers:MiniBalancer", "--tie-break", "first",
              "--budget", "40")
    assert "verdict: pass -- core: pass" in good
    bad = ok(affinity, "check", "my_balancers:StrictMarginBalancer", "--tie-break", "first",
             "--budget", "10", expect=1)
    assert "margin: FAIL" in bad and "R-KEEP-1" in bad
    ok(python, "-c", LOG_SCRIPT)
    ok(affinity, "replay", "decisions.ndjson")
    plugin = ok(python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "--affinity-impl", "my_balancers:MiniBalancer", "--affinity-tie-break", "first",
                "--affinity-traces", "20")
    assert " passed" in plugin
    broken = ok(python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "--affinity-impl", "my_balancers:StrictMarginBalancer",
                "--affinity-tie-break", "first", "--affinity-traces", "0", expect=1)
    assert "FAILED affinity::margin::boundary_is_inclusive" in broken
    # Nothing of Affinity's is written into the cwd (tools' caches such as pytest's
    # .hypothesis folder from the hypothesis plugin are theirs).
    assert sorted(p.name for p in work.iterdir() if p.name != "__pycache__"
                  and not p.name.startswith(".")) == ["decisions.ndjson", "my_balancers.py"]


def recipe_blocks() -> dict[str, str]:
    """docs/ci-recipe.md's fenced blocks whose first line is ``# ci-recipe: NAME``."""
    text = (ROOT / "docs" / "ci-recipe.md").read_text(encoding="utf-8")
    return {m.group(2): m.group(3) for m in RECIPE_FENCE.finditer(text)}
