"""BFS work units: one scope run (spec or mutant), picklable for worker processes.

Theory of operation
-------------------
:func:`run_spec` explores one :class:`~affinity_proofs.scopes.BfsRun` with every check
that applies (the shared :data:`~affinity_proofs.bfs_checks.CHECKS` plus the
environment's ground-truth check) and reports the violations per obligation. Every run
stops at its first violation (a domain violation or a crash of ``step`` included, see
:mod:`.bfs`). Hazard and limit runs (``expects_violation``) must *find* one: there the
absence of a violation is the failure, because the spec states the exception.

:func:`run_mutant` applies one mutant of :mod:`.mutants` to the real core and searches the
obligation's runs, in scope order, with only that obligation's checks, stopping at the
first violation: the shortest counterexample, or nothing (the mutant survived).

:func:`symmetry_sound` compares a run with symmetry reduction against the orbit count of
the same run without it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from affinity_engine import Event

from .bfs import BfsResult, Check, Environment, Violation, explore
from .bfs_checks import CHECKS, checks_for, in_flight_check, lease_ground_truth_check
from .bfs_envs import FreeEnv, InFlightEnv, LeaseEnv
from .mutants import by_name
from .scopes import BfsRun

__all__ = ["MutantSearch", "describe_trace", "env_of", "run_mutant", "run_spec",
           "runs_for", "symmetry_sound"]


def env_of(run: BfsRun) -> tuple[Environment, tuple[Check, ...]]:
    u, cap = run.universe, run.load_cap
    if run.env == "free":
        return FreeEnv(u), ()
    if run.env.startswith("in_flight"):
        env = InFlightEnv(u, cap, add_active="add_active" in run.env,
                          remove_busy="remove_busy" in run.env)
        return env, (in_flight_check(u.servers),)
    if run.env.startswith("lease"):
        return LeaseEnv(u, run.lease_cap, attributable_only="ambiguous" not in run.env), (
            lease_ground_truth_check(),)
    raise ValueError(f"unknown environment {run.env!r}")


# A mutant may enlarge the state space; a search this large has failed to refute it.
MUTANT_MAX_STATES = 200_000


def _explore(run: BfsRun, checks: Sequence[Check], *, stop_on_first: bool,
             count_orbits: bool = False, symmetry: bool | None = None,
             max_states: int = 2_000_000, raises_by_design: bool = False) -> BfsResult:
    env, _ = env_of(run)
    return explore(run.config, run.universe.servers, run.universe.initial_pool, env, checks,
                   load_cap=run.load_cap, lease_cap=run.lease_cap,
                   symmetry=run.symmetry if symmetry is None else symmetry,
                   stop_on_first=stop_on_first, count_orbits=count_orbits,
                   max_states=max_states, control_raises_by_design=raises_by_design)


def run_spec(run: BfsRun) -> BfsResult:
    _, env_checks = env_of(run)
    if run.expects_violation:
        return _explore(run, env_checks, stop_on_first=True)
    # Fail fast: the first violation stops the run with its shortest counterexample.
    return _explore(run, (*CHECKS, *env_checks), stop_on_first=True)


def _size(run: BfsRun) -> tuple[bool, int, int, int]:
    """Plain configurations first (lease mode changes release semantics), then small."""
    u = run.universe
    return (run.config.lease_accounting, len(u.servers), run.load_cap,
            len(u.request_ids) + u.unkeyed)


def runs_for(obligation: int, runs: Sequence[BfsRun], smallest_first: bool = False
             ) -> list[BfsRun]:
    """The runs in which some check of ``obligation`` applies (hazard runs excluded);
    ``smallest_first`` orders them by universe size, for mutant searches."""
    out = []
    for run in runs:
        if run.expects_violation:
            continue
        _, env_checks = env_of(run)
        checks = [*checks_for([obligation]), *[c for c in env_checks
                                                if c.obligation == obligation]]
        if any(c.applies(run.config) for c in checks):
            out.append(run)
    return sorted(out, key=_size) if smallest_first else out


@attrs.frozen
class MutantSearch:
    mutant: str
    obligation: int
    violation: Violation | None
    run_label: str | None
    states: int
    seconds: float


def run_mutant(mutant: str, obligation: int, runs: Sequence[BfsRun],
               env_only: bool = False) -> MutantSearch:
    """Search the obligation's runs for a violation with ``mutant`` applied.

    ``env_only`` restricts the search to runs with an environment ground truth (so the
    in-flight and lease rows get their own refutations)."""
    states, seconds = 0, 0.0
    with by_name(mutant).applied():
        for run in runs_for(obligation, runs, smallest_first=True):
            if env_only and run.env == "free":
                continue
            _, env_checks = env_of(run)
            checks = [*([] if env_only else checks_for([obligation])),
                      *[c for c in env_checks if c.obligation == obligation]]
            if not any(c.applies(run.config) for c in checks):
                continue
            result = _explore(run, checks, stop_on_first=True, max_states=MUTANT_MAX_STATES,
                              raises_by_design=by_name(mutant).raises_by_design)
            states += result.states
            seconds += result.seconds
            if result.violations:
                return MutantSearch(mutant, obligation, result.violations[0], run.label,
                                    states, seconds)
    return MutantSearch(mutant, obligation, None, None, states, seconds)


def symmetry_sound(run: BfsRun) -> tuple[bool, int, int, float]:
    """(reduced states == orbits of the full space, reduced, orbits, seconds)."""
    reduced = _explore(run, (), stop_on_first=False, symmetry=True)
    full = _explore(run, (), stop_on_first=False, symmetry=False, count_orbits=True)
    orbits = full.orbits or 0
    return reduced.states == orbits, reduced.states, orbits, reduced.seconds + full.seconds


def _show(event: Event) -> str:
    from affinity_engine.codec import event_to_json

    data = event_to_json(event)
    op = data.pop("op")
    args = " ".join(f"{k}={v}" for k, v in sorted(data.items()))
    return f"{op}({args})" if args else op


def describe_trace(v: Violation) -> str:
    """A one-line shortest trace: ``config | event; event; ... => check: message``."""
    steps = []
    for event, label in zip(v.trace, v.labels, strict=True):
        note = f" [{label}]" if isinstance(label, str) and label not in (
            "acquire", "release", "add", "remove", "clear") else ""
        if isinstance(label, tuple) and label and label[0] == "bogus":
            note = " [bogus]"
        steps.append(_show(event) + note)
    c = v.config
    cfg = (f"margin={c.affinity_break_margin} ties={c.tie_break.value} "
           f"det={c.full_determinism} cache={c.max_cache_size}"
           f"{' leases' if c.lease_accounting else ''}"
           f"{' gate' if c.dual_threshold is not None else ''}")
    return f"[{cfg}] " + "; ".join(steps) + f" => {v.check}: {v.message}"
