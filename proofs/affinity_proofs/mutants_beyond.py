"""Mutants that only bite beyond the small worlds: the negative controls of the structure
checks and of the wide encoding-conformance sweep.

Theory of operation
-------------------
The BFS and the small-world sweeps explore at most four servers, loads <= 4 and
non-negative hashes. These mutants of the real core are invisible there and visible
beyond: more than one leaf of the load table (N > 32), a gate's relative threshold at a
minimum load >= 4, negative caller hashes, unkeyed requests under ``hashed`` ties, and
the sticky map's recency list at its boundaries and its old versions. They are refuted by
:mod:`.structures` and :mod:`.conformance_wide`, and kept out of
:data:`~affinity_proofs.mutants.MUTANTS`, whose obligations schedule BFS searches that
cannot see them. Like those, each monkeypatches the real core while applied.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import affinity_engine.machine as machine
import affinity_engine.policy as policy
from affinity_engine import Acquire, Config, HashMode, LoadTable, StickyLru, TieBreak
from affinity_engine.values import evolve

from .mutants import by_name
from .mutants_base import _ORIGINAL_KEEP, Mutant, _keep_patch, allowed_mod, patched

__all__ = ["BEYOND_SMALL_MUTANTS", "beyond_by_name"]

loads_mod = importlib.import_module("affinity_engine.loads")


def _tie_count_sums_children() -> Iterator[None]:
    original = loads_mod._summarise

    def summarise(children: Any, mins: Any, counts: Any, maxes: Any) -> Any:
        node = original(children, mins, counts, maxes)
        return (node[0], sum(counts), *node[2:])  # counts every child, not those at the min

    with patched(loads_mod, "_summarise", summarise):
        yield


def _summary_not_refreshed() -> Iterator[None]:
    original = LoadTable.add_load

    def add_load(self: LoadTable, server_id: str, delta: int) -> LoadTable:
        new = original(self, server_id, delta)
        if self.depth == 0 or self.tree is None or new.tree is None:
            return new
        stale = (*self.tree[:3], *new.tree[3:])  # the root keeps its old min/count/max
        return evolve(new, tree=stale)

    with patched(LoadTable, "add_load", add_load):
        yield


def _keep_gate_relative_inverted(
    config: Config, pool: LoadTable, pinned: str, context_tokens: int | None = None
) -> bool:
    gate = config.dual_threshold
    if gate is None or config.full_determinism or config.affinity_break_margin is not None:
        return _ORIGINAL_KEEP(config, pool, pinned, context_tokens)
    low, high, rel = pool.min_load, pool.max_load, gate.balance_rel_threshold
    if pool.load(pinned) == low or gate.balance_abs_threshold <= 0:
        return True
    return not (high - low > gate.balance_abs_threshold
                and high * rel.denominator < low * rel.numerator)  # `<` where `>` is meant


def _caller_hash_abs() -> Iterator[None]:
    original = policy.deterministic_server

    def mutated(config: Config, pool: LoadTable, sorted_servers: tuple[str, ...],
                event: Acquire) -> str:
        if config.hash_mode is HashMode.CALLER and event.request_hash is not None:
            event = evolve(event, request_hash=abs(event.request_hash))
        return original(config, pool, sorted_servers, event)

    with patched(machine, "deterministic_server", mutated), \
            patched(allowed_mod, "deterministic_server", mutated):
        yield


def _hashed_unkeyed_first() -> Iterator[None]:
    original = policy.tie_index

    def tie_index(config: Config, ties: int, event: Acquire) -> int:
        if config.tie_break is TieBreak.HASHED and event.request_id is None:
            return 0  # the draw is ignored for an unkeyed request
        return original(config, ties, event)

    with patched(policy, "tie_index", tie_index):
        yield


def _lru_touch_keeps_oldest() -> Iterator[None]:
    original = StickyLru.touch

    def touch(self: StickyLru, request_id: str) -> StickyLru:
        oldest = self.items()[0][0] if len(self) > 1 else None
        new = original(self, request_id)
        if request_id == oldest and new.store is self.store:
            # `lo` (the least recent record) not advanced past the touched key's old record
            return evolve(new, lo=self.lo)
        return new

    with patched(StickyLru, "touch", touch):
        yield


def _lru_put_refreshes_in_place() -> Iterator[None]:
    original = StickyLru.put

    def put(self: StickyLru, request_id: str, server_id: str) -> StickyLru:
        if request_id not in self:
            return original(self, request_id, server_id)
        items = tuple((k, server_id if k == request_id else v) for k, v in self)
        return StickyLru.from_items(self.capacity, items)  # value updated, recency kept

    with patched(StickyLru, "put", put):
        yield


def _lru_old_version_reuses_store() -> Iterator[None]:
    def tip(self: StickyLru) -> Any:
        store = self.store
        del store.log[self.hi:]  # cut the shared log back to this window instead of copying
        return store  # ... and keep the newer version's index

    with patched(StickyLru, "_tip", tip):
        yield


def _lru_rederive_ignores_deletions() -> Iterator[None]:
    def own(self: StickyLru) -> Any:
        store = self.store
        log = store.log[:self.hi]
        records: list[Any] = log[self.lo:]  # (request_id, server) tuples
        index = {c[0]: c for c in records if c[1] is not None}
        fresh = type(store)(log, index)  # deletion records not applied
        object.__setattr__(self, "store", fresh)
        return fresh

    with patched(StickyLru, "_own", own):
        yield


BEYOND_SMALL_MUTANTS: tuple[Mutant, ...] = (
    Mutant("tie_count_sums_children", "load table: an internal node's tie count sums every "
           "child's, not only those at the minimum (N > 32)", (1,), _tie_count_sums_children),
    Mutant("load_summary_not_refreshed", "load table: add_load leaves the root's "
           "min/count/max stale (N > 32)", (1,), _summary_not_refreshed),
    Mutant("gate_relative_inverted", "PR #6533 gate: relative test max*den < min*num "
           "(needs min >= 4)", (13,), _keep_patch(_keep_gate_relative_inverted)),
    Mutant("caller_hash_abs_mod", "full_determinism caller hash: abs(h) % n, not floored",
           (2,), _caller_hash_abs),
    Mutant("hashed_unkeyed_takes_first", "hashed ties: an unkeyed request takes tie 0, "
           "not its draw", (1,), _hashed_unkeyed_first),
    Mutant("lru_touch_keeps_oldest", "sticky map: touching the oldest entry leaves the "
           "window's start (lo) on its old record", (10,), _lru_touch_keeps_oldest),
    Mutant("lru_put_refreshes_in_place", "sticky map: writing an existing key keeps its "
           "recency", (10,), _lru_put_refreshes_in_place),
    Mutant("lru_old_version_reuses_store", "sticky map: an old version writes into the "
           "shared log (cut back to its window) instead of a copy", (10,),
           _lru_old_version_reuses_store),
    Mutant("lru_rederive_ignores_deletions", "sticky map: an old version re-derives its "
           "entries from the log without its deletion records", (10,),
           _lru_rederive_ignores_deletions),
)
_BY_NAME = {m.name: m for m in BEYOND_SMALL_MUTANTS}


def beyond_by_name(name: str) -> Mutant:
    """A mutant of this module or, failing that, of :mod:`.mutants`."""
    return _BY_NAME[name] if name in _BY_NAME else by_name(name)
