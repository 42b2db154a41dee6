"""Packaging hook: the optional mypyc build of affinity_engine (build_support/native_build.py).

Everything else about the package is in pyproject.toml. ``AFFINITY_BUILD=pure|auto|compiled``
chooses the build; ``auto`` (the default) compiles when mypyc and a C compiler work and
installs the pure source otherwise. ``affinity --version`` says which build is running.
"""

import sys
from pathlib import Path

from setuptools import setup  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parent / "build_support"))

from native_build import PLACEHOLDER, NativeBuildExt  # type: ignore[import-not-found]

setup(ext_modules=[PLACEHOLDER], cmdclass={"build_ext": NativeBuildExt})
