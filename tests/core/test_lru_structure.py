"""StickyLru as a data structure, against a plain reference LRU (R-LRU-1..5).

test_lru.py checks the recency rules through ``step``; this file drives the map itself
through seeded random operation sequences and compares every query after every operation
with a plain list, oldest first. It also checks what the shared-log representation
(affinity_engine/lru.py) must keep true although the public API does not show it:

* persistence: every old version still answers as it did, after any later operation on
  it or on versions derived from it, including branches and concurrent threads;
* canonical equality, hashing and repr: the same capacity and items in the same order
  are equal, hash alike and print alike, whatever the history (touches, deletions,
  evictions, compactions);
* the log stays bounded (compaction), and the tip's index holds exactly its entries.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest

from affinity_engine import BUILD, StickyLru
from affinity_engine.values import evolve

from .threads import run_switching

Plain = list[tuple[str, str]]


class Reference:
    """The plain LRU of R-LRU-1..5: a list of (key, server), least recent first."""

    def __init__(self, capacity: int, items: Plain | None = None) -> None:
        self.capacity = capacity
        self.items: Plain = list(items or [])

    def copy(self) -> Reference:
        return Reference(self.capacity, self.items)

    def where(self, key: str) -> int | None:
        for i, (k, _) in enumerate(self.items):
            if k == key:
                return i
        return None

    def evicts_on_put(self, key: str) -> str | None:
        if self.where(key) is not None or len(self.items) < self.capacity:
            return None
        return self.items[0][0]

    def put(self, key: str, server: str) -> None:
        i = self.where(key)
        if i is not None:
            del self.items[i]
        elif len(self.items) >= self.capacity:
            del self.items[0]
        self.items.append((key, server))

    def touch(self, key: str) -> None:
        i = self.where(key)
        assert i is not None
        self.items.append(self.items.pop(i))

    def delete(self, key: str) -> None:
        i = self.where(key)
        if i is not None:
            del self.items[i]


def _agrees(lru: StickyLru, ref: Reference, keys: list[str]) -> None:
    assert lru.items() == tuple(ref.items)
    assert list(lru) == ref.items
    assert len(lru) == len(ref.items) <= lru.capacity  # R-LRU-5
    plain = dict(ref.items)
    for key in keys:
        assert (key in lru) == (key in plain)
        assert lru.peek(key) == plain.get(key)
        assert lru.evicts_on_put(key) == ref.evicts_on_put(key)
    # the representation's own invariants: a bounded log, and the tip's index = its items
    assert lru.lo <= lru.hi <= 2 * len(lru) + 33
    if len(lru.store.log) == lru.hi:
        index: dict[str, Any] = lru.store.index  # request_id -> (request_id, server)
        assert {k: c[1] for k, c in index.items()} == plain


def _random_op(rng: random.Random, lru: StickyLru, ref: Reference,
               keys: list[str]) -> tuple[StickyLru, str]:
    """One random operation, applied to both; queries (R-LRU-1) must not change order."""
    key, server, op = rng.choice(keys), f"s{rng.randrange(3)}", rng.random()
    if op < 0.45:
        ref.put(key, server)
        return lru.put(key, server), f"put({key}, {server})"
    if op < 0.85 and ref.items:
        key = rng.choice(ref.items)[0]
        ref.touch(key)
        return lru.touch(key), f"touch({key})"
    if op < 0.95:
        ref.delete(key)
        return lru.delete(key), f"delete({key})"
    return lru, f"query({key}, {key in lru}, {lru.peek(key)})"  # R-LRU-1: no refresh


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 40])
def test_random_sequences_match_the_reference(capacity: int) -> None:
    """R-LRU-1..5 after every operation, through many compactions (the log is compacted
    once its window passes 2 x size + 32 records, i.e. every few dozen writes here)."""
    rng = random.Random(capacity)
    keys = [f"r{i}" for i in range(capacity + 3)]
    lru, ref = StickyLru(capacity), Reference(capacity)
    compactions, store = 0, lru.store
    for step in range(3000):
        lru, what = _random_op(rng, lru, ref, keys)
        compactions += lru.store is not store
        store = lru.store
        try:
            _agrees(lru, ref, keys)
        except AssertionError as exc:
            raise AssertionError(f"capacity {capacity}, step {step}, {what}") from exc
    assert compactions >= 10  # the boundary was crossed many times


@pytest.mark.parametrize("capacity", [1, 3, 8])
def test_every_old_version_is_unchanged_and_usable(capacity: int) -> None:
    """Persistence: all versions of a run, each re-checked at the end; then writes to
    random old versions (which share their log with newer ones) branch correctly and
    leave every other version as it was."""
    rng = random.Random(100 + capacity)
    keys = [f"r{i}" for i in range(capacity + 2)]
    lru, ref = StickyLru(capacity), Reference(capacity)
    history: list[tuple[StickyLru, Reference]] = [(lru, ref.copy())]
    for _ in range(400):
        lru, _what = _random_op(rng, lru, ref, keys)
        history.append((lru, ref.copy()))
    for old, old_ref in history:
        _agrees(old, old_ref, keys)
    for _ in range(300):  # branch: continue from a random old version for a few steps
        base, base_ref = rng.choice(history)
        branch, branch_ref = base, base_ref.copy()
        for _ in range(rng.randrange(1, 6)):
            branch, _what = _random_op(rng, branch, branch_ref, keys)
        _agrees(branch, branch_ref, keys)
        history.append((branch, branch_ref))
    for old, old_ref in history:
        _agrees(old, old_ref, keys)


def test_touch_of_an_old_version_leaves_the_new_one_alone() -> None:
    """R-LRU-2 on a version that is no longer the newest of its log."""
    a = StickyLru.from_items(3, (("a", "s0"), ("b", "s1"), ("c", "s2")))
    b = a.touch("a")
    c = a.touch("b")  # a is no longer the tip: it re-derives its entries, b is untouched
    assert b.items() == (("b", "s1"), ("c", "s2"), ("a", "s0"))
    assert c.items() == (("a", "s0"), ("c", "s2"), ("b", "s1"))
    assert a.items() == (("a", "s0"), ("b", "s1"), ("c", "s2"))
    assert b.put("d", "s3").items() == (("c", "s2"), ("a", "s0"), ("d", "s3"))
    assert b.evicts_on_put("d") == "b" and c.evicts_on_put("d") == "a"


def _histories(items: Plain, capacity: int) -> list[StickyLru]:
    """Maps holding ``items`` in this order, reached by different histories."""
    direct = StickyLru.from_items(capacity, tuple(items))
    noisy = StickyLru(capacity)
    for i in range(40):  # fill with other keys (evicted, deleted, compacted later)
        noisy = noisy.put(f"x{i}", "sx")
    for key, server in reversed(items):
        noisy = noisy.put(key, "wrong").put(key, server)
    for key, _ in items:
        noisy = noisy.touch(key)
    for i in range(40):
        noisy = noisy.delete(f"x{i}")
    rebuilt = pickle.loads(pickle.dumps(noisy))
    old = StickyLru.from_items(capacity, tuple(items))
    _ = old.put("zz", "s9")  # old is no longer the tip of its log
    return [direct, noisy, rebuilt, old, evolve(direct)]


@pytest.mark.parametrize("items", [[], [("a", "s0")], [("a", "s0"), ("b", "s1"), ("c", "s0")]])
def test_equal_items_in_equal_order_are_equal_and_hash_alike(items: Plain) -> None:
    """Canonical value semantics: only capacity and the items in recency order count."""
    maps = _histories(items, capacity=5)
    for m in maps:
        assert m.items() == tuple(items)
        assert m == maps[0] and (m != maps[0]) is False and hash(m) == hash(maps[0])
        assert repr(m) == f"StickyLru(capacity=5, items={tuple(items)!r})"  # not the log
    assert len({*maps}) == 1
    if len(items) > 1:
        swapped = StickyLru.from_items(5, tuple(reversed(items)))
        assert swapped != maps[0]  # same entries, other order
    assert StickyLru.from_items(6, tuple(items)) != maps[0]  # other capacity
    assert maps[0] != tuple(items)


def test_capacity_one_keeps_only_the_latest_key() -> None:
    """R-LRU-3, R-LRU-5 at capacity 1, through many compactions."""
    lru = StickyLru(1)
    for i in range(200):
        assert lru.evicts_on_put(f"k{i}") == (None if i == 0 else f"k{i - 1}")
        lru = lru.put(f"k{i}", "s").touch(f"k{i}")
        assert lru.items() == ((f"k{i}", "s"),)
    assert len(lru.store.log) <= 2 * len(lru) + 33  # compacted as it went


def test_bad_uses_fail_clearly() -> None:
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        StickyLru(0)
    lru = StickyLru(2).put("a", "s0")
    with pytest.raises(KeyError):
        lru.touch("b")  # touch is a lookup of a present key
    assert lru.delete("b") is lru  # absent keys are left alone (R-LRU-4)
    assert lru.touch("a") is lru  # already the most recent
    assert lru.cleared() == StickyLru(2) and lru.items() == (("a", "s0"),)


def test_the_log_stays_bounded_under_long_use() -> None:
    """Compaction: 20,000 touches of a 10-entry map keep the log within 2 x size + 33."""
    rng = random.Random(5)
    lru = StickyLru.from_items(10, tuple((f"k{i}", "s") for i in range(10)))
    longest = 0
    for _ in range(20_000):
        lru = lru.touch(f"k{rng.randrange(10)}")
        longest = max(longest, len(lru.store.log))
    assert longest <= 2 * 10 + 33


def test_threads_sharing_one_version_each_get_their_own_result() -> None:
    """Four threads writing from one shared version at once, as often as CPython switches
    threads: every result, and the shared version, must match the reference. A smoke
    test (real races here are rare); the interleavings are staged deterministically by
    the two tests below."""
    keys = [f"r{i}" for i in range(6)]
    base_ref = Reference(4, [(k, "s0") for k in keys[:4]])
    bases = [StickyLru.from_items(4, tuple(base_ref.items))]
    failures: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            lru, ref = bases[-1], base_ref.copy()
            for _ in range(3):
                lru, what = _random_op(rng, lru, ref, keys)
                if lru.items() != tuple(ref.items):
                    failures.append(f"thread {seed}: {what}: {lru.items()} != {ref.items}")
            if bases[-1].items() != tuple(base_ref.items):
                failures.append(f"thread {seed}: the shared version changed")

    run_switching(worker)
    assert failures == []


class _RacingLog(list):  # type: ignore[type-arg]
    """A log whose next append first lets another writer of the same version go."""

    def __init__(self, items: list[object]) -> None:
        super().__init__(items)
        self.race: list[object] = []

    def append(self, item: object) -> None:
        if self.race:
            self.race.pop()  # once
            self.on_race()
        super().append(item)

    def on_race(self) -> None:
        raise NotImplementedError


class _RacingIndex(dict):  # type: ignore[type-arg]
    """An index whose next read first lets another writer of the same version go."""

    race: list[object]

    def get(self, key: object, default: object = None) -> object:
        if self.race:
            self.race.pop()
            self.on_race()
        return super().get(key, default)

    def on_race(self) -> None:
        raise NotImplementedError


WRITES = {
    "touch a": lambda m: m.touch("a"),
    "touch b": lambda m: m.touch("b"),
    "put d": lambda m: m.put("d", "s9"),
    "put a": lambda m: m.put("a", "s9"),
    "delete b": lambda m: m.delete("b"),
    "delete a": lambda m: m.delete("a"),
}


def _reference_after(name: str) -> tuple[tuple[str, str], ...]:
    ref = Reference(3, [("a", "s0"), ("b", "s1"), ("c", "s2")])
    verb, key = name.split()
    if verb == "touch":
        ref.touch(key)
    elif verb == "put":
        ref.put(key, "s9")
    else:
        ref.delete(key)
    return tuple(ref.items)


def _racing_version(log_cls: type, index_cls: type) -> StickyLru:
    base = StickyLru.from_items(3, (("a", "s0"), ("b", "s1"), ("c", "s2")))
    store = base.store
    log, index = log_cls(store.log), index_cls(store.index)
    index.race = []
    return evolve(base, store=type(store)(log, index))


@pytest.mark.skipif(BUILD == "compiled", reason="compiled code calls list.append and "
                    "dict.get natively, past the hooks that stage the interleaving")
@pytest.mark.parametrize("first", list(WRITES))
@pytest.mark.parametrize("second", list(WRITES))
def test_a_writer_that_loses_the_claim_redoes_its_write(first: str, second: str) -> None:
    """Two writers of one version, interleaved deterministically: ``second`` claims the
    next log position between ``first``'s ownership check and its append. ``first`` must
    see its claim fail and redo its write on a private copy; both results and the shared
    version must be as if each had run alone."""
    version = _racing_version(_RacingLog, _RacingIndex)
    seconds: list[StickyLru] = []

    def race() -> None:
        seconds.append(WRITES[second](version))

    version.store.log.on_race = race  # type: ignore[attr-defined]
    version.store.log.race.append(1)  # type: ignore[attr-defined]
    result = WRITES[first](version)
    assert seconds, "the staged writer did not run"
    assert result.items() == _reference_after(first)
    assert seconds[0].items() == _reference_after(second)
    assert version.items() == (("a", "s0"), ("b", "s1"), ("c", "s2"))


@pytest.mark.skipif(BUILD == "compiled", reason="compiled code calls dict.get natively")
@pytest.mark.parametrize("second", list(WRITES))
def test_a_reader_that_races_a_writer_rereads(second: str) -> None:
    """A writer of the same version goes between a reader's index read and its check: the
    reader must notice and answer for its own version, not the writer's."""
    for key, server in (("a", "s0"), ("b", "s1"), ("d", None)):
        version = _racing_version(list, _RacingIndex)
        index = version.store.index
        index.on_race = lambda v=version: WRITES[second](v)  # type: ignore[attr-defined]
        index.race.append(1)  # type: ignore[attr-defined]
        assert version.peek(key) == server
        assert not index.race  # type: ignore[attr-defined]  # the race did happen
