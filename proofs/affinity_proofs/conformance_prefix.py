"""Encoding conformance of prefix-aware placement: the all-N encoding against the reference.

Theory of operation
-------------------
The lemmas of :mod:`.z3_prefix_lemmas` are about an encoding, and the encoding states
R-PFX-3's choice relationally. This sweep ties that encoding to ``affinity_core`` at
derandomised concrete points: pools of 1 to 6 servers, loads 0 to 4, estimates drawn from
few values (so equal estimates, and the load tie-break among them, are common), margins
null and 0 to 2, ``placement_margin`` null and 0 to 3, sticky misses, hits and hits on a
removed server, and ``full_determinism`` with caller hashes of either sign.

At each point the reference steps one keyed acquire and computes its ``allowed`` set. The
encoding is then fixed to the point (``n``, every load and estimate, the pin, the
policy, the hash) and asked, for every position ``q``, whether its decision can be ``q``.
The two must agree exactly: the reference's allowed set is the set of positions the
encoding permits. So a reference that drifts from the relation, and an encoding that
drifts from the reference, both show up here; :data:`SWEEP_MUTANTS` holds one of each,
and both must be refuted in the same run.
"""

from __future__ import annotations

import importlib
import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import attrs
import z3
from immutables import Map

import affinity_core.policy as reference_policy
from affinity_core import Acquire, Config, State, allowed

from .z3_prefix_lemmas import (
    PREFIX_MUTANTS,
    PREFIX_SPEC_PARTS,
    PrefixParts,
    PrefixPool,
    prefix_decide,
)

# The package's ``allowed`` attribute is the function, so the module is looked up by name.
reference_allowed = importlib.import_module("affinity_core.allowed")

__all__ = ["SWEEP_MUTANTS", "PrefixPoint", "SweepMutant", "SweepResult", "check_point",
           "points", "run", "run_with"]

RID = "conversation-7"
_CACHED = (0, 0, 16, 16, 48)


@attrs.frozen
class PrefixPoint:
    loads: tuple[int, ...]
    cached: tuple[int, ...]
    margin: int | None
    placement: int | None
    sticky: str  # "miss", "hit" (on ``pin``) or "removed"
    pin: int
    det: bool
    request_hash: int


def points(count: int, seed: int = 8) -> list[PrefixPoint]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randrange(1, 7)
        out.append(PrefixPoint(
            tuple(rng.randrange(5) for _ in range(n)),
            tuple(rng.choice(_CACHED) for _ in range(n)),
            rng.choice((None, 0, 1, 2)), rng.choice((None, 0, 1, 2, 3, 3)),
            rng.choice(("miss", "hit", "hit", "removed")), rng.randrange(n),
            rng.random() < 0.1, rng.randrange(-50, 50)))
    return out


def _reference(p: PrefixPoint) -> tuple[Config, frozenset[int]]:
    """The positions the reference permits for the point's acquire."""
    servers = tuple(f"s{i}" for i in range(len(p.loads)))
    config = Config(affinity_break_margin=p.margin, placement_margin=p.placement,
                    full_determinism=p.det, max_cache_size=4)
    sticky: tuple[tuple[str, str], ...] = ()
    if p.sticky != "miss":
        sticky = ((RID, "gone" if p.sticky == "removed" else servers[p.pin]),)
    state = State(pool=servers, inflight=Map(zip(servers, p.loads, strict=True)),
                  sticky=sticky)
    event = Acquire(request_id=RID, request_hash=p.request_hash if p.det else None,
                    cached_prefix=tuple(zip(servers, p.cached, strict=True)))
    permitted = allowed(config, state, event)
    return config, frozenset(servers.index(s) for s in permitted)


def _encoded(p: PrefixPoint, parts: PrefixParts) -> frozenset[int]:
    """The positions the encoding's decision can take at the point."""
    pp = PrefixPool()
    q = pp.p
    d = prefix_decide(pp, parts)
    solver = z3.Solver()
    solver.set(timeout=10_000)
    n = len(p.loads)
    solver.add(pp.domain(), d.constraints, q.n == n, z3.Not(q.gate_on),
               q.margin_on == (p.margin is not None), q.margin == (p.margin or 0),
               pp.mp_on == (p.placement is not None), pp.mp == (p.placement or 0),
               q.det == p.det, q.hash == p.request_hash,
               q.hit == (p.sticky == "hit"), q.pin == p.pin)
    for i in range(n):
        solver.add(q.loads[i] == p.loads[i], pp.cached[i] == p.cached[i])
    out = set()
    for position in range(n):
        solver.push()
        solver.add(d.choice == position)
        if solver.check() == z3.sat:
            out.add(position)
        solver.pop()
    return frozenset(out)


def check_point(p: PrefixPoint, parts: PrefixParts = PREFIX_SPEC_PARTS) -> str | None:
    _, reference = _reference(p)
    encoded = _encoded(p, parts)
    if reference != encoded:
        return (f"{p}: the reference permits positions {sorted(reference)}, the encoding "
                f"{sorted(encoded)}")
    return None


@attrs.frozen
class SweepResult:
    points: int
    seconds: float
    failure: str | None


def run(count: int, parts: PrefixParts = PREFIX_SPEC_PARTS) -> SweepResult:
    start = time.perf_counter()
    checked = 0
    for point in points(count):
        checked += 1
        failure = check_point(point, parts)
        if failure is not None:
            return SweepResult(checked, time.perf_counter() - start, failure)
    return SweepResult(checked, time.perf_counter() - start, None)


# ------------------------------------------------------------------------- controls
@contextmanager
def _reference_patched(candidates: Callable[..., tuple[str, ...]]) -> Iterator[None]:
    """The reference's candidates replaced where the machine and ``allowed`` read them."""
    original = reference_policy.candidates
    reference_policy.candidates = candidates
    setattr(reference_allowed, "candidates", candidates)  # noqa: B010 (a module by name)
    try:
        yield
    finally:
        reference_policy.candidates = original
        setattr(reference_allowed, "candidates", original)  # noqa: B010


def _candidates_ignore_load(config: Config, state: State, event: Acquire,
                            moving_from: str | None = None) -> tuple[str, ...]:
    if not config.prefix_placement:
        return reference_policy.tie_set(state)
    estimate = dict(event.cached_prefix)
    servers = reference_policy.admissible(config, state, moving_from)
    most = max(estimate.get(s, 0) for s in servers)
    return tuple(s for s in servers if estimate.get(s, 0) == most)


@attrs.frozen
class SweepMutant:
    name: str
    description: str
    parts: PrefixParts
    applied: Callable[[], AbstractContextManager[None]]


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _encoded_mutant(name: str) -> PrefixParts:
    parts = PREFIX_MUTANTS[name][0].parts
    assert isinstance(parts, PrefixParts)
    return parts


SWEEP_MUTANTS: tuple[SweepMutant, ...] = (
    SweepMutant("prefix_reference_ignores_load",
                "the reference's candidates keep every best-cached server, whatever its "
                "load (R-PFX-3)", PREFIX_SPEC_PARTS,
                lambda: _reference_patched(_candidates_ignore_load)),
    SweepMutant("prefix_load_first", PREFIX_MUTANTS["prefix_load_first"][1],
                _encoded_mutant("prefix_load_first"), _nothing),
)


def run_with(mutant: SweepMutant, count: int) -> SweepResult:
    """The sweep with one control applied (to the reference, or to the encoding)."""
    with mutant.applied():
        return run(count, mutant.parts)
