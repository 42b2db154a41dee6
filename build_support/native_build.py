"""The optional mypyc build of affinity_engine: a setuptools ``build_ext`` and a CLI.

Theory of operation
-------------------
``setup.py`` hands :class:`NativeBuildExt` to setuptools with one placeholder extension, so
every wheel build reaches it. At build time it reads ``AFFINITY_BUILD``:

* ``pure``: build nothing; the wheel holds the source only;
* ``auto`` (default): compile :data:`MODULES` with mypyc (which ships with mypy, a build
  requirement) from the same ``mypy --strict`` source; if mypyc or a C compiler is
  missing or fails, say so and fall back to the source, removing any partial output;
* ``compiled``: the same, but a failure fails the build.

Editable installs (``pip install -e``) never compile (and ``AFFINITY_BUILD=compiled``
fails them): a compiled module inside a source tree would change what every developer
runs.

The compiled modules are not installed next to their sources but in the subpackage
``affinity_engine/_native`` with ``native_selector.py`` as its ``__init__`` and a
``manifest.json`` recording the SHA-256 of every compiled source, so the pure source
stays importable (``AFFINITY_BUILD=pure``) and a stale build is refused (see
native_selector.py). ``python build_support/native_build.py --out DIR`` builds a
complete ``affinity_engine`` package (sources plus ``_native``) into ``DIR``; the CI
equality tier (tests/build) uses it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from setuptools import Distribution, Extension  # type: ignore[import-untyped]
from setuptools.command.build_ext import build_ext  # type: ignore[import-untyped]

__all__ = ["MODULES", "PLACEHOLDER", "NativeBuildExt", "build_into", "requested_build"]

PACKAGE = "affinity_engine"
NATIVE = f"{PACKAGE}._native"
# The modules on the decision path, with the events (built once per request) and the
# native value base they all derive from. config and codec keep attrs.field() validators
# and converters, which mypyc cannot compile in native classes, and are not on the hot
# path; they stay source in both builds.
MODULES = ("builders", "cursor", "leases", "loads", "lru", "machine", "policy",
           "state", "values")
PLACEHOLDER = Extension(f"{NATIVE}.placeholder", sources=[])
HERE = Path(__file__).resolve().parent


def requested_build() -> str:
    choice = os.environ.get("AFFINITY_BUILD", "").strip().lower() or "auto"
    if choice not in ("auto", "compiled", "pure"):
        raise SystemExit(f"AFFINITY_BUILD must be one of auto, compiled, pure; got {choice!r}")
    return choice


def _say(message: str) -> None:
    print(f"affinity_engine build: {message}", file=sys.stderr, flush=True)


class NativeBuildExt(build_ext):  # type: ignore[misc]
    """Compile the core with mypyc, or fall back to the pure source (see module doc)."""

    def run(self) -> None:
        choice = requested_build()
        if getattr(self, "editable_mode", False) or self.inplace:
            if choice == "compiled":
                raise SystemExit("AFFINITY_BUILD=compiled: an editable install stays pure (a "
                                 "compiled module beside the source tree would shadow it)")
            _say("pure (editable install); compiled builds come from a wheel or sdist")
            self.extensions: list[Extension] = []
            return
        if choice == "pure":
            _say("pure (AFFINITY_BUILD=pure)")
            self.extensions = []
            return
        source_dir = Path(PACKAGE)
        try:
            self._use(_mypyc_extensions(source_dir, Path(self.build_temp) / "mypyc"))
            super().run()
        except (Exception, SystemExit) as exc:  # no mypyc, no compiler, a compile error
            self._remove_partial()
            if choice == "compiled":
                raise
            _say(f"pure (the mypyc build failed: {type(exc).__name__}: {exc})")
            self.extensions = []
            return
        _write_selector(Path(self.build_lib) / PACKAGE / "_native", source_dir)
        _say(f"compiled ({len(MODULES)} modules by mypyc)")

    def _use(self, extensions: list[Extension]) -> None:
        # What setuptools' finalize_options does per extension, for the list that
        # replaces the placeholder (mypycify runs here, not at setup() time, so that
        # an editable or pure install never generates C).
        self.extensions = extensions
        for ext in extensions:
            ext._full_name = self.get_ext_fullname(ext.name)
            self.ext_map[ext._full_name] = ext
            ext._links_to_dynamic = False
            ext._needs_stub = False
            ext._file_name = self.get_ext_filename(ext._full_name)

    def _remove_partial(self) -> None:
        shutil.rmtree(Path(self.build_lib) / PACKAGE / "_native", ignore_errors=True)

    def get_source_files(self) -> list[str]:  # the placeholder has no sources
        return []


def _mypyc_extensions(source_dir: Path, target_dir: Path) -> list[Extension]:
    from mypyc.build import mypycify  # a build requirement; absent means "fall back"

    paths = [str(source_dir / f"{name}.py") for name in MODULES]
    extensions: list[Extension] = mypycify(
        paths, opt_level="3", group_name=f"{NATIVE}.core", target_dir=str(target_dir))
    for ext in extensions:
        if not ext.name.startswith(f"{NATIVE}."):
            # affinity_engine.machine -> affinity_engine._native.machine: the module keeps
            # its name and init function, only its file moves beside the selector.
            ext.name = f"{NATIVE}.{ext.name.rpartition('.')[2]}"
    return extensions


def _write_selector(target: Path, source_dir: Path) -> None:
    import mypy.version

    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "native_selector.py", target / "__init__.py")
    manifest: dict[str, Any] = {
        "mypy": mypy.version.__version__,
        "sources": {name: hashlib.sha256((source_dir / f"{name}.py").read_bytes()).hexdigest()
                    for name in MODULES},
    }
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n",
                                          encoding="utf-8")


def build_into(out: Path, root: Path, choice: str = "compiled") -> Path:
    """Build a complete ``affinity_engine`` package into ``out`` (for tests): the sources
    plus, when the build succeeds, ``_native``; ``choice`` is ``AFFINITY_BUILD``."""
    out = out.resolve()
    package = out / PACKAGE
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(root / PACKAGE, package,
                    ignore=shutil.ignore_patterns("__pycache__", "_native", "*.so"))
    cwd = Path.cwd()
    os.chdir(root)
    try:
        dist = Distribution({"name": "affinity-core-native", "ext_modules": [PLACEHOLDER],
                             "cmdclass": {"build_ext": NativeBuildExt}})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = str(out)
        cmd.build_temp = str(out / "_build_temp")
        os.environ["AFFINITY_BUILD"] = choice
        dist.run_command("build_ext")
    finally:
        os.chdir(cwd)
    shutil.rmtree(out / "_build_temp", ignore_errors=True)
    return package


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build the compiled affinity_engine into a directory.")
    parser.add_argument("--out", required=True, type=Path, help="directory to build into")
    parser.add_argument("--build", choices=("auto", "compiled", "pure"), default="compiled",
                        help="AFFINITY_BUILD for this build (default: compiled)")
    args = parser.parse_args(argv)
    package = build_into(args.out, HERE.parent, args.build)
    print(package)
    return 0


if __name__ == "__main__":
    sys.exit(main())
