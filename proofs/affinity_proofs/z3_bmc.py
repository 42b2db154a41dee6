"""Bounded model checking with Z3: traces of acquires and adversarial releases.

Theory of operation
-------------------
A trace of ``depth`` steps starts from an idle pool of ``n`` servers and an empty sticky
map over ``keys`` request ids. Each step is either an acquire of some key -- decided by
:func:`~affinity_proofs.z3_model.decide` with first-in-order ties, the encoding that
:mod:`.conformance` checks against the real core -- or a release of a server whose count
is positive (releases of idle servers are no-ops and only lengthen traces). The sticky
map never evicts (``max_cache_size`` is at least ``keys``) and the pool is fixed, so the
encoding stays small; pool changes and eviction are the BFS checker's job.

Two bad-state predicates:

* ``decision_skew``: some acquire lands on a server whose pre-increment load exceeds
  ``min + band`` (R-SKEW-1 for the margin rule; R-SKEW-4's witness for the legacy rule);
* ``global_skew``: after the last step ``max - min > bound`` (R-SKEW-4: a fact for every
  rule, because releases are chosen by the environment).

:func:`shortest_trace` deepens ``depth`` from 1, so a witness is a shortest one, and then
fixes it to the lexicographically least trace of that length (acquire before release,
smaller key or server first), which makes it reproducible; no witness up to the limit is
a bounded proof.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import z3

from .z3_model import SPEC_PARTS, AcquireVars, Parts, decide, select, zmax, zmin

__all__ = ["BmcResult", "BmcStep", "shortest_trace"]

Term = Any


@attrs.frozen
class BmcStep:
    op: str  # "acquire" | "release"
    index: int  # request key for acquire, server for release
    server: int  # the chosen (acquire) or released server
    path: str  # "new" | "kept" | "broken" | "" for releases
    loads_before: tuple[int, ...]


@attrs.frozen
class BmcResult:
    found: bool
    depth: int  # length of the witness, or the largest depth searched
    seconds: float
    steps: tuple[BmcStep, ...] = ()
    final_loads: tuple[int, ...] = ()


class _Unrolling:
    """The trace encoding, one step at a time (the solver keeps what it learned)."""

    def __init__(self, n: int, keys: int, parts: Parts, margin: int | None) -> None:
        self.n, self.keys, self.parts, self.margin = n, keys, parts, margin
        self.loads: list[Term] = [z3.IntVal(0)] * n
        self.pins: list[Term] = [z3.IntVal(-1)] * keys
        self.frames: list[dict[str, Any]] = []
        self.skewed: list[Term] = []  # per step: the decision landed above min + band

    def step(self, band: int) -> Term:
        t, n = len(self.frames), self.n
        is_acquire = z3.Bool(f"t{t}_acquire")
        key, server = z3.Int(f"t{t}_key"), z3.Int(f"t{t}_server")
        a = AcquireVars(n, f"t{t}_")
        pinned = select(self.pins, key)
        constraints = z3.And(
            key >= 0, key < self.keys, server >= 0, server < n,
            a.domain(), *[x == y for x, y in zip(a.loads, self.loads, strict=True)],
            a.hit == (pinned >= 0), a.pin == z3.If(pinned >= 0, pinned, 0),
            a.margin_on == (self.margin is not None), a.margin == (self.margin or 0),
            z3.Not(a.gate_on), z3.Not(a.det), a.tie == 0,
            z3.Implies(z3.Not(is_acquire), select(self.loads, server) > 0),
        )
        d = decide(a, self.parts)
        self.frames.append({"acquire": is_acquire, "key": key, "server": server,
                            "decision": d, "loads": self.loads})
        self.skewed.append(z3.And(is_acquire, a.load_of(d.choice) > a.low + band))
        self.loads = [z3.If(is_acquire, x, self.loads[i] - z3.If(server == i, 1, 0))
                      for i, x in enumerate(d.post_loads(a))]
        self.pins = [z3.If(z3.And(is_acquire, key == j), d.pin_after, p)
                     for j, p in enumerate(self.pins)]
        return constraints


def _value(model: Any, term: Term) -> int:
    return int(model.eval(term, model_completion=True).as_long())


def _read(model: Any, run: _Unrolling) -> tuple[tuple[BmcStep, ...], tuple[int, ...]]:
    steps = []
    for f in run.frames:
        before = tuple(_value(model, x) for x in f["loads"])
        if z3.is_true(model.eval(f["acquire"], model_completion=True)):
            d = f["decision"]
            kept = z3.is_true(model.eval(d.kept, model_completion=True))
            broken = z3.is_true(model.eval(d.broken, model_completion=True))
            path = "kept" if kept else "broken" if broken else "new"
            steps.append(BmcStep("acquire", _value(model, f["key"]),
                                 _value(model, d.choice), path, before))
        else:
            server = _value(model, f["server"])
            steps.append(BmcStep("release", server, server, "", before))
    return tuple(steps), tuple(_value(model, x) for x in run.loads)


def _canonicalise(solver: Any, run: _Unrolling) -> None:
    """Fix the witness to the lexicographically least trace of its length.

    Z3's model depends on solver internals (and on what else the process asked before),
    so the raw model is not reproducible. Step by step, prefer an acquire to a release,
    then the smallest key or server; the unused field of each step is fixed to 0. The
    result is unique for the formula, hence the same in every run.
    """
    for frame in run.frames:
        for choice in (frame["acquire"], z3.Not(frame["acquire"])):
            solver.push()
            solver.add(choice)
            if solver.check() == z3.sat:
                break
            solver.pop()
        else:  # pragma: no cover - one of the two always holds in a satisfiable trace
            raise RuntimeError("no step choice is satisfiable")
        acquire = z3.is_true(solver.model().eval(frame["acquire"], model_completion=True))
        used, unused = (frame["key"], frame["server"]) if acquire else \
            (frame["server"], frame["key"])
        solver.add(unused == 0)
        for value in range(run.n if not acquire else run.keys):
            solver.push()
            solver.add(used == value)
            if solver.check() == z3.sat:
                break
            solver.pop()
    if solver.check() != z3.sat:  # pragma: no cover - every choice kept satisfiability
        raise RuntimeError("canonical witness lost satisfiability")


def shortest_trace(n: int, keys: int, max_depth: int, *, margin: int | None, bad: str,
                   bound: int, parts: Parts = SPEC_PARTS, timeout_s: float = 60.0) -> BmcResult:
    """The shortest trace reaching ``bad`` within ``max_depth`` steps, if any, under the
    spec's rules or an encoded mutant's ``parts`` (:mod:`.z3_mutants`)."""
    if bad not in ("decision_skew", "global_skew"):
        raise ValueError(f"bad must be 'decision_skew' or 'global_skew', got {bad!r}")
    start = time.perf_counter()
    run = _Unrolling(n, keys, parts, margin)
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    for depth in range(1, max_depth + 1):
        solver.add(run.step(bound))
        solver.push()
        if bad == "decision_skew":
            solver.add(run.skewed[-1])  # earlier steps were already shown clean
        else:
            solver.add(zmax(run.loads) - zmin(run.loads) > bound)
        answer = solver.check()
        if answer == z3.unknown:
            raise RuntimeError(f"z3 returned unknown at depth {depth} (timeout {timeout_s}s)")
        if answer == z3.sat:
            _canonicalise(solver, run)
            steps, final = _read(solver.model(), run)
            return BmcResult(True, depth, time.perf_counter() - start, steps, final)
        solver.pop()
    return BmcResult(False, max_depth, time.perf_counter() - start)
