"""Negative controls that keep the checkers' own clauses honest (second mutant audit).

Theory of operation
-------------------
A predicate clause that no control ever trips can be deleted without ``affinity verify``
noticing: the second mutant audit deleted two (``leases_match_loads`` altogether, and the
"only a stale entry" clause of ``rejection_preserves_state``) and verify still passed,
because every other control that breaks those requirements is caught first by another
check. And ``draw_for``, the inverse of ``allowed`` that every refinement checker feeds an
implementation's choice through (R-REL-2), was checked nowhere. Each control here is a
core bug that only the named clause (or table) can see:

* ``lease_grant_not_recorded`` (14): an acquire counts but grants no lease, so a count
  exceeds its open leases (R-LEASE-5) -- refuted by ``leases_match_loads`` in the lease
  runs, the only check of obligation 14 outside the environment runs;
* ``invalid_acquire_drops_pin`` (11): an acquire refused as ``invalid_for_config`` deletes
  its own, live, sticky entry -- one entry gone, everything else unchanged, so only the
  clause "the entry pointed at an inactive server" (R-OUT-2, R-ACQ-6) refutes it (the
  full_determinism runs send keyed acquires without a hash);
* ``draw_for_next_tie`` (0): ``draw_for`` names the next tied server (refuted by
  :mod:`.refinement_table`; obligation 0 has no BFS search, so it adds no BFS job);
* ``leases_match_loads_vacuous`` (0): the predicate itself always holds. The lease runs
  still refute ``lease_grant_not_recorded`` without it (the lease ground truth, and the
  bound on held leases, see the same bug later), so only the predicates' exhibits
  (:mod:`.predicate_table`) can tell that R-LEASE-5's own check is gone.
"""

from __future__ import annotations

from collections.abc import Iterator

from affinity_core.outcomes import Rejected, RejectReason
from affinity_engine import Acquire, Config, LeaseBook
from affinity_engine.machine import Transition
from affinity_engine.state import State
from affinity_engine.values import evolve

from .mutants_base import Mutant, Patch, allowed_mod, patched

__all__ = ["CHECKER_MUTANTS"]


def _lease_grant_not_recorded() -> Iterator[None]:
    def grant(self: LeaseBook, request_id: str | None, server_id: str) -> LeaseBook:
        return self

    with patched(LeaseBook, "grant", grant):
        yield


def _invalid_acquire_drops_pin() -> Iterator[None]:
    from affinity_engine.machine import TRANSITIONS

    original = TRANSITIONS[Acquire]

    def handler(config: Config, state: State, event: Acquire) -> Transition:
        t: Transition = original(config, state, event)
        o, rid = t.outcome, event.request_id
        if isinstance(o, Rejected) and o.reason is RejectReason.INVALID_FOR_CONFIG and \
                rid is not None and rid in state.lru:
            return Transition(evolve(t.state, lru=t.state.lru.delete(rid)), o)
        return t

    with patched(TRANSITIONS, Acquire, handler):
        yield


def _leases_match_loads_vacuous() -> Iterator[None]:
    import affinity_conformance.invariants as inv

    def vacuous(config: Config, state: State) -> bool:
        return True

    with patched(inv, "leases_match_loads", vacuous):
        yield


def _draw_for_next_tie() -> Iterator[None]:
    original = allowed_mod.draw_for

    def draw_for(config: Config, state: State, event: Acquire, server_id: str
                 ) -> Acquire | None:
        fed: Acquire | None = original(config, state, event, server_id)
        return None if fed is None else evolve(fed, tie_draw=fed.tie_draw + 1)

    with patched(allowed_mod, "draw_for", draw_for):
        yield


_PATCHES: tuple[tuple[str, str, tuple[int, ...], Patch], ...] = (
    ("lease_grant_not_recorded", "an acquire counts but grants no lease", (14,),
     _lease_grant_not_recorded),
    ("invalid_acquire_drops_pin", "an invalid_for_config rejection deletes the live sticky "
     "entry of its request", (11,), _invalid_acquire_drops_pin),
    ("draw_for_next_tie", "draw_for feeds back the next tied server", (0,),
     _draw_for_next_tie),
    ("leases_match_loads_vacuous", "the R-LEASE-5 predicate always holds", (0,),
     _leases_match_loads_vacuous),
)
CHECKER_MUTANTS: tuple[Mutant, ...] = tuple(Mutant(n, d, o, p) for n, d, o, p in _PATCHES)
