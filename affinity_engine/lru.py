"""Persistent sticky map with least-recently-used eviction.

Theory of operation
-------------------
verl keeps ``request_id -> server_id`` in a ``cachetools.LRUCache``. Its recency rules
are part of the routing semantics (which conversation is evicted decides which one is
re-placed), so the spec fixes them exactly (R-LRU-1 .. R-LRU-5):

* a membership test (``rid in lru``) does not change recency;
* a lookup (:meth:`StickyLru.touch`) makes the key most recent;
* a write of an existing key updates the value and makes it most recent, without
  eviction; a write of a new key into a full map first evicts the least recent key;
* deletion and clearing remove entries.

The value is persistent: every operation returns a new map, and an old map keeps
answering exactly as it did, whatever is done to the maps derived from it (the model
checkers branch from old states).

**Representation: a shared write log, a window, and an index owned by the tip.** A family
of versions shares one :class:`_Store`: an append-only ``log`` of records, each a new
2-tuple ``(request_id, server_id)`` (server ``None`` records a deletion), and an ``index``
``request_id -> record``. A version is its capacity, its size and a window ``[lo, hi)`` of
the log. Its entries are, for each key, the *last* record of that key in its window,
unless that record is a deletion; recency is the order of those records. Records are
never changed once written, so a window always means the same entries.

* **The tip** is the one version whose ``hi`` equals the log's length: nothing was
  appended after it. The index holds exactly the tip's entries, so for the tip a lookup
  is one dict read, and a record ``c`` is live iff ``index[c[0]] is c`` (records are told
  apart by identity, so a superseded record with the same content is not live).
* **A write by the tip** (touch, put, delete) first *claims* the next log position by
  appending its new record and checking that the record landed at ``hi`` (``list.append``
  is atomic, so of two writers of one version exactly one wins; the other proceeds as a
  non-tip). Only the winner then updates the index, so the version it came from stops
  being the tip before the index changes. A touch is one dict read, one record, one
  append and one dict write: O(1), no copying.
* **Eviction** moves ``lo``: the least recent entry is always the record at ``lo`` (records
  before it, and stale ones after it, are skipped as ``lo`` advances; each record is
  skipped at most once along a line of versions), so an eviction deletes its key from the
  index and advances ``lo`` past its record.
* **Compaction.** Superseded records (and those before ``lo``) stay in the log until it
  holds more than ``2 x size + 32`` records; the write that passes that bound copies the
  live records, already in recency order, into a new store that takes over the index.
  A compaction leaves ``size`` records, and the next one needs the log to grow past twice
  that again (each write adds one record; a deletion also lowers the size), so the copy
  is amortised O(1) per write and the log never holds more than ``2 x size + 33``.
* **A non-tip version** (an old state, or one whose claim was lost) re-derives its entries
  from its window (O(window), once): it builds a private store from a copy of the log up
  to ``hi`` and a fresh index, and points itself at it (:meth:`StickyLru._own`). Its
  entries do not change, only where they are kept, so a reader never sees a difference;
  the swap is one reference store, so a concurrent reader sees the old store or the new
  one, both complete. From then on that version is the tip of its own store. So a caller
  that keeps using an old state (the model checkers branch on purpose) pays O(size)
  once per such state, not per access; per-event callers read what they need from a
  state before stepping it (the lockstep, the router check's harness).
* **Readers validate.** A read of the tip's index is trusted only if the log length is
  still ``hi`` after the read; otherwise a writer claimed the tip meanwhile and the read
  is redone on an owned store. This is what makes sharing one version between threads
  safe; it relies only on ``list.append`` and single reads being atomic (CPython).

Equality, hashing, iteration, repr and pickling go through the entries in recency order,
never through the representation: two maps with the same capacity and the same items in the
same order are equal and hash alike, whatever their histories.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast, final

from .values import Value, register

__all__ = ["StickyLru"]


# A record is the 2-tuple ``(request_id, server)``, server ``None`` for a deletion, held
# as an opaque ``object``: records are told apart by identity (each write makes a new
# one), and a tuple typed as such would be unboxed by mypyc and re-boxed as a new object
# at every store. Tuples of strings also leave the garbage collector's lists at its first
# pass, so the log does not make every later collection longer.
_Record = object


def _record(request_id: str, server: str | None) -> _Record:
    record: _Record = (request_id, server)
    return record


def _key(record: _Record) -> str:
    return cast("tuple[str, str | None]", record)[0]


def _server(record: _Record) -> str | None:
    return cast("tuple[str, str | None]", record)[1]


@final
class _Store:
    """The log and the tip's index, shared by a family of versions (module docstring)."""

    __slots__ = ("index", "log")
    log: list[_Record]
    index: dict[str, _Record]

    def __init__(self, log: list[_Record], index: dict[str, _Record]) -> None:
        self.log = log
        self.index = index

    def __repr__(self) -> str:
        # The log holds records of other versions too; a version's entries are its items().
        return f"_Store(log={len(self.log)} records, index={len(self.index)} keys)"


@final
class StickyLru(Value):
    """An immutable LRU map ``request_id -> server_id`` with a fixed capacity (>= 1)."""

    __slots__ = ("capacity", "hi", "lo", "size", "store")
    __match_args__ = ("capacity", "size", "lo", "hi", "store")
    capacity: int
    size: int
    lo: int
    hi: int
    store: _Store

    def __init__(self, capacity: int, size: int = 0, lo: int = 0, hi: int = 0,
                 store: _Store | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"StickyLru capacity must be >= 1, got {capacity}")
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "store", _Store([], {}) if store is None else store)

    # ------------------------------------------------------------------ reads
    def __len__(self) -> int:
        return self.size

    def __contains__(self, request_id: object) -> bool:
        # Membership never refreshes recency (R-LRU-1).
        while True:
            store = self._tip()
            found = request_id in store.index
            if len(store.log) == self.hi:  # no writer claimed the tip during the read
                return found

    def peek(self, request_id: str) -> str | None:
        """The pinned server, without changing recency."""
        while True:
            store = self._tip()
            cell = store.index.get(request_id)
            if len(store.log) == self.hi:
                return None if cell is None else _server(cell)

    def evicts_on_put(self, request_id: str) -> str | None:
        """The key a write of ``request_id`` would evict, if any."""
        while True:
            store = self._tip()
            present = request_id in store.index
            oldest = _key(store.log[self.lo]) if self.size > 0 else None
            if len(store.log) == self.hi:
                return None if present or self.size < self.capacity else oldest

    def items(self) -> tuple[tuple[str, str], ...]:
        """``(request_id, server_id)`` pairs from least to most recent."""
        while True:
            store = self._tip()
            index = store.index
            found: list[tuple[str, str]] = []
            for cell in store.log[self.lo:self.hi]:
                request_id, server = cast("tuple[str, str | None]", cell)
                if server is not None and index.get(request_id) is cell:
                    found.append((request_id, server))
            if len(store.log) == self.hi:
                return tuple(found)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        """``(request_id, server_id)`` pairs from least to most recent."""
        return iter(self.items())

    # ----------------------------------------------------------------- writes
    def touch(self, request_id: str) -> StickyLru:
        """A lookup: the key becomes the most recent (R-LRU-2). The key must be present."""
        store = self._tip()
        log, hi = store.log, self.hi
        index = store.index
        old = index.get(request_id)
        if old is None or old is log[hi - 1]:  # absent, or already the most recent
            if len(log) != hi:  # a writer claimed the tip meanwhile: redo on an owned store
                return self.touch(request_id)
            if old is None:
                raise KeyError(request_id)
            return self
        cell = _record(request_id, _server(old))
        log.append(cell)
        if log[hi] is not cell:
            return self.touch(request_id)  # lost the claim: redo on an owned store
        index[request_id] = cell
        lo = self.lo
        if log[lo] is old:  # the least recent entry moved to the end
            lo = _next_live(index, log, lo + 1, hi + 1)
        return _settled(self.capacity, self.size, lo, hi + 1, store)

    def put(self, request_id: str, server_id: str) -> StickyLru:
        """A write (R-LRU-3): refresh an existing key, or evict the oldest key to make room."""
        store = self._tip()
        log, hi = store.log, self.hi
        cell = _record(request_id, server_id)
        log.append(cell)
        if log[hi] is not cell:
            return self.put(request_id, server_id)  # lost the claim: redo on an owned store
        index = store.index
        lo, size = self.lo, self.size
        if request_id not in index:
            if size >= self.capacity:
                del index[_key(log[lo])]  # evict the least recent (R-LRU-3)
            else:
                size += 1
        index[request_id] = cell
        first = log[lo]
        if index.get(_key(first)) is not first:
            lo = _next_live(index, log, lo + 1, hi + 1)
        return _settled(self.capacity, size, lo, hi + 1, store)

    def delete(self, request_id: str) -> StickyLru:
        """Remove a key (R-LRU-4); absent keys are left alone."""
        store = self._tip()
        log, hi = store.log, self.hi
        if request_id not in store.index:
            if len(log) == hi:
                return self
            return self.delete(request_id)
        tomb = _record(request_id, None)
        log.append(tomb)
        if log[hi] is not tomb:
            return self.delete(request_id)
        index = store.index
        del index[request_id]
        lo = self.lo
        first = log[lo]
        if index.get(_key(first)) is not first:
            lo = _next_live(index, log, lo + 1, hi + 1)
        return _settled(self.capacity, self.size - 1, lo, hi + 1, store)

    def cleared(self) -> StickyLru:
        return StickyLru(self.capacity)

    @classmethod
    def from_items(cls, capacity: int, items: tuple[tuple[str, str], ...]) -> StickyLru:
        """Build a map whose recency order is ``items`` (oldest first)."""
        lru = StickyLru(capacity)
        for request_id, server_id in items:
            lru = lru.put(request_id, server_id)
        return lru

    # ------------------------------------------------------- value semantics
    def __eq__(self, other: object) -> bool:
        if other.__class__ is not StickyLru:
            return NotImplemented
        assert isinstance(other, StickyLru)
        if self.capacity != other.capacity or self.size != other.size:
            return False
        if self.store is other.store and self.lo == other.lo and self.hi == other.hi:
            return True  # the same window of the same log
        return self.items() == other.items()

    def __ne__(self, other: object) -> bool:
        if other.__class__ is not StickyLru:
            return NotImplemented
        return not self.__eq__(other)

    def __hash__(self) -> int:
        # Canonical: capacity and entries in recency order, never the representation.
        return ("StickyLru", self.capacity, self.items()).__hash__()

    def __repr__(self) -> str:
        # The entries, not the fields: ``lo``, ``hi`` and the store are where the entries
        # are kept, so equal maps showed different reprs (and none showed its entries).
        return f"StickyLru(capacity={self.capacity!r}, items={self.items()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (self.capacity, self.items())

    # --------------------------------------------------------------- internals
    def _tip(self) -> _Store:
        """A store of which this version is the tip: its own, or a private copy."""
        store = self.store
        if len(store.log) == self.hi:
            return store
        return self._own()

    def _own(self) -> _Store:
        """Re-derive this version's entries from its window into a private store."""
        log = self.store.log[:self.hi]  # records up to hi never change
        index: dict[str, _Record] = {}
        for cell in log[self.lo:]:
            request_id, server = cast("tuple[str, str | None]", cell)
            if server is None:
                index.pop(request_id, None)
            else:
                index[request_id] = cell
        store = _Store(log, index)
        # The entries are unchanged, only where they are kept: one reference store.
        object.__setattr__(self, "store", store)
        return store


register(StickyLru)


def _next_live(index: dict[str, _Record], log: list[_Record], i: int, hi: int) -> int:
    """The first position from ``i`` whose record is the tip's current one (else hi)."""
    while i < hi:
        cell = log[i]
        if index.get(_key(cell)) is cell:
            return i
        i += 1
    return hi


def _settled(capacity: int, size: int, lo: int, hi: int, store: _Store) -> StickyLru:
    """The new tip, compacting its log into a new store when it is mostly stale."""
    if hi > 2 * size + 32:  # the log, stale records and the dropped prefix included
        index = store.index
        live = [c for c in store.log[lo:hi] if index.get(_key(c)) is c]
        # The old store keeps no tip (its last record is ours), so the index moves over.
        return StickyLru(capacity, size, 0, len(live), _Store(live, index))
    return StickyLru(capacity, size, lo, hi, store)


def _restore(capacity: int, items: tuple[tuple[str, str], ...]) -> StickyLru:
    return StickyLru.from_items(capacity, items)
