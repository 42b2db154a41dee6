"""Conformance tooling: load verl's real router class to compare against ``affinity_engine``.

Import the loader from :mod:`affinity_conformance.upstream`; this package ``__init__`` stays
import-light on purpose (it loads nothing from verl).
"""

__all__: list[str] = []
