"""The core's two data structures, checked against plain definitions at every boundary.

Theory of operation
-------------------
``LoadTable`` answers min, max, tie count and "k-th least-loaded in pool order" from a
flat list written in place with an undo log up to 32 entries, and beyond from a 32-ary
tree of summaries whose shape changes again at 1024 (one internal level, two), so a
check at three servers says nothing about 33. ``StickyLru``
keeps a write log shared between versions and compacts it when it exceeds ``2 x size +
32`` records, so small capacities compact often and large ones rarely. This module
drives each structure through a seeded sequence of operations at sizes on both sides of
every structural boundary and compares,
after **every** operation, each query with its plain definition over a list:

* ``LoadTable`` (sizes 1, 31, 32, 33, 64, 65, 1024, 1025): ``items``, ``total``,
  ``min_load``, ``max_load``, ``tie_count`` (= how many loads equal the minimum),
  ``least_loaded(k)`` (= the k-th position at the minimum, pool order) for the first,
  middle and last k, and ``load`` of the server just changed. Loads are drawn mostly from
  0..3, so the minimum is tied across leaves, with jumps up to 10^6. Old versions are
  kept, re-checked and branched from, as for the sticky map (flat tables share one
  store between versions).
* ``StickyLru`` (capacities 1, 2, 3, 32, 33, 1024, 1025): the recency order ``items``
  (R-LRU-3, oldest first), ``len``, ``peek``, ``evicts_on_put`` and the bound (R-LRU-5)
  against a plain list with the R-LRU-1..4 rules; the keys come from a set of
  ``capacity + 2`` ids, so the map runs through empty, full minus one, full and eviction.
  Old versions are kept and re-checked, and the run branches from them (persistence:
  the map shares one write log between versions, and capacities 1-3 compact it every
  few dozen writes).

This is a check at these sizes, not a proof for every size; the sizes are the ones where
the representation changes. :func:`run` returns the first disagreement (or None), so
the mutants of :data:`~affinity_proofs.mutants.BEYOND_SMALL_MUTANTS` can be refuted by the
same code in the same run.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import attrs

from affinity_engine import LoadTable, StickyLru

__all__ = ["LOAD_SIZES", "LRU_CAPACITIES", "StructureResult", "check_load_table",
           "check_lru", "run"]

LOAD_SIZES = (1, 31, 32, 33, 64, 65, 1024, 1025)
LRU_CAPACITIES = (1, 2, 3, 32, 33, 1024, 1025)


@attrs.frozen
class StructureResult:
    structure: str
    operations: int
    seconds: float
    failure: str | None


_S = TypeVar("_S")
_P = TypeVar("_P")


class _Versions(Generic[_S, _P]):
    """The persistence schedule both checks share: every 5th state is kept with a copy of
    its plain twin, every 16th step one kept state is re-checked (``changed`` says how it
    differs, or None), and 1 in 20 steps the run continues from a kept state."""

    def __init__(self, branch_rng: random.Random,
                 changed: Callable[[_S, list[_P]], str | None]) -> None:
        self.rng = branch_rng
        self.changed = changed
        self.kept: list[tuple[_S, list[_P]]] = []

    def visit(self, step: int, state: _S, plain: list[_P]
              ) -> tuple[_S, list[_P], str | None]:
        """The state and plain twin to continue from, and a kept state's difference."""
        if step % 5 == 0:
            self.kept = [*self.kept[-15:], (state, list(plain))]
        if step % 16 == 15:
            old, old_plain = self.rng.choice(self.kept)
            problem = self.changed(old, old_plain)
            if problem:
                return state, plain, problem
        if self.rng.random() < 0.05:
            old, old_plain = self.rng.choice(self.kept)
            return old, list(old_plain), None
        return state, plain, None


def _load(rng: random.Random) -> int:
    return rng.choice((0, 0, 1, 1, 2, 3, rng.randrange(10**6)))


def _table_mismatch(table: LoadTable, servers: list[str], plain: list[int]) -> str | None:
    if table.items() != tuple(zip(servers, plain, strict=True)):
        return "items() differs from the loads written"
    low, high = min(plain), max(plain)
    ties = [servers[i] for i, x in enumerate(plain) if x == low]
    got = (table.total, table.min_load, table.max_load, table.tie_count)
    if got != (sum(plain), low, high, len(ties)):
        return (f"(total, min, max, tie count) = {got}, plain definition "
                f"{(sum(plain), low, high, len(ties))}")
    for k in sorted({0, len(ties) // 2, len(ties) - 1}):
        if table.least_loaded(k) != ties[k]:
            return f"least_loaded({k}) = {table.least_loaded(k)}, plain {ties[k]}"
    return None


def check_load_table(n: int, operations: int, seed: int) -> str | None:
    """None, or the first operation after which the table disagrees with the plain list.

    Persistence as in :func:`check_lru`: every 5th table is kept with a copy of its loads,
    every 16th step one kept table must still equal its loads, and 1 in 20 steps the run
    continues from a kept table."""
    rng = random.Random(seed * 7919 + n)
    servers = [f"s{i}" for i in range(n)]
    versions: _Versions[LoadTable, int] = _Versions(  # a separate rng: rng's sequence stays
        random.Random(seed * 104729 + n), lambda old, loads: _table_mismatch(old, servers, loads))
    plain = [_load(rng) for _ in range(n)]
    table = LoadTable.build(zip(servers, plain, strict=True))
    problem = _table_mismatch(table, servers, plain)
    if problem is None and table.least_loaded_all() != tuple(
            s for s, x in zip(servers, plain, strict=True) if x == min(plain)):
        problem = "least_loaded_all() differs from the plain tie set"
    if problem:
        return f"N={n}, after build: {problem}"
    for step in range(operations):
        table, plain, problem = versions.visit(step, table, plain)
        if problem:
            return f"N={n}, step {step}, an old version changed: {problem}"
        i = rng.randrange(n)
        if rng.random() < 0.7:  # acquire / release
            delta = 1 if plain[i] == 0 or rng.random() < 0.5 else -1
            table, what = table.add_load(servers[i], delta), f"add_load(s{i}, {delta:+d})"
            plain[i] += delta
        else:  # an observed load (R-OBS-*)
            value = _load(rng)
            table, what = table.set_load(servers[i], value), f"set_load(s{i}, {value})"
            plain[i] = value
        if table.load(servers[i]) != plain[i]:
            return f"N={n}, step {step} {what}: load = {table.load(servers[i])}, not {plain[i]}"
        problem = _table_mismatch(table, servers, plain)
        if problem:
            return f"N={n}, step {step} {what}: {problem}"
    return None


def _lru_mismatch(lru: StickyLru, plain: list[tuple[str, str]], capacity: int) -> str | None:
    if lru.items() != tuple(plain):
        return f"recency order {list(lru.items())[:4]}..., plain {plain[:4]}..."
    if len(lru) != len(plain) or len(lru) > capacity:
        return f"len {len(lru)}, plain {len(plain)}, capacity {capacity}"
    return None


def check_lru(capacity: int, operations: int, seed: int) -> str | None:
    """None, or the first operation after which the map disagrees with the plain list.

    Persistence is checked too: every 5th state is kept with a copy of its plain list;
    every 16th step one kept state must still equal its list, and now and then (1 in 20
    steps) the run continues from a kept state, so writes to old versions (which share
    their log with newer ones) are exercised as the model checkers use them."""
    rng = random.Random(seed * 104729 + capacity)
    versions: _Versions[StickyLru, tuple[str, str]] = _Versions(  # rng's sequence stays
        random.Random(seed * 7919 + capacity),
        lambda old, entries: _lru_mismatch(old, entries, capacity))
    keys = [f"r{i}" for i in range(capacity + 2)]
    lru = StickyLru(capacity)
    plain: list[tuple[str, str]] = []  # (key, server), oldest first
    for step in range(operations):
        lru, plain, problem = versions.visit(step, lru, plain)
        if problem:
            return f"capacity {capacity}, step {step}, an old version changed: {problem}"
        key, server, op = rng.choice(keys), f"s{rng.randrange(4)}", rng.random()
        where = {k: j for j, (k, _) in enumerate(plain)}
        if op < 0.5:  # a write (R-LRU-3)
            expect_evict = None if key in where or len(plain) < capacity else plain[0][0]
            if lru.evicts_on_put(key) != expect_evict:
                return (f"capacity {capacity}, step {step}: evicts_on_put({key}) = "
                        f"{lru.evicts_on_put(key)}, plain {expect_evict}")
            lru, what = lru.put(key, server), f"put({key}, {server})"
            if key in where:
                del plain[where[key]]
            elif len(plain) >= capacity:
                del plain[0]
            plain.append((key, server))
        elif op < 0.8:  # a lookup of a present key (R-LRU-2); membership first (R-LRU-1)
            present = [k for k, _ in plain]
            if not present:
                continue
            key = rng.choice(present)
            if key not in lru or lru.peek(key) != plain[where[key]][1]:
                return f"capacity {capacity}, step {step}: peek({key}) = {lru.peek(key)}"
            lru, what = lru.touch(key), f"touch({key})"
            plain.append(plain.pop(where[key]))
        else:  # a delete (R-LRU-4)
            lru, what = lru.delete(key), f"delete({key})"
            if key in where:
                del plain[where[key]]
        problem = _lru_mismatch(lru, plain, capacity)
        if problem:
            return f"capacity {capacity}, step {step} {what}: {problem}"
    return None


def run(structure: str, operations: int, seed: int = 20261203) -> StructureResult:
    """Check ``"load_table"`` or ``"sticky_lru"`` at every boundary size."""
    start = time.perf_counter()
    failure: str | None = None
    total = 0
    if structure == "load_table":
        for n in LOAD_SIZES:
            total += operations
            failure = _guard(lambda n=n: check_load_table(n, operations, seed))
            if failure:
                break
    elif structure == "sticky_lru":
        for c in LRU_CAPACITIES:
            ops = operations + 3 * c  # enough writes to fill the map and evict
            total += ops
            failure = _guard(lambda c=c, ops=ops: check_lru(c, ops, seed))
            if failure:
                break
    else:
        raise ValueError(f"structure must be 'load_table' or 'sticky_lru', got {structure!r}")
    return StructureResult(structure, total, time.perf_counter() - start, failure)


def _guard(check: object) -> str | None:
    """A crash inside the structure (an assertion, a KeyError) is a disagreement too."""
    assert callable(check)
    try:
        result = check()
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"
    assert result is None or isinstance(result, str)
    return result
