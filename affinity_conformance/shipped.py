"""The data files the CLI reads at run time, found through :mod:`importlib.resources`.

Theory of operation
-------------------
``spec/vectors/`` (cases, schema, manifest) and ``proofs/counterexamples/`` are the one
canonical copy of that data: non-Python consumers read ``spec/vectors/`` directly. Each
tree is *linked* into the package that reads it -- ``affinity_conformance/vectors`` is a
symbolic link to ``../spec/vectors`` and ``affinity_proofs/counterexamples`` one to
``../counterexamples`` -- and declared as package data in ``pyproject.toml``. setuptools
follows the links when it collects package data, so a checkout, an editable install, the
sdist and the wheel all read the same bytes through the same code path, in any working
directory. ``spec/vectors/SPEC.md`` is a link to ``spec/SPEC.md`` in the same way, so the
specification ships with the vectors (``affinity vectors export`` writes it beside them).
``tests/packaging/`` fails if a link stops pointing at its canonical tree or a built
wheel's copy differs from it byte for byte.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["package_data_dir", "shipped_counterexamples", "shipped_vectors"]


def package_data_dir(package: str, name: str) -> Path:
    """The directory ``name`` shipped inside ``package`` (a real directory on disk)."""
    ref = resources.files(package).joinpath(name)
    if not ref.is_dir():
        raise FileNotFoundError(f"{package}/{name}/: package data missing from this install "
                                "(reinstall affinity-routing; in a checkout, the symbolic link "
                                "to the canonical tree is gone)")
    return Path(str(ref))


def shipped_vectors() -> Path:
    """The conformance vectors (canonical tree: ``spec/vectors/``)."""
    return package_data_dir("affinity_conformance", "vectors")


def shipped_counterexamples() -> Path:
    """The proof suite's counterexample traces (canonical tree: ``proofs/counterexamples/``)."""
    return package_data_dir("affinity_proofs", "counterexamples")
