"""Obligation 0: every named predicate of ``affinity_conformance.invariants`` can say "false".

Theory of operation
-------------------
The explicit-state checker judges every edge with the predicates of
:mod:`affinity_conformance.invariants`; a predicate that has become vacuous (a deleted clause, a
``return True``) would let every core bug it exists for through, and a control of the core
is usually refuted by some *other* check first, so nothing notices. The second mutant audit
deleted ``leases_match_loads`` outright and ``affinity verify`` still passed.

:data:`EXHIBITS` holds, for each predicate, hand-built values -- real states and
transitions, altered with ``evolve`` into exactly one violation each, written from SPEC's
requirement -- on which it must be false, and one real step on which it must be true.
:func:`check_exhibits` calls the predicates through the module, so a patched (mutated)
predicate is the one judged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import affinity_conformance.invariants as inv
from affinity_core.outcomes import Rejected, RejectReason
from affinity_engine import (
    Acquire,
    Acquired,
    Config,
    LoadTable,
    Path,
    Release,
    StickyLru,
    initial_state,
    step,
)
from affinity_engine.machine import Transition
from affinity_engine.values import evolve

__all__ = ["EXHIBITS", "check_exhibits"]

Exhibit = tuple[str, str, bool, Callable[[], bool]]  # predicate, what, expected, call


def _exhibits() -> list[Exhibit]:
    out: list[Exhibit] = []
    m0 = Config(affinity_break_margin=0, max_cache_size=2)
    pre = initial_state(m0, ["s0", "s1"])
    ok = step(m0, pre, Acquire(request_id="a"))  # a real step: every predicate holds
    pinned = ok.state  # a -> s0, loads [1, 0]
    busy = evolve(pre, pool=LoadTable.build([("s0", 0), ("s1", 2)]))
    lease = Config(lease_accounting=True)
    leased = initial_state(lease, ["s0"])

    def add(name: str, what: str, expected: bool, call: Callable[[], bool]) -> None:
        out.append((name, what, expected, call))

    add("well_formed", "a real state", True, lambda: inv.well_formed(m0, ok.state))
    add("well_formed", "a negative count (R-CONS-1)", False, lambda: inv.well_formed(
        m0, evolve(pre, pool=LoadTable.build([("s0", -1), ("s1", 0)]))))
    add("well_formed", "a total that is not the sum (R-ST-2)", False, lambda: inv.well_formed(
        m0, evolve(pre, pool=evolve(pre.pool, total=5))))
    add("well_formed", "a map above its capacity (R-LRU-5)", False, lambda: inv.well_formed(
        m0, evolve(pre, lru=StickyLru.from_items(3, (("a", "s0"), ("b", "s0"), ("c", "s1"))))))
    add("well_formed", "a stale sorted mirror", False, lambda: inv.well_formed(
        m0, evolve(pre, sorted_servers=("s1", "s0"))))
    add("well_formed", "a negative kept counter (R-ST-2)", False, lambda: inv.well_formed(
        m0, evolve(pre, affinity_kept=-1)))
    add("well_formed", "a negative broken counter (R-ST-2)", False, lambda: inv.well_formed(
        m0, evolve(pre, affinity_broken=-1)))
    add("leases_match_loads", "a real lease-mode step", True, lambda: inv.leases_match_loads(
        lease, step(lease, leased, Acquire(request_id="a")).state))
    add("leases_match_loads", "a count without its lease (R-LEASE-5)", False,
        lambda: inv.leases_match_loads(lease, evolve(leased, pool=leased.pool.add_load("s0", 1))))
    add("decision_in_pool", "a server that was not active (R-POOL-4)", False,
        lambda: inv.decision_in_pool(pre, Transition(ok.state, Acquired("zz", Path.NEW))))
    add("within_band", "a kept pin above min + m (R-KEEP-1)", False, lambda: inv.within_band(
        m0, pinned, Transition(pinned, Acquired("s0", Path.KEPT))))
    add("placement_is_argmin", "a placement above the minimum (R-PLACE-1)", False,
        lambda: inv.placement_is_argmin(m0, busy, Transition(busy, Acquired("s1", Path.NEW))))
    add("break_moves", "a break back onto its pin (R-BREAK-1)", False,
        lambda: inv.break_moves(pinned, Transition(pinned, Acquired("s0", Path.BROKEN, "s0"))))
    add("acquire_effect", "an acquire that counts nothing (R-ACQ-7)", False,
        lambda: inv.acquire_effect(pre, Acquire(request_id="a"),
                                   Transition(evolve(ok.state, pool=pre.pool), ok.outcome)))
    add("counters_monotonic", "a counter that goes down (R-CNT-2)", False,
        lambda: inv.counters_monotonic(evolve(pre, affinity_kept=1), Transition(pre, ok.outcome)))
    add("counters_monotonic", "a counter that moves by two in one step (R-CNT-2)", False,
        lambda: inv.counters_monotonic(pre, Transition(evolve(pre, affinity_kept=2),
                                                       ok.outcome)))
    add("counters_monotonic", "both counters moving in one step (R-CNT-2)", False,
        lambda: inv.counters_monotonic(pre, Transition(
            evolve(pre, affinity_kept=1, affinity_broken=1), ok.outcome)))
    add("rejection_preserves_state", "a rejection that drops a live entry (R-OUT-2)", False,
        lambda: inv.rejection_preserves_state(pinned, Transition(
            evolve(pinned, lru=pinned.lru.delete("a")),
            Rejected(RejectReason.INVALID_FOR_CONFIG, "x"))))
    add("no_starvation", "a busy server chosen while one is idle (R-KEEP-3)", False,
        lambda: inv.no_starvation(m0, busy, Transition(busy, Acquired("s1", Path.KEPT))))
    placed = Config(placement_margin=2)
    cached = Acquire(request_id="a", cached_prefix=(("s0", 64),))
    add("prefix_choice", "a real prefix-aware placement (R-PFX-3)", True,
        lambda: inv.prefix_choice(placed, busy, cached, step(placed, busy, cached)))
    add("prefix_choice", "the idle server although s0 caches more (R-PFX-3)", False,
        lambda: inv.prefix_choice(placed, busy, cached,
                                  Transition(busy, Acquired("s1", Path.NEW))))
    add("prefix_choice", "a server beyond min + m_place (R-PFX-2)", False,
        lambda: inv.prefix_choice(Config(placement_margin=1), busy,
                                  Acquire(request_id="a", cached_prefix=(("s1", 64),)),
                                  Transition(busy, Acquired("s1", Path.NEW))))
    add("prefix_choice", "a re-pin onto the pin it moves off (R-PFX-2)", False,
        lambda: inv.prefix_choice(placed, busy, cached,
                                  Transition(busy, Acquired("s0", Path.BROKEN, "s0"))))
    ledger = inv.Ledger()
    add("counters_consistent", "a kept count without a hit (R-CNT-1)", False,
        lambda: inv.counters_consistent(evolve(pre, affinity_kept=1), ledger))
    add("conserved", "a count no acquire made (R-CONS-2)", False,
        lambda: inv.conserved(ok.state, ledger))
    add("conserved", "a real acquire and release", True, lambda: inv.conserved(
        step(m0, ok.state, Release(server_id="s0")).state,
        ledger.record(pre, Acquire(request_id="a"), ok).record(
            ok.state, Release(server_id="s0"), step(m0, ok.state, Release(server_id="s0")))))
    return out


EXHIBITS: tuple[Exhibit, ...] = tuple(_exhibits())


def check_exhibits() -> tuple[int, list[str]]:
    """(exhibits judged, problems): a predicate true on its violation, or false on a real
    step, or raising."""
    problems: list[str] = []
    for name, what, expected, call in EXHIBITS:
        try:
            got: Any = call()
        except Exception as exc:
            problems.append(f"{name} on {what} raised {type(exc).__name__}: {exc}")
            continue
        if got is not expected:
            problems.append(f"{name} is {got!r} on {what}; it must be {expected!r}")
    return len(EXHIBITS), problems
