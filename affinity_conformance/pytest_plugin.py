"""pytest plugin: ``affinity check`` as tests inside another project's test suite.

Theory of operation
-------------------
Registered as the ``pytest11`` entry point ``affinity``, so it is loaded by every pytest
run in an environment where affinity-routing is installed -- and it stays out of the way:
without ``--affinity-impl`` it adds options and nothing else (no tests, no header, no
imports beyond pytest). With it::

    pytest --affinity-impl mypkg.balancer:MyBalancer [--affinity-tie-break first]
           [--affinity-level core ...] [--affinity-traces N] [--affinity-seed S]

it loads the class once (:func:`~affinity_conformance.impl_loader.load_impl`: constructor
convention and features), reads the shipped vectors (or ``--affinity-vectors DIR``) and
appends one test per vector of the claimed levels, with ids ``<suite>/<case>`` (e.g.
``margin/boundary_is_inclusive``), then ``--affinity-traces`` seeded generated traces as
``trace/<family>/seed-<n>`` (SplitMix64 seeds ``S, S+1, ...``, families round robin:
reproducible). The claimed levels are those of ``--affinity-level``, by default ``core``
and every feature level the class supports, exactly as in ``affinity check``
(:mod:`affinity_conformance.levels`). A vector of a claimed level that needs a feature
the class lacks is skipped with the reason. Each test runs through
:class:`~affinity_conformance.check.Checker`, so a failure shows the same shrunk
diagnosis as ``affinity check`` -- minimal trace, first divergent step in words with the
requirement ids -- and the minimal trace is written as a vector to ``--affinity-out``
(default: a fresh temporary folder, named in the failure).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

__all__ = ["AffinityItem", "ConformanceFailure", "pytest_addoption",
           "pytest_collection_modifyitems", "pytest_configure", "pytest_report_header",
           "pytest_unconfigure"]


class ConformanceFailure(AssertionError):
    """A vector or trace diverged from the spec; ``lines`` is the diagnosis."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class _Session:
    def __init__(self, config: pytest.Config, impl_spec: str) -> None:
        # Imported here, so a plain pytest run never imports the checker.
        from .check import Checker, load_vectors
        from .impl_loader import CONVENTIONS, ImplError, load_impl
        from .levels import LEVELS, check_claims
        from .shipped import shipped_vectors
        from .vector_format import VectorError

        opt = config.getoption
        ctor = opt("affinity_ctor")
        if ctor not in CONVENTIONS:
            raise pytest.UsageError(f"--affinity-ctor: {ctor!r} is not one of {list(CONVENTIONS)}")
        traces, seed = opt("affinity_traces"), opt("affinity_seed")
        if traces < 0:
            raise pytest.UsageError(f"--affinity-traces: expected an integer >= 0, got {traces}")
        vectors = Path(opt("affinity_vectors") or shipped_vectors())
        try:
            claimed = check_claims(opt("affinity_level") or [])
            impl = load_impl(impl_spec, ctor)
            self.cases = load_vectors(vectors)
        except (ValueError, ImplError, VectorError) as exc:
            raise pytest.UsageError(f"affinity: {exc}") from None
        self.claims = claimed or [n for n in LEVELS if n == "core" or n in impl.features]
        given_out = opt("affinity_out")
        self.fresh_out = given_out is None
        self.out = (Path(tempfile.mkdtemp(prefix="affinity-check-failures-"))
                    if given_out is None else Path(given_out))
        self.checker = Checker(impl, opt("affinity_tie_break"), seed, self.out)
        self.traces, self.seed, self.impl_spec, self.vectors = traces, seed, impl_spec, vectors

    def units(self) -> list[tuple[str, Callable[[], Any]]]:
        """(test id, thunk returning a CaseResult) for every vector and trace claimed."""
        from .check import trace_plan

        checker, claims = self.checker, set(self.claims)
        units: list[tuple[str, Callable[[], Any]]] = []
        for case in self.cases:
            if claims & set(case.levels):
                units.append((f"{case.suite}/{case.name}", partial(checker.case, case)))
        families = [f for f in checker.families() if claims & set(checker.family_levels(f))]
        for family, seed in trace_plan(families, self.traces, self.seed):
            units.append((f"trace/{family.name}/seed-{seed}",
                          partial(checker.trace, family, seed)))
        return units


_SESSION = pytest.StashKey[_Session]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("affinity", "Affinity conformance (the spec's vectors and "
                                        "generated traces as tests; affinity check)")
    group.addoption("--affinity-impl", metavar="MODULE:CLASS", default=None,
                    help="balancer with verl's API to check (module:Class, module:factory or "
                         "path/to/file.py:Class); without it this plugin collects nothing")
    group.addoption("--affinity-tie-break", choices=("first", "any"), default="any",
                    help="first: ties must go to the first least-loaded server (exact); any "
                         "(default): each choice must be allowed by the spec (refinement)")
    group.addoption("--affinity-level", action="append", default=None, metavar="LEVEL",
                    help="claimed conformance level (repeatable): core, a feature level "
                         "(margin, full_determinism, ...) or strict-config; default: core "
                         "and every feature level the class supports")
    group.addoption("--affinity-traces", type=int, default=50, metavar="N",
                    help="seeded generated traces after the vectors (default 50)")
    group.addoption("--affinity-seed", type=int, default=1, metavar="S",
                    help="seed of the first generated trace (default 1)")
    group.addoption("--affinity-ctor", default="auto", metavar="CONVENTION",
                    help="constructor convention: auto (default), verl, pr7435, kwargs, yaml")
    group.addoption("--affinity-vectors", default=None, metavar="DIR",
                    help="vector directory (default: the vectors shipped with the package)")
    group.addoption("--affinity-out", default=None, metavar="DIR",
                    help="where minimal failing traces are written as vectors (default: a "
                         "fresh temporary folder)")


def pytest_configure(config: pytest.Config) -> None:
    impl_spec = config.getoption("affinity_impl", default=None)
    if impl_spec:
        config.stash[_SESSION] = _Session(config, impl_spec)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is not None and session.fresh_out and session.out.is_dir() \
            and not any(session.out.iterdir()):
        session.out.rmdir()


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(_SESSION, None)
    if session is None:
        return []
    return [f"affinity: {session.impl_spec}; levels {', '.join(session.claims)}; tie-break "
            f"{session.checker.tie_mode}; vectors {session.vectors}; {session.traces} traces "
            f"from seed {session.seed}"]


class AffinityItem(pytest.Item):
    """One vector or one generated trace."""

    def __init__(self, *, unit: Callable[[], Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unit = unit

    def runtest(self) -> None:
        result = self.unit()
        if result.verdict == "unsupported":
            pytest.skip(f"unsupported: needs {', '.join(sorted(result.missing))}")
        if result.verdict == "fail":
            raise ConformanceFailure(result.failure.render())

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            return "\n".join(excinfo.value.lines)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"affinity {self.name}"


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection sees the items
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    state = config.stash.get(_SESSION, None)
    if state is None:
        return
    for name, unit in state.units():
        items.append(AffinityItem.from_parent(session, name=name, nodeid=name, unit=unit))
