"""pytest plugin: ``affinity check`` as tests inside another project's test suite.

Theory of operation
-------------------
Registered as the ``pytest11`` entry point ``affinity``, so it is loaded by every pytest
run in an environment where affinity-routing is installed -- and it stays out of the way:
without ``--affinity-impl`` it adds its options and the ``affinity`` marker and nothing
else (no tests, no header, no imports beyond pytest). With it::

    pytest --affinity-impl mypkg.balancer:MyBalancer [--affinity-tie-break first]
           [--affinity-level core ...] [--affinity-traces N] [--affinity-seed S]

it loads the class once (:func:`~affinity_conformance.impl_loader.load_impl`: constructor
convention and features), reads the shipped vectors (or ``--affinity-vectors DIR``) and
collects a test tree after the project's own tests, following pytest's pattern for
non-Python tests (a :class:`pytest.File` whose ``collect`` yields collectors and items)::

    affinity                              AffinitySuite (a File: the vector manifest)
      margin                              VectorSuite, one per vector suite
        boundary_is_inclusive             AffinityItem, one per vector
      trace                               TraceSuite
        margin1                           TraceFamily, one per generated-trace family
          seed-3                          AffinityItem, one per generated trace

so the ids are ``affinity::margin::boundary_is_inclusive`` and
``affinity::trace::margin1::seed-3``. Any prefix of an id given on the command line
(``pytest --affinity-impl X affinity::margin``) runs just that part: the plugin maps the
leading ``affinity`` to the manifest file, because pytest resolves an argument's first part
as a path. ``-k``, ``--deselect`` and ``-m "not affinity"`` (every item carries the
``affinity`` marker) work as for any test, and JUnit XML gets the classnames
``affinity.margin`` and ``affinity.trace.margin1``.

The claimed levels are those of ``--affinity-level``, by default ``core`` and every
feature level the class supports, exactly as in ``affinity check``
(:mod:`affinity_conformance.levels`). Vectors and traces of unclaimed levels are not
collected; a vector of a claimed level that needs a feature the class lacks is skipped
with the reason. Generated traces use SplitMix64 seeds ``S, S+1, ...`` with the families
round robin, so they are reproducible. Each test runs through
:class:`~affinity_conformance.check.Checker`, so a failure shows the same shrunk
diagnosis as ``affinity check`` -- minimal trace, first divergent step in words with the
requirement ids -- and the minimal trace is written as a vector to ``--affinity-out``, by
default ``affinity-failures/`` under pytest's own temporary directory (``tmp_path_factory``:
``--basetemp``, kept for the last three runs like every ``tmp_path``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .check import Checker
    from .trace_gen import Family
    from .vector_format import Case

__all__ = ["AffinityItem", "AffinitySuite", "ConformanceFailure", "TraceFamily", "TraceSuite",
           "VectorSuite", "pytest_addoption", "pytest_collect_file", "pytest_configure",
           "pytest_make_collect_report", "pytest_report_header"]

ROOT_NAME = "affinity"
MARKER = "affinity: a conformance vector or generated trace of the affinity plugin " \
         "(--affinity-impl); deselect with -m 'not affinity'"


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
        from .vector_format import MANIFEST_NAME, VectorError

        opt = config.getoption
        ctor = opt("affinity_ctor")
        if ctor not in CONVENTIONS:
            raise pytest.UsageError(f"--affinity-ctor: {ctor!r} is not one of {list(CONVENTIONS)}")
        traces, seed = opt("affinity_traces"), opt("affinity_seed")
        if traces < 0:
            raise pytest.UsageError(f"--affinity-traces: expected an integer >= 0, got {traces}")
        vectors = Path(opt("affinity_vectors") or shipped_vectors()).resolve()
        try:
            claimed = check_claims(opt("affinity_level") or [])
            impl = load_impl(impl_spec, ctor)
            self.cases = load_vectors(vectors)
        except (ValueError, ImplError, VectorError) as exc:
            raise pytest.UsageError(f"affinity: {exc}") from None
        self.claims = claimed or [n for n in LEVELS if n == "core" or n in impl.features]
        # The suite's File node needs a real path (pytest resolves a command-line id's first
        # part as one): the manifest when the tree has one, else the directory's first case.
        manifest = vectors / MANIFEST_NAME
        self.anchor = manifest if manifest.is_file() else Path(self.cases[0].path).resolve()
        given_out = opt("affinity_out")
        self.out = None if given_out is None else Path(given_out)
        self.checker: Checker = Checker(impl, opt("affinity_tie_break"), seed, self.out)
        self.traces, self.seed, self.impl_spec, self.vectors = traces, seed, impl_spec, vectors
        # True when the command line names `affinity[::...]`: pytest then collects the
        # suite through pytest_collect_file (and only the named part); otherwise it is
        # added after the project's own tests.
        self.named = False

    def vector_suites(self) -> dict[str, list[Case]]:
        """The claimed vectors by suite, in file order."""
        claims = set(self.claims)
        suites: dict[str, list[Case]] = {}
        for case in self.cases:
            if claims & set(case.levels):
                suites.setdefault(case.suite, []).append(case)
        return suites

    def trace_families(self) -> dict[str, list[tuple[Family, int]]]:
        """The planned generated traces by family, in plan order."""
        from .check import trace_plan

        checker, claims = self.checker, set(self.claims)
        families = [f for f in checker.families() if claims & set(checker.family_levels(f))]
        planned: dict[str, list[tuple[Family, int]]] = {}
        for family, seed in trace_plan(families, self.traces, self.seed):
            planned.setdefault(family.name, []).append((family, seed))
        return planned

    def prepare_out(self, config: pytest.Config) -> None:
        """Point the checker at pytest's temporary directory unless --affinity-out is given.

        Lazily, at the first test: the tmpdir plugin creates the factory in its own
        pytest_configure, and a run that never fails then leaves only pytest's managed
        base directory, not a folder of ours in the system temp dir.
        """
        if self.checker.out_dir is not None:
            return
        # The same factory the tmp_path_factory fixture returns (it reads this attribute).
        factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
        self.checker.out_dir = factory.getbasetemp() / "affinity-failures"


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
                    help="where minimal failing traces are written as vectors (default: "
                         "affinity-failures/ under pytest's temporary directory)")


def pytest_configure(config: pytest.Config) -> None:
    # Registered in every run, so `-m "not affinity"` is valid under --strict-markers.
    config.addinivalue_line("markers", MARKER)
    impl_spec = config.getoption("affinity_impl", default=None)
    if not impl_spec:
        return
    session = _Session(config, impl_spec)
    config.stash[_SESSION] = session
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        return
    # `affinity::margin::case` -> `<manifest>::margin::case`, unless the project really has
    # a file or folder named `affinity` where pytest was started.
    if (config.invocation_params.dir / ROOT_NAME).exists():
        return
    for index, arg in enumerate(config.args):
        if arg == ROOT_NAME or arg.startswith(ROOT_NAME + "::"):
            config.args[index] = str(session.anchor) + arg[len(ROOT_NAME):]
            session.named = True


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(_SESSION, None)
    if session is None:
        return []
    return [f"affinity: {session.impl_spec}; levels {', '.join(session.claims)}; tie-break "
            f"{session.checker.tie_mode}; vectors {session.vectors}; {session.traces} traces "
            f"from seed {session.seed}"]


def _suite(parent: pytest.Session | pytest.Dir, state: _Session) -> AffinitySuite:
    suite: AffinitySuite = AffinitySuite.from_parent(parent, path=state.anchor, name=ROOT_NAME,
                                                     nodeid=ROOT_NAME)
    return suite


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> AffinitySuite | None:
    """The suite, when the command line named it (see pytest_configure)."""
    state = parent.config.stash.get(_SESSION, None)
    if state is None or not state.named or file_path != state.anchor:
        return None
    if not isinstance(parent, (pytest.Session, pytest.Dir)):
        return None
    return _suite(parent, state)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
        collector: pytest.Collector) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """Adds the suite after the session's own top-level nodes, unless named on the command
    line (then pytest_collect_file provides it, and only the named part is collected)."""
    report = yield
    state = collector.config.stash.get(_SESSION, None)
    if (state is not None and not state.named and isinstance(collector, pytest.Session)
            and report.passed):
        report.result.append(_suite(collector, state))
    return report


class AffinitySuite(pytest.File):
    """The root node ``affinity``: the claimed vector suites, then the generated traces."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker(pytest.mark.affinity)  # inherited by every item below

    def collect(self) -> Iterator[pytest.Item | pytest.Collector]:
        state = self.config.stash[_SESSION]
        for suite, cases in state.vector_suites().items():
            yield VectorSuite.from_parent(self, name=suite, cases=cases)
        families = state.trace_families()
        if families:
            yield TraceSuite.from_parent(self, name="trace", families=families)


class VectorSuite(pytest.Collector):
    """One vector suite (``margin``, ``legacy``, ...): one item per claimed case."""

    def __init__(self, *, cases: list[Case], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cases = cases

    def collect(self) -> Iterator[pytest.Item]:
        checker = self.config.stash[_SESSION].checker
        for case in self.cases:
            yield AffinityItem.from_parent(self, name=case.name, path=Path(case.path),
                                           unit=partial(checker.case, case))


class TraceSuite(pytest.Collector):
    """The generated traces, one collector per family."""

    def __init__(self, *, families: dict[str, list[tuple[Family, int]]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.families = families

    def collect(self) -> Iterator[pytest.Collector]:
        for name, planned in self.families.items():
            yield TraceFamily.from_parent(self, name=name, planned=planned)


class TraceFamily(pytest.Collector):
    """The planned seeds of one family (``seed-<n>``)."""

    def __init__(self, *, planned: list[tuple[Family, int]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.planned = planned

    def collect(self) -> Iterator[pytest.Item]:
        checker = self.config.stash[_SESSION].checker
        for family, seed in self.planned:
            yield AffinityItem.from_parent(self, name=f"seed-{seed}",
                                           unit=partial(checker.trace, family, seed))


class AffinityItem(pytest.Item):
    """One vector or one generated trace."""

    def __init__(self, *, unit: Callable[[], Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unit = unit

    def runtest(self) -> None:
        self.config.stash[_SESSION].prepare_out(self.config)
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
        return self.path, None, self.nodeid
