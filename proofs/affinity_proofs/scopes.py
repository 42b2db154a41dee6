"""The three scopes of ``affinity verify``: small (tests), default (CI), deep.

Durations (wall clock, 2 workers on a quiet 2-core machine): default 50-60 s (the
recorded run is ``proofs/verify-default.json``; a fresh clone, compiling its sources,
is at the top), small less, deep 10-12 minutes.

Theory of operation
-------------------
A scope fixes every bound of every method: the server counts ``N`` of each Z3 lemma, the
BMC depth, the number of concrete points of the encoding-conformance sweep, the BFS
universes and configurations, and the CrossHair time budgets. Nothing else in the suite
chooses a bound, so the report's "scope" column is exactly what was checked.

BFS runs. Each :class:`BfsRun` is one configuration over one universe (servers, request
ids, whether unkeyed requests occur), a load cap, and an environment (see
:mod:`.bfs_envs`). The default scope spends its three-server runs on the rules where a
third server matters (margins, legacy lockstep, stable hashing) and covers the others
with two servers and three request ids. ``symmetry=True`` is used only with ``draw`` ties
(all tie choices enumerated, formal-methods.md section 9).
"""

from __future__ import annotations

from fractions import Fraction

import attrs

from affinity_engine import Config, DualThreshold

from .bfs_envs import Universe

__all__ = ["SCOPES", "BfsRun", "Scope", "scope_named"]


@attrs.frozen
class BfsRun:
    label: str
    config: Config
    universe: Universe
    load_cap: int
    lease_cap: int = 4
    symmetry: bool = False
    # "free", "in_flight", "in_flight+add_active", "in_flight+remove_busy",
    # "lease", "lease+ambiguous"
    env: str = "free"

    @property
    def expects_violation(self) -> bool:
        """Hazard runs: the documented exception must be *found*."""
        return "+" in self.env

    def describe(self) -> str:
        u = self.universe
        keys = len(u.request_ids) + (1 if u.unkeyed else 0)
        sym = ", symmetry" if self.symmetry else ""
        observe = f", observed loads 0..{u.observe_max}" if u.observe_max else ""
        return (f"{len(u.servers)} servers, {keys} request ids"
                f"{' (incl. unkeyed)' if u.unkeyed else ''}, loads <= {self.load_cap}, "
                f"cache {self.config.max_cache_size}{sym}{observe}")


@attrs.frozen
class Scope:
    name: str
    fact_ns: tuple[int, ...]  # the bounded Z3 facts' witnesses (z3_lemmas.py)
    mutant_n: int  # encoded mutants are refuted at this N
    bmc_depth: int  # per-decision skew BMC (UNSAT expected)
    conformance_sample: int  # seeded points at N = 3, 4 (N <= 2 is exhaustive)
    bfs_runs: tuple[BfsRun, ...]
    symmetry_check: BfsRun  # explored without reduction, orbits counted
    crosshair_condition_timeout: float
    crosshair_diff_timeout: float
    # CPU seconds any one job may use (wall-clock cap: 4x + 30 s); past it the job is
    # killed and its row FAILs (budget.py). About 10x the slowest job on an idle machine.
    job_budget: float = 120.0
    # Obligation 15's decision table: loads 0..this over 1-3 servers (decision_table.py).
    decision_table_max: int = 4
    # Beyond the small world (jobs_param.py): Hypothesis points of the wide encoding
    # conformance sweep, and operations per size of the data-structure checks.
    wide_conformance_points: int = 250
    # Concrete points of prefix-aware placement's encoding sweep (conformance_prefix.py).
    prefix_sweep_points: int = 150
    structure_operations: int = 400
    # Obligation 21's wide traces: events per trace on pools of up to 64 servers (an
    # eighth of it on the large pools; refinement.py).
    refinement_steps: int = 300


def _u(n: int, keys: str, unkeyed: bool = True) -> Universe:
    servers = tuple(f"s{i}" for i in range(n))
    return Universe(servers, servers, tuple(keys), unkeyed)


GATE = DualThreshold(1, Fraction(3, 2))
FLAT_GATE = DualThreshold(1, Fraction(1))


def _cfg(**kw: object) -> Config:
    kw.setdefault("max_cache_size", 2)
    return Config(**kw)  # type: ignore[arg-type]


def _runs(big: Universe, wide: Universe, cap: int, cache: int, lease: Universe,
          lease_keyed: Universe, lease_cap: int, big_gate: bool = False,
          big_lockstep: bool = False, observed: Universe | None = None,
          wide_cap: int | None = None, band: Universe | None = None,
          tall: Universe | None = None) -> tuple[BfsRun, ...]:
    """The BFS runs of a scope. ``big``: the 3-server universe (runs where a third server
    matters); ``wide``: 2 servers with more request ids (eviction, unkeyed requests);
    ``band``: the context band's second universe (each acquire comes with six contexts);
    ``tall``: the universe of the runs that need loads one above ``cap`` (a margin of 2,
    the 3/2 gate), ``wide`` unless given."""
    observed = observed or attrs.evolve(_u(2, "ab", False), observe_max=1)
    band = band or _u(2, "ab")
    band_det = _u(2, "a", False)
    wcap = cap if wide_cap is None else wide_cap
    tall = tall or wide

    def c(**kw: object) -> Config:
        kw.setdefault("max_cache_size", cache)
        return _cfg(**kw)

    return (
        BfsRun("legacy, first ties", c(), *((big, cap) if big_lockstep else (wide, wcap))),
        BfsRun("legacy, draw ties", c(tie_break="draw"), big, cap, symmetry=True),
        BfsRun("legacy, full_determinism caller", c(full_determinism=True), wide, wcap),
        BfsRun("margin 0, first ties", c(affinity_break_margin=0), wide, wcap),
        BfsRun("margin 1, first ties", c(affinity_break_margin=1), big, cap),
        BfsRun("margin 2, first ties", c(affinity_break_margin=2), tall, max(wcap, cap + 1)),
        BfsRun("margin 1, draw ties", c(affinity_break_margin=1, tie_break="draw"),
               *((big, cap) if big_lockstep else (wide, wcap)), symmetry=True),
        BfsRun("margin 1, hashed ties", c(affinity_break_margin=1, tie_break="hashed"), wide,
               wcap),
        # Three servers: h mod 3 tells a floored mod from abs(h) mod 3 (R-DET-2); decisions
        # ignore load under full_determinism, so a lower load cap loses nothing there.
        BfsRun("margin 1, full_determinism caller",
               c(affinity_break_margin=1, full_determinism=True), big, max(cap - 1, 1)),
        # Under full_determinism decisions ignore load: the hash and pool order matter.
        BfsRun("margin 0, full_determinism stable",
               c(affinity_break_margin=0, full_determinism=True, hash_mode="stable"), big,
               max(cap - 1, 1)),
        BfsRun("margin 1, observed loads", c(affinity_break_margin=1), observed, cap),
        BfsRun("gate abs 1 rel 3/2", c(dual_threshold=GATE), tall, max(wcap, cap + 1)),
        BfsRun("gate abs 1 rel 1", c(dual_threshold=FLAT_GATE),
               *((big, cap) if big_gate else (wide, wcap))),
        BfsRun("legacy, leases", c(lease_accounting=True), lease, cap, lease_cap),
        BfsRun("margin 1, leases", c(affinity_break_margin=1, lease_accounting=True),
               lease_keyed, cap, lease_cap),
        BfsRun("margin 1, well-formed traces", c(affinity_break_margin=1), wide, wcap,
               env="in_flight"),
        BfsRun("hazard: add on active server", c(affinity_break_margin=1), wide, wcap,
               env="in_flight+add_active"),
        BfsRun("hazard: busy remove, late release", c(affinity_break_margin=1), wide, wcap,
               env="in_flight+remove_busy"),
        BfsRun("margin 1, leases vs grants", c(affinity_break_margin=1, lease_accounting=True),
               lease_keyed, cap, lease_cap, env="lease"),
        BfsRun("limit: ambiguous lease releases",
               c(affinity_break_margin=1, lease_accounting=True), lease_keyed, cap, lease_cap,
               env="lease+ambiguous"),
        # The context band (obligation 20): each acquire with the contexts absent, 0, T - 1,
        # T, 2T, 10^9. m 0 / T 2 / cap 1 reaches the cap at c = 2T (load 2 at min 0 tells
        # the cap from m + c // T = 2); m 1 / T 2 / cap 2 widens above a margin >= 1; under
        # full_determinism a pin at min + 1 is kept only because the band is ignored (m 0).
        BfsRun("band m0 T2 cap1", c(affinity_break_margin=0, affinity_break_tokens=2,
                                    affinity_break_band_cap=1), band, wcap),
        BfsRun("band m1 T2 cap2", c(affinity_break_margin=1, affinity_break_tokens=2,
                                    affinity_break_band_cap=2), band, cap),
        BfsRun("band m0 T2 cap1, full_determinism caller",
               c(affinity_break_margin=0, affinity_break_tokens=2, affinity_break_band_cap=1,
                 full_determinism=True), band_det, max(cap - 1, 1)),
    )


SMALL = Scope(
    name="small",
    fact_ns=(2, 3), mutant_n=3,
    bmc_depth=4, conformance_sample=40,
    bfs_runs=_runs(_u(2, "ab", False), _u(2, "abc", False), 2, 2, _u(2, "a"), _u(2, "a"), 2,
                   tall=_u(2, "ab", False)),
    symmetry_check=BfsRun("margin 1, draw ties", _cfg(affinity_break_margin=1,
                                                      tie_break="draw"),
                          _u(2, "ab"), 2),
    crosshair_condition_timeout=0.5, crosshair_diff_timeout=1.5, job_budget=60.0,
    decision_table_max=3,
    wide_conformance_points=120, structure_operations=100, prefix_sweep_points=60,
)

DEFAULT = Scope(
    name="default",
    fact_ns=(2, 3, 4), mutant_n=3,
    bmc_depth=8, conformance_sample=200,
    bfs_runs=_runs(_u(3, "ab", False), _u(2, "abc"), 2, 2, _u(2, "a"), _u(2, "a"), 2),
    symmetry_check=BfsRun("margin 1, draw ties", _cfg(affinity_break_margin=1,
                                                      tie_break="draw"),
                          _u(2, "abc"), 2),
    crosshair_condition_timeout=0.75, crosshair_diff_timeout=2.0, job_budget=120.0,
)

DEEP = Scope(
    name="deep",
    fact_ns=tuple(range(2, 9)), mutant_n=4,
    bmc_depth=12, conformance_sample=3000,
    # Per run: 3 servers x 3 ids at loads <= 2 and cache 3 is ~100,000-200,000 states
    # (~75 s CPU); the 2-server runs reach loads <= 3 with 4 ids and an unkeyed id.
    bfs_runs=_runs(_u(3, "abc", False), _u(2, "abcd"), 2, 3, _u(2, "ab"), _u(2, "ab", False),
                   3, big_gate=True, big_lockstep=True,
                   observed=attrs.evolve(_u(2, "abc"), observe_max=2), wide_cap=3),
    symmetry_check=BfsRun("margin 1, draw ties", _cfg(affinity_break_margin=1,
                                                      tie_break="draw"),
                          _u(3, "ab", False), 2),
    crosshair_condition_timeout=5.0, crosshair_diff_timeout=20.0, job_budget=900.0,
    decision_table_max=7,
    wide_conformance_points=3000, structure_operations=1000, prefix_sweep_points=1500,
)

SCOPES = {s.name: s for s in (SMALL, DEFAULT, DEEP)}


def scope_named(name: str) -> Scope:
    try:
        return SCOPES[name]
    except KeyError:
        raise ValueError(f"scope must be one of {sorted(SCOPES)}, got {name!r}") from None
