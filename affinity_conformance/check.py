"""``affinity check IMPL``: vectors, then generated traces, against an implementation.

Theory of operation
-------------------
1. Load the implementation (:func:`~affinity_conformance.impl_loader.load_impl`): its
   constructor convention and features.
2. Replay every vector of ``spec/vectors/`` (parsed and digest-checked first, so a
   malformed or edited vector is reported as such). A case whose ``features`` the
   implementation lacks is *unsupported*; a construction rejection passes iff the
   constructor raises; any other case runs in :class:`~affinity_conformance.lockstep.
   Lockstep` with a fresh instance.
3. Run ``budget`` generated traces (:data:`~affinity_conformance.trace_gen.FAMILIES`,
   SplitMix64 seeds ``seed``, ``seed + 1``, ...) over the families the implementation
   supports, round robin.
4. Every failure is shrunk (delta debugging: drop chunks of events while the
   implementation still diverges), re-run to find its first divergent step, and written
   as a vector file whose expectations come from the core, so it can be replayed and
   added to the regressions.

A suite's or a level's verdict is ``fail`` if any case or trace failed, ``pass`` if at
least one ran and none failed, ``unsupported`` if nothing could run. The overall verdict
is ``pass`` iff every *claimed* level passes (:mod:`affinity_conformance.levels`).
:class:`Checker` runs one case or one trace at a time, so the pytest plugin
(:mod:`affinity_conformance.pytest_plugin`) reports the same diagnoses test by test.
Python's global ``random`` (which verl 0.9.1 uses for ties) is seeded per case from
``seed`` and restored afterwards, so a run is reproducible. The report types and the
vector loader live in :mod:`affinity_conformance.check_report` (re-exported here).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from affinity_engine import Config, Event, initial_state

from .check_report import CheckReport, Failure, SuiteResult, load_vectors
from .diagnosis import describe_event
from .impl_loader import Impl, load_impl
from .levels import LevelResult, check_claims, default_claims, family_levels
from .lockstep import Divergence, Lockstep, impl_tie_option, oracle_config
from .scenario import Scenario, features_of
from .shipped import shipped_vectors
from .trace_gen import FAMILIES, Family, SplitMix64, random_trace
from .vector_format import LEVELS, STRICT_CONFIG, SUITES, Case, EventStep, case_text, seal

__all__ = ["DEFAULT_VECTORS", "CaseResult", "CheckReport", "Checker", "Failure", "SuiteResult",
           "load_vectors", "run_check", "shrink"]

DEFAULT_VECTORS = shipped_vectors()  # spec/vectors/, as shipped in the package
TRACE_LENGTH = 40


def _fresh(case: Case) -> bool:
    state = case.initial_state
    assert state is not None and case.config is not None
    return state == initial_state(case.config, case.server_ids)


def _events(case: Case) -> list[Event]:
    return [s.event for s in case.steps if isinstance(s, EventStep) and s.event is not None]


# ------------------------------------------------------------------ shrinking
def shrink(events: Sequence[Event], fails: Callable[[Sequence[Event]], bool],
           max_runs: int = 3000) -> list[Event]:
    """Delta debugging (ddmin): drop chunks of events while ``fails`` stays true."""
    current = list(events)
    chunks = 2
    runs = 0
    while len(current) >= 2 and runs < max_runs:
        size = -(-len(current) // chunks)
        for start in range(0, len(current), size):
            candidate = current[:start] + current[start + size:]
            runs += 1
            if fails(candidate):
                current = candidate
                chunks = max(chunks - 1, 2)
                break
        else:
            if size == 1:
                break
            chunks = min(len(current), chunks * 2)
    return current


@attrs.frozen
class CaseResult:
    """The result of one vector or one generated trace."""

    verdict: str  # "pass" | "fail" | "unsupported"
    failure: Failure | None = None
    missing: frozenset[str] = frozenset()
    random_ties: int = 0


class Checker:
    """Runs vectors and generated traces against one implementation; shrinks failures."""

    def __init__(self, impl: Impl, tie_mode: str = "any", seed: int = 1,
                 out_dir: Path | None = None, trace_length: int = TRACE_LENGTH) -> None:
        self.impl, self.tie_mode, self.seed, self.out_dir = impl, tie_mode, seed, out_dir
        self.trace_length = trace_length
        self.written = 0

    # ------------------------------------------------------------- one unit
    def case(self, case: Case) -> CaseResult:
        """Replay one vector (seeding Python's ``random`` and restoring it afterwards)."""
        missing = frozenset(self.impl.notes.get(f, f)
                            for f in set(case.features) - self.impl.features)
        if missing:
            return CaseResult("unsupported", missing=missing)
        saved = random.getstate()
        try:
            if not case.valid:
                return self._rejection(case)
            if not _fresh(case):
                return CaseResult("unsupported", missing=frozenset({"initial state injection"}))
            assert case.config is not None
            origin = f"vector {case.suite}/{case.name}.json"
            events = _events(case)
            divergence, lockstep = self.run(case.config, case.server_ids, events, origin)
            ties = lockstep.random_ties if lockstep is not None else 0
            if divergence is None:
                return CaseResult("pass", random_ties=ties)
            return CaseResult("fail", self.failure(case.suite, case.config, case.server_ids,
                                                   events, origin, divergence))
        finally:
            random.setstate(saved)

    def families(self, suites: Sequence[str] | None = None) -> list[Family]:
        """The trace families the implementation supports (in the given suites)."""
        return [f for f in FAMILIES if (suites is None or f.suite in suites)
                and _family_features(f) <= self.impl.features]

    @staticmethod
    def family_levels(family: Family) -> list[str]:
        """The conformance levels a generated trace of ``family`` counts toward."""
        return family_levels(_family_features(family))

    def trace(self, family: Family, trace_seed: int) -> CaseResult:
        """One generated trace of ``family`` from SplitMix64 seed ``trace_seed``."""
        events = random_trace(family, SplitMix64(trace_seed), self.trace_length)
        origin = f"trace {family.name} seed {trace_seed}"
        config, servers = family.config(), list(family.servers)
        saved = random.getstate()
        try:
            divergence, lockstep = self.run(config, servers, events, origin)
            if divergence is None:
                return CaseResult("pass", random_ties=lockstep.random_ties if lockstep else 0)
            return CaseResult("fail", self.failure(family.suite, config, servers, events,
                                                   origin, divergence))
        finally:
            random.setstate(saved)

    # ------------------------------------------------------------- machinery
    def run(self, config: Config, servers: list[str], events: Sequence[Event],
            origin: str) -> tuple[Divergence | None, Lockstep | None]:
        random.seed(f"{self.seed}:{origin}")
        oracle = oracle_config(config, self.tie_mode)
        options = self.impl.options_for(config, impl_tie_option(config, self.tie_mode))
        try:
            instance = self.impl.build(servers, options)
        except Exception as exc:
            words = (f"the constructor refused a valid configuration {options}: "
                     f"{type(exc).__name__}: {exc}")
            return Divergence(-1, "construction", words, ("R-CFG-1",), ()), None
        lockstep = Lockstep(self.impl, instance, oracle, servers, self.tie_mode)
        return lockstep.feed(events), lockstep

    def failure(self, suite: str, config: Config, servers: list[str], events: Sequence[Event],
                origin: str, divergence: Divergence) -> Failure:
        if divergence.index < 0:
            return Failure(suite, origin, divergence, (), len(events), None)
        prefix = list(events[: divergence.index + 1])
        minimal = shrink(prefix, lambda ev: self.run(config, servers, ev, origin)[0] is not None)
        final, lockstep = self.run(config, servers, minimal, origin)
        if final is None or lockstep is None:  # flaky implementation: keep the prefix
            minimal = prefix
            final, lockstep = self.run(config, servers, minimal, origin)
        assert final is not None
        path = self._write(suite, origin, servers, lockstep, final) if lockstep else None
        return Failure(suite, origin, final, tuple(describe_event(e) for e in minimal),
                       len(events), path)

    def _write(self, suite: str, origin: str, servers: list[str], lockstep: Lockstep,
               divergence: Divergence) -> str | None:
        if self.out_dir is None:
            return None
        self.written += 1
        name = f"check_{suite}_{self.written:03d}"
        run = Scenario("regressions", name, f"affinity check {self.impl.spec} ({origin}): "
                       f"{divergence.render()}", requirements=divergence.requirements,
                       servers=servers, source="regression", config=lockstep.config)
        for event in [*lockstep.fed, *([lockstep.current] if lockstep.current else [])]:
            run.apply(event)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{name}.json"
        path.write_text(case_text(seal(run.build())), encoding="utf-8")
        return str(path)

    def _rejection(self, case: Case) -> CaseResult:
        options = _rejection_options(self.impl, case.raw_config)
        if options is None:
            return CaseResult("unsupported", missing=frozenset({"gate as one object"}))
        try:
            self.impl.build(case.server_ids, options)
        except Exception:
            return CaseResult("pass")
        assert case.error is not None
        what = (f"configuration {json.dumps(case.raw_config)}" if case.error["stage"] == "config"
                else f"server list {case.server_ids!r}")
        words = (f"the constructor accepted the {what}; the spec refuses it, naming "
                 f"{case.error['key']!r}")
        return CaseResult("fail", Failure(
            case.suite, f"vector {case.suite}/{case.name}.json",
            Divergence(-1, "construction", words, case.requirements, ()), (), 0, case.path,
            strict_config=STRICT_CONFIG in case.levels))


def _rejection_options(impl: Impl, raw: dict[str, Any]) -> dict[str, Any] | None:
    options: dict[str, Any] = {}
    for key, value in raw.items():
        if key != "dual_threshold":
            options[key] = value
        elif value is None:
            continue
        elif impl.gate_style == "object":
            options["dual_threshold"] = value
        elif isinstance(value, dict):
            options.update(value)
        else:
            return None  # not expressible in balance_*_threshold keywords
    options.setdefault("max_cache_size", 10000)
    return options


def _family_features(family: Family) -> set[str]:
    needed = set(features_of(family.config(), [], []))
    if family.unkeyed_percent:
        needed.add("unkeyed")
    if family.observe_percent:
        needed.add("observe_loads")
    if family.contexts:  # acquires carry context_tokens even where the band is off
        needed.add("context_band")
    if None in family.groups:  # keyed acquires without a group id (R-GRP-7)
        needed.add("group_optional")
    return needed


def trace_plan(families: Sequence[Family], budget: int, seed: int) -> list[tuple[Family, int]]:
    """``budget`` (family, seed) pairs: families round robin, seeds ``seed, seed + 1, ...``."""
    return [(families[i % len(families)], seed + i) for i in range(budget if families else 0)]


def _tally(suite: SuiteResult, levels: dict[str, LevelResult], names: Sequence[str],
           result: CaseResult, trace: bool) -> None:
    targets: list[SuiteResult | LevelResult] = [suite]
    targets += [levels.setdefault(n, LevelResult(n)) for n in names]
    for target in targets:
        if result.verdict == "unsupported":
            target.unsupported += 1
            target.missing |= result.missing
        elif trace:
            target.traces_passed += result.verdict == "pass"
            target.traces_failed += result.verdict == "fail"
        else:
            target.passed += result.verdict == "pass"
            target.failed += result.verdict == "fail"
        if isinstance(target, LevelResult):
            target.random_ties += result.random_ties
    if result.failure is not None:
        suite.failures.append(result.failure)


def run_check(spec: str, *, vectors_dir: Path = DEFAULT_VECTORS, tie_mode: str = "any",
              budget: int = 200, seed: int = 1, ctor: str = "auto",
              out_dir: Path | None = None, trace_length: int = TRACE_LENGTH,
              suites: Sequence[str] | None = None,
              levels: Sequence[str] | None = None) -> CheckReport:
    """Check ``spec`` (``module:Class``); see the module docstring. ``levels`` are the
    claimed levels (default: core and every supported feature level that ran)."""
    started = time.monotonic()
    claimed = check_claims(levels) if levels else None
    impl = load_impl(spec, ctor)
    cases = load_vectors(vectors_dir)
    wanted = set(suites) if suites else None
    results = {s: SuiteResult(s) for s in SUITES if wanted is None or s in wanted}
    by_level: dict[str, LevelResult] = {}
    checker = Checker(impl, tie_mode, seed, out_dir, trace_length)
    for case in cases:
        if case.suite in results:
            _tally(results[case.suite], by_level, case.levels, checker.case(case), trace=False)
    failed_families: set[str] = set()
    for family, trace_seed in trace_plan(checker.families(list(results)), budget, seed):
        if family.name in failed_families:  # one failure per family is enough
            continue
        result = checker.trace(family, trace_seed)
        if result.verdict == "fail":
            failed_families.add(family.name)
        _tally(results[family.suite], by_level, family_levels(_family_features(family)),
               result, trace=True)
    ordered = {name: by_level[name] for name in LEVELS if name in by_level}
    return CheckReport(spec, impl.convention, sorted(impl.features), tie_mode, budget, seed,
                       str(vectors_dir), results, ordered,
                       claimed if claimed is not None else default_claims(ordered, impl.features),
                       time.monotonic() - started)
