"""The compiled build of affinity_engine equals the pure source.

Theory of operation
-------------------
One mypyc build per session (``build_support/native_build.py --out DIR``, the same
``build_ext`` a wheel build runs; about 30-60 s on two cores) goes into a temporary
directory. Each check runs in a subprocess with ``PYTHONPATH=DIR`` in front, so
``import affinity_engine`` finds the built package instead of the source tree:

* the selector: ``AFFINITY_BUILD`` picks the build; ``affinity --version`` names it;
* drift: a build whose recorded source digest differs from the source beside it is
  refused (``auto`` falls back to the source, ``compiled`` fails naming the module);
* equality: every conformance vector, the stateful lockstep against verl 0.9.1's class and
  the differential against it, and the core's own tests run again on the compiled build,
  with ``AFFINITY_BUILD=compiled`` (so a build that cannot load fails, never falls back).

Without a C compiler the build cannot run: tier ``compiled`` of the skip policy in
tests/conftest.py skips it with that reason outside CI and fails it under CI unless opted
out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EQUALITY_SUITES = (
    "tests/conformance/test_vectors_replay.py",
    "tests/conformance/test_stateful_lockstep.py",
    "tests/conformance/test_differential_verl.py",
    "tests/core",
    "tests/verl/test_verl_fast_path.py",  # the compiled KeyedBalancer against the adapter
)
# The mutant and purity checks need the source itself (monkeypatches, ast of the files).
DESELECT = ("tests/core/test_purity.py",)

pytestmark = pytest.mark.compiled  # tests/conftest.py: skipped or failed without a C compiler


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


@pytest.fixture(scope="session")
def compiled_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert _compiler() is not None  # the compiled tier's probe ran first (tests/conftest.py)
    out = tmp_path_factory.mktemp("compiled")
    done = subprocess.run(
        [sys.executable, str(ROOT / "build_support" / "native_build.py"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name.split(".")[0] for p in (out / "affinity_engine" / "_native").glob("*.so"))
    return out


def _run(code: str, path: Path, build: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(path)}
    env.pop("AFFINITY_BUILD", None)
    if build is not None:
        env["AFFINITY_BUILD"] = build
    return subprocess.run([sys.executable, "-c", code], cwd=path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


SHOW = ("import affinity_engine, affinity_engine.machine as m, affinity_engine._build as b; "
        "print(affinity_engine.BUILD, m.__file__.endswith('.py'), b.BUILD_INFO, sep='|')")


def test_auto_and_compiled_select_the_compiled_modules(compiled_dir: Path) -> None:
    for build in (None, "auto", "compiled"):
        done = _run(SHOW, compiled_dir, build)
        assert done.returncode == 0, done.stderr
        chosen, is_source, info = done.stdout.strip().split("|")
        assert (chosen, is_source) == ("compiled", "False"), (build, done.stdout)
        assert info.startswith("compiled (mypyc")


def test_pure_selects_the_source(compiled_dir: Path) -> None:
    done = _run(SHOW, compiled_dir, "pure")
    assert done.stdout.strip().split("|")[:2] == ["pure", "True"], done.stdout + done.stderr


def test_unknown_choice_is_refused(compiled_dir: Path) -> None:
    done = _run(SHOW, compiled_dir, "fast")
    assert done.returncode != 0
    assert "AFFINITY_BUILD must be one of auto, compiled, pure, got 'fast'" in done.stderr


def test_a_stale_build_is_never_run(compiled_dir: Path, tmp_path: Path) -> None:
    stale = tmp_path / "stale"
    shutil.copytree(compiled_dir / "affinity_engine", stale / "affinity_engine")
    machine = stale / "affinity_engine" / "machine.py"
    machine.write_text(machine.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    done = _run(SHOW, stale, "auto")
    chosen, is_source, info = done.stdout.strip().split("|")
    assert (chosen, is_source) == ("pure", "True"), done.stdout + done.stderr
    assert "stale: machine changed" in info
    done = _run(SHOW, stale, "compiled")
    assert done.returncode != 0
    assert "the compiled build is stale: machine changed" in done.stderr


def test_without_a_compiler_auto_installs_the_source(tmp_path: Path) -> None:
    """The fallback of a plain install: no working C compiler, AFFINITY_BUILD=auto."""
    env = {**os.environ, "CC": "/bin/false"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "build_support" / "native_build.py"), "--out",
         str(tmp_path), "--build", "auto"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "affinity_engine build: pure (the mypyc build failed: CompileError" in done.stderr
    assert not (tmp_path / "affinity_engine" / "_native").exists()
    assert _run(SHOW, tmp_path).stdout.startswith("pure|True|pure (no compiled build")
    env["AFFINITY_BUILD"] = "compiled"
    done = subprocess.run(
        [sys.executable, str(ROOT / "build_support" / "native_build.py"), "--out",
         str(tmp_path / "strict")], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=900, check=False)
    assert done.returncode != 0  # asked for compiled: a failed compile fails the build


def test_version_names_the_build(compiled_dir: Path) -> None:
    code = "from affinity_cli.main import version_text; print(version_text())"
    assert "affinity_engine: compiled (mypyc" in _run(code, compiled_dir).stdout
    pure = _run(code, compiled_dir, "pure").stdout
    assert "affinity_engine: pure (compiled build present" in pure


def test_verify_runs_the_proofs_on_the_source(compiled_dir: Path) -> None:
    """Mutants are monkeypatches and CrossHair executes Python: ``affinity verify`` must
    select the pure source even where a compiled build is installed."""
    code = ("import contextlib, io, os\n"
            "from affinity_cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), "
            "contextlib.suppress(SystemExit):\n"
            "    main(['verify', '--help'])\n"
            "import affinity_engine\n"
            "print(affinity_engine.BUILD, os.environ['AFFINITY_BUILD'])\n")
    done = _run(code, compiled_dir)
    assert done.stdout.split() == ["pure", "pure"], done.stdout + done.stderr


def test_vectors_lockstep_and_differential_pass_on_the_compiled_build(
        compiled_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(compiled_dir), "AFFINITY_BUILD": "compiled",
           "AFFINITY_EXPECT_BUILD": "compiled"}
    check = _run(SHOW, compiled_dir, "compiled")
    assert check.stdout.startswith("compiled|False"), check.stdout + check.stderr
    # cwd is the build: ``python -m`` puts it first on sys.path, before the source tree,
    # and importlib mode keeps pytest from putting the test tree there. Plain asserts:
    # pytest's rewritten-assert messages ask callables for __name__, which mypyc's bound
    # methods lack, so a negative control's expected AssertionError would become an
    # AttributeError while rendering its message.
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
            "--import-mode=importlib", "--assert=plain", f"--rootdir={ROOT}",
            "-c", str(ROOT / "pyproject.toml"),
            str(Path(__file__).with_name("check_selected_build.py")),
            *(str(ROOT / s) for s in EQUALITY_SUITES),
            *(f"--deselect={ROOT / d}" for d in DESELECT)]
    done = subprocess.run(args, cwd=compiled_dir, env=env, capture_output=True, text=True,
                          timeout=1800, check=False)
    tail = "\n".join(done.stdout.splitlines()[-15:])
    assert done.returncode == 0, tail + done.stderr[-2000:]
    assert " passed" in tail and "error" not in tail.lower(), tail
