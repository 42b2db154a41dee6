"""Mutants of the real core: the negative controls of ``affinity verify``.

Theory of operation
-------------------
A check that cannot fail proves nothing. For every obligation, ``affinity verify`` runs
the same checker on at least one deliberately broken core and demands a counterexample.
A mutant that survives fails the whole run.

Each :class:`Mutant` is a context manager that monkeypatches *the real core* for the
duration of a check and restores it afterwards, so the explicit-state checker, the
encoding-conformance sweep and the CrossHair wrappers all run the mutated production code,
never a model of it. The patch points are the names the machine actually calls:

* ``affinity_engine.machine.keep_pin`` / ``least_loaded`` / ``deterministic_server`` /
  ``classify`` (imported by name into the machine, so they are patched there, and in
  ``policy`` / ``allowed`` for the callers that hold their own reference);
* entries of ``ACQUIRE_RULES`` and ``TRANSITIONS`` (the transition table is data: "a
  break that does not re-pin" is the BROKEN rule with ``write_pin=False``);
* methods of ``StickyLru`` and ``LeaseBook``.

The patching machinery is in :mod:`.mutants_base`; the context band's controls (patching
``policy.keep_band`` and ``machine.keep_pin``) are in :mod:`.mutants_band` and are part of
:data:`MUTANTS`.

Where possible a mutant *wraps* the original function (``<`` is ``<=`` with margin
``m - 1``) instead of restating the rule, so the only rule text in this module is the
broken part. Patching is process-global: checks run one at a time in a process.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import affinity_engine.machine as machine
import affinity_engine.policy as policy
from affinity_core.outcomes import Rejected, RejectReason, Released
from affinity_engine import (
    Acquire,
    Acquired,
    ClearStickyCache,
    Config,
    HashMode,
    LeaseBook,
    LoadTable,
    Release,
    ReleaseResult,
    StickyLru,
)
from affinity_engine.machine import ACQUIRE_RULES, TRANSITIONS, Lookup, Transition
from affinity_engine.state import State
from affinity_engine.values import evolve

from . import mutants_keep
from .mutants_band import BAND_MUTANTS
from .mutants_base import (
    Mutant,
    Patch,
    _keep_patch,
    allowed_mod,
    patched,
)
from .mutants_checkers import CHECKER_MUTANTS
from .mutants_inputs import INPUT_MUTANTS

__all__ = ["MUTANTS", "Mutant", "by_name", "patched"]


def _rule_patch(lookup: Lookup, **changes: Any) -> Patch:
    def patch() -> Iterator[None]:
        with patched(ACQUIRE_RULES, lookup, evolve(ACQUIRE_RULES[lookup], **changes)):
            yield

    return patch


def _ties_last() -> Iterator[None]:
    def last(config: Config, pool: LoadTable, event: Acquire) -> str:
        return pool.least_loaded(pool.tie_count - 1)

    with patched(machine, "least_loaded", last):
        yield


def _stable_uses_pool_order() -> Iterator[None]:
    original = policy.deterministic_server

    def mutated(config: Config, pool: LoadTable, sorted_servers: tuple[str, ...],
                event: Acquire) -> str:
        if config.hash_mode is HashMode.STABLE:
            return original(config, pool, pool.servers, event)
        return original(config, pool, sorted_servers, event)

    with patched(machine, "deterministic_server", mutated), \
            patched(allowed_mod, "deterministic_server", mutated):
        yield


def _hit_does_not_refresh() -> Iterator[None]:
    def touch(self: StickyLru, request_id: str) -> StickyLru:
        return self

    with patched(StickyLru, "touch", touch):
        yield


def _evicts_one_late() -> Iterator[None]:
    original = StickyLru.put

    def put(self: StickyLru, request_id: str, server_id: str) -> StickyLru:
        grown = evolve(self, capacity=self.capacity + 1)
        return evolve(original(grown, request_id, server_id), capacity=self.capacity)

    def evicts(self: StickyLru, request_id: str) -> str | None:
        return None if len(self) <= self.capacity else self.items()[0][0]  # the oldest key

    with patched(StickyLru, "put", put), patched(StickyLru, "evicts_on_put", evicts):
        yield


def _wrap_transition(kind: type[Any],
                     rewrite: Callable[[Config, State, Any, Transition], Transition]) -> Patch:
    def patch() -> Iterator[None]:
        original = TRANSITIONS[kind]

        def handler(config: Config, state: State, event: Any) -> Transition:
            return rewrite(config, state, event, original(config, state, event))

        with patched(TRANSITIONS, kind, handler):
            yield

    return patch


def _release_no_clamp(config: Config, state: State, event: Release, t: Transition) -> Transition:
    o = t.outcome
    if isinstance(o, Released) and o.result is ReleaseResult.AT_ZERO:
        pool = state.pool.add_load(event.server_id, -1)
        return Transition(evolve(state, pool=pool),
                          Released(event.server_id, ReleaseResult.APPLIED))
    return t


def _acquire_counts_wrong_server(config: Config, state: State, event: Acquire,
                                 t: Transition) -> Transition:
    o = t.outcome
    others = [s for s in t.state.pool.servers if not isinstance(o, Acquired) or s != o.server_id]
    if not isinstance(o, Acquired) or not others:
        return t
    pool = t.state.pool.add_load(o.server_id, -1).add_load(others[0], 1)
    return Transition(evolve(t.state, pool=pool), o)


def _clear_resets_counters(config: Config, state: State, event: ClearStickyCache,
                           t: Transition) -> Transition:
    return Transition(evolve(t.state, affinity_kept=0, affinity_broken=0), t.outcome)


def _empty_pool_clears_map(config: Config, state: State, event: Acquire,
                           t: Transition) -> Transition:
    o = t.outcome
    if isinstance(o, Rejected) and o.reason is RejectReason.NO_SERVERS:
        return Transition(evolve(t.state, lru=t.state.lru.cleared()), o)
    return t


def _removed_pin_counts_as_hit() -> Iterator[None]:
    original = machine.classify

    def classify(config: Config, state: State, request_id: str | None
                 ) -> tuple[Lookup, str | None]:
        lookup, pinned = original(config, state, request_id)
        if lookup is Lookup.HIT_REMOVED:
            return Lookup.HIT_KEEP, pinned
        return lookup, pinned

    with patched(machine, "classify", classify), patched(allowed_mod, "classify", classify):
        yield


def _lease_ignores_epoch() -> Iterator[None]:
    original = LeaseBook.settle

    def settle(self: LeaseBook, request_id: str | None, server_id: str
               ) -> tuple[LeaseBook, str]:
        book, verdict = original(self, request_id, server_id)
        if verdict == "stale":
            return evolve(book, stale_leases=self.stale_leases), "current"
        return book, verdict

    with patched(LeaseBook, "settle", settle):
        yield


def _evicted_not_reported(config: Config, state: State, event: Acquire,
                          t: Transition) -> Transition:
    o = t.outcome
    if isinstance(o, Acquired) and o.evicted is not None:
        return evolve(t, outcome=evolve(o, evicted=None))
    return t


status_mod = importlib.import_module("affinity_engine.status")
config_mod = importlib.import_module("affinity_core.config")


def _status_total_counts_external() -> Iterator[None]:
    original = status_mod.status

    def mutated(config: Config, state: State) -> dict[str, Any]:
        return {**original(config, state), "total_inflight": state.pool.total}

    with patched(status_mod, "status", mutated):
        yield


def _unknown_leases_not_counted() -> Iterator[None]:
    original = LeaseBook.settle

    def settle(self: LeaseBook, request_id: str | None, server_id: str
               ) -> tuple[LeaseBook, str]:
        book, verdict = original(self, request_id, server_id)
        return evolve(book, unknown_leases=self.unknown_leases), verdict

    with patched(LeaseBook, "settle", settle):
        yield


def _stable_mode_demands_hash() -> Iterator[None]:
    original = machine._config_rejection

    def mutated(config: Config, event: Acquire) -> Rejected | None:
        if config.full_determinism and event.request_hash is None:
            return Rejected(RejectReason.INVALID_FOR_CONFIG, "needs request_hash")
        return original(config, event)

    with patched(machine, "_config_rejection", mutated), \
            patched(allowed_mod, "_config_rejection", mutated):
        yield


def _cache_size_zero_accepted() -> Iterator[None]:
    original = config_mod._positive_int

    def mutated(key: str, value: object) -> int:
        return 0 if value == 0 and not isinstance(value, bool) else original(key, value)

    with patched(config_mod, "_positive_int", mutated):
        yield


MUTANTS: tuple[Mutant, ...] = (
    Mutant("keep_strict_lt", "keep rule uses < instead of <= (load[pin] < min + m)", (6,),
           _keep_patch(mutants_keep.keep_strict)),
    Mutant("keep_band_plus_one", "keep rule is off by one: load[pin] <= min + m + 1", (3,),
           _keep_patch(mutants_keep.keep_plus_one)),
    Mutant("margin_zero_means_off", "`if margin:` -- margin 0 is treated as no margin", (4,),
           _keep_patch(mutants_keep.keep_margin_zero_off)),
    Mutant("keep_comparison_flipped", "keep rule compares >= instead of <=", (5,),
           _keep_patch(mutants_keep.keep_flipped)),
    Mutant("margin_null_as_zero", "margin None is evaluated as margin 0", (1,),
           _keep_patch(mutants_keep.keep_none_as_zero)),
    Mutant("margin_under_determinism", "margin applied under full_determinism", (2,),
           _keep_patch(mutants_keep.keep_under_determinism)),
    Mutant("min_excludes_pin", "band/gate minimum excludes the pinned server", (11,),
           _keep_patch(mutants_keep.keep_min_excludes_pin), raises_by_design=True),
    Mutant("min_ignores_idle", "band floor is the minimum over busy servers only", (12,),
           _keep_patch(mutants_keep.keep_min_over_busy)),
    Mutant("gate_disable_inverted", "PR #6533 gate: abs > 0 disables instead of abs <= 0",
           (13,), _keep_patch(mutants_keep.keep_gate_inverted)),
    Mutant("ties_last_in_order", "least-loaded ties go to the last server in pool order",
           (1,), _ties_last),
    Mutant("break_keeps_old_server", "BROKEN rule stays on the pinned server", (7,),
           _rule_patch(Lookup.HIT_BREAK, choice=machine.Choice.STAY)),
    Mutant("break_does_not_repin", "BROKEN rule does not write the new pin", (7,),
           _rule_patch(Lookup.HIT_BREAK, write_pin=False)),
    Mutant("counts_first_placements", "MISS rule increments affinity_kept", (8,),
           _rule_patch(Lookup.MISS, counter="affinity_kept")),
    Mutant("counts_reselections", "removed-server re-selection counts as broken", (8,),
           _rule_patch(Lookup.HIT_REMOVED, counter="affinity_broken")),
    Mutant("clear_resets_counters", "clear_sticky_cache resets the affinity counters", (8,),
           _wrap_transition(ClearStickyCache, _clear_resets_counters)),
    Mutant("hit_does_not_refresh_lru", "a sticky hit does not refresh LRU recency", (1,),
           _hit_does_not_refresh),
    Mutant("lru_evicts_one_late", "sticky map evicts only above capacity (off by one)", (10,),
           _evicts_one_late),
    Mutant("release_not_clamped", "release at count 0 still decrements", (9,),
           _wrap_transition(Release, _release_no_clamp)),
    Mutant("acquire_counts_wrong_server", "acquire increments another server's count", (9,),
           _wrap_transition(Acquire, _acquire_counts_wrong_server)),
    Mutant("removed_pin_kept", "a pin on a removed server counts as a live hit", (11,),
           _removed_pin_counts_as_hit),
    Mutant("empty_pool_clears_map", "the no-servers rejection also clears the sticky map",
           (11,), _wrap_transition(Acquire, _empty_pool_clears_map)),
    Mutant("stable_hash_uses_pool_order", "stable hash mode indexes pool order, not sorted ids",
           (2,), _stable_uses_pool_order),
    Mutant("lease_ignores_epoch", "a stale-epoch release decrements the fresh count", (14,),
           _lease_ignores_epoch),
    Mutant("evicted_not_reported", "Acquired.evicted is never reported", (15,),
           _wrap_transition(Acquire, _evicted_not_reported)),
    Mutant("status_total_counts_external", "status total_inflight includes external load",
           (16,), _status_total_counts_external),
    Mutant("unknown_leases_not_counted", "a release without a lease does not count "
           "unknown_leases", (17,), _unknown_leases_not_counted),
    Mutant("stable_mode_demands_hash", "full_determinism refuses an acquire without "
           "request_hash also in stable mode", (18,), _stable_mode_demands_hash),
    Mutant("cache_size_zero_accepted", "max_cache_size 0 is accepted", (19,),
           _cache_size_zero_accepted),
    *BAND_MUTANTS,
    *INPUT_MUTANTS,
    *CHECKER_MUTANTS,
)

_BY_NAME = {m.name: m for m in MUTANTS}


def by_name(name: str) -> Mutant:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown mutant {name!r}; known: {sorted(_BY_NAME)}") from None

