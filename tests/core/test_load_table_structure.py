"""LoadTable as a data structure, against a plain list of loads.

The machine tests check the load table through ``step``; this file drives the table
itself through seeded random updates and compares every query after every update with a
plain list. It also checks what the representation (affinity_engine/loads.py) must keep
true although the public API does not show it:

* flat tables (1 to 32 servers) change their loads in place: every old version still
  answers as it did, after any later update of it or of versions derived from it,
  including branches, lost claims and concurrent threads;
* equality, hashing, repr and pickling depend on the servers, total and loads only,
  whatever the history;
* the undo log stays bounded (compaction).

Deep tables (33 servers and more) are persistent trees; they run the same sequences.
"""

from __future__ import annotations

import pickle
import random
from typing import Any, cast

import pytest

from affinity_engine import BUILD, LoadTable
from affinity_engine.values import evolve

from .threads import run_switching

SIZES = (1, 2, 3, 16, 32, 33, 70)


def _servers(n: int) -> list[str]:
    return [f"s{i}" for i in range(n)]


def _check(table: LoadTable, loads: list[int], what: str) -> None:
    """Every query of ``table`` against the plain list ``loads``."""
    servers = _servers(len(loads))
    assert table.items() == tuple(zip(servers, loads, strict=True)), what
    assert [table.load(s) for s in servers] == loads, what
    assert table.load("absent") == 0
    assert table.total == sum(loads), what
    low = min(loads)
    assert (table.min_load, table.max_load) == (low, max(loads)), what
    ties = [s for s, n in zip(servers, loads, strict=True) if n == low]
    assert table.tie_count == len(ties), what
    assert [table.least_loaded(k) for k in range(len(ties))] == ties, what
    assert table.least_loaded_all() == tuple(ties), what


def _update(rng: random.Random, table: LoadTable, loads: list[int]) -> tuple[LoadTable, str]:
    """One random update of ``table`` and of its plain twin ``loads`` (in place)."""
    p = rng.randrange(len(loads))
    if rng.random() < 0.15:  # an observation: any value, as set_load is used
        value = rng.randrange(6)
        loads[p] = value
        return table.set_load(f"s{p}", value), f"set s{p} {value}"
    delta = -1 if loads[p] > 0 and rng.random() < 0.45 else 1
    loads[p] += delta
    return table.add_load(f"s{p}", delta), f"add s{p} {delta}"


@pytest.mark.parametrize("n", SIZES)
def test_random_updates_match_a_plain_list(n: int) -> None:
    rng = random.Random(n)
    loads = [rng.randrange(3) for _ in range(n)]
    table = LoadTable.build(zip(_servers(n), loads, strict=True))
    _check(table, loads, "built")
    for step in range(600):
        table, what = _update(rng, table, loads)
        _check(table, loads, f"step {step}: {what}")


@pytest.mark.parametrize("n", SIZES)
def test_every_old_version_is_unchanged_and_usable(n: int) -> None:
    """Branch from random old versions, keep updating them and what derives from them;
    every version kept answers as when it was made."""
    rng = random.Random(100 + n)
    start = [0] * n
    versions: list[tuple[LoadTable, list[int]]] = [
        (LoadTable.build(zip(_servers(n), start, strict=True)), start)]
    for _ in range(300):
        table, loads = versions[rng.randrange(len(versions))]
        loads = list(loads)
        table, _ = _update(rng, table, loads)
        versions.append((table, loads))
        if rng.random() < 0.2:
            old, old_loads = versions[rng.randrange(len(versions))]
            _check(old, old_loads, "an old version, read again")
    for i, (table, loads) in enumerate(versions):
        _check(table, loads, f"version {i}")


def test_equal_loads_are_equal_and_hash_alike_whatever_the_history() -> None:
    servers = _servers(5)
    direct = LoadTable.build(zip(servers, [1, 1, 2, 1, 0], strict=True))
    table = LoadTable.build((s, 0) for s in servers)
    for sid in ("s0", "s2", "s2", "s1", "s3", "s1", "s3"):
        table = table.add_load(sid, 1)
    table = table.add_load("s1", -1).add_load("s3", -1)
    assert table == direct and hash(table) == hash(direct) and repr(table) == repr(direct)
    assert table.flat is not direct.flat  # different stores, equal values
    assert pickle.loads(pickle.dumps(table)) == table
    assert table != direct.add_load("s4", 1)
    assert table != LoadTable.build(zip(["t0", *servers[1:]], [1, 1, 2, 1, 0], strict=True))
    # A total set apart from the loads (the proofs' corrupted states) is kept and compared.
    corrupt = evolve(table, total=9)
    assert corrupt != table and pickle.loads(pickle.dumps(corrupt)).total == 9


@pytest.mark.parametrize("n", (1, 16, 32))
def test_the_undo_log_stays_bounded_under_long_use(n: int) -> None:
    rng = random.Random(7)
    table = LoadTable.build((s, 0) for s in _servers(n))
    longest = 0
    for _ in range(5_000):
        sid = f"s{rng.randrange(n)}"
        table = table.add_load(sid, 1 if table.load(sid) == 0 or rng.random() < 0.5 else -1)
        assert table.flat is not None
        longest = max(longest, len(table.flat.undo))
    assert 2 * n + 1 <= longest <= 2 * n + 33  # compaction happened, and bounded the log


def test_threads_sharing_one_version_each_get_their_own_result() -> None:
    """Four threads updating from one shared version at once, as often as CPython switches
    threads: every result, and the shared version, must match the plain lists. A smoke
    test; the interleavings are staged deterministically by the tests below."""
    base_loads = [1, 0, 2, 0, 1, 3]
    base = [LoadTable.build(zip(_servers(6), base_loads, strict=True))]
    failures: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            table, loads = base[0], list(base_loads)
            for _ in range(3):
                table, what = _update(rng, table, loads)
                if table.items() != tuple(zip(_servers(6), loads, strict=True)):
                    failures.append(f"thread {seed}: {what}: {table.items()} != {loads}")
            if base[0].items() != tuple(zip(_servers(6), base_loads, strict=True)):
                failures.append(f"thread {seed}: the shared version changed")

    run_switching(worker)
    assert failures == []


class _RacingList(list):  # type: ignore[type-arg]
    """A list whose next append, or next read, first lets another writer go."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.race: list[object] = []
        self.on_race: Any = None

    def _maybe_race(self) -> None:
        if self.race:
            self.race.pop()  # once
            self.on_race()

    def append(self, item: Any) -> None:
        self._maybe_race()
        super().append(item)

    def __getitem__(self, index: Any) -> Any:
        self._maybe_race()
        return super().__getitem__(index)


BASE = [2, 0, 1, 0]
WRITES = {
    "acquire s1": ("s1", 1),
    "acquire s0": ("s0", 1),
    "release s0": ("s0", -1),
    "release s2": ("s2", -1),
}


def _after(name: str) -> tuple[tuple[str, int], ...]:
    sid, delta = WRITES[name]
    loads = list(BASE)
    loads[int(sid[1:])] += delta
    return tuple(zip(_servers(4), loads, strict=True))


def _racing_version(racing: str) -> LoadTable:
    """A flat table whose store's ``racing`` list ("undo" or "loads") can stage a race."""
    base = LoadTable.build(zip(_servers(4), BASE, strict=True))
    store = base.flat
    assert store is not None
    setattr(store, racing, _RacingList(getattr(store, racing)))
    return base


@pytest.mark.skipif(BUILD == "compiled", reason="compiled code calls list.append natively, "
                    "past the hook that stages the interleaving")
@pytest.mark.parametrize("first", list(WRITES))
@pytest.mark.parametrize("second", list(WRITES))
def test_a_writer_that_loses_the_claim_redoes_its_write(first: str, second: str) -> None:
    """``second`` claims the next undo position between ``first``'s ownership check and
    its append: ``first`` must see its claim fail and redo its write on a private copy;
    both results and the shared version must be as if each had run alone."""
    version = _racing_version("undo")
    assert version.flat is not None
    undo = cast(_RacingList, version.flat.undo)
    seconds: list[LoadTable] = []
    undo.on_race = lambda: seconds.append(version.add_load(*WRITES[second]))
    undo.race.append(1)
    result = version.add_load(*WRITES[first])
    assert seconds, "the staged writer did not run"
    assert result.items() == _after(first)
    assert seconds[0].items() == _after(second)
    assert version.items() == tuple(zip(_servers(4), BASE, strict=True))
    _check(result, [n for _, n in _after(first)], first)


@pytest.mark.skipif(BUILD == "compiled", reason="compiled code indexes lists natively")
@pytest.mark.parametrize("second", list(WRITES))
def test_a_reader_that_races_a_writer_rereads(second: str) -> None:
    """A writer of the same version goes between a reader's read of the loads and its
    check: the reader must notice and answer for its own version, not the writer's."""
    for sid in _servers(4):
        version = _racing_version("loads")
        assert version.flat is not None
        loads = cast(_RacingList, version.flat.loads)
        loads.on_race = lambda v=version: v.add_load(*WRITES[second])
        loads.race.append(1)
        assert version.load(sid) == BASE[int(sid[1:])]
        assert not loads.race  # the race did happen
