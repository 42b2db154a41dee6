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

The value is persistent: every operation returns a new map and shares the rest of the
structure with the old one. Recency is a doubly linked list threaded through a HAMT
(``immutables.Map``): each entry stores its server and its older and newer neighbours.
A lookup, write or eviction therefore touches at most four entries, so its cost is
``O(log32 n)`` in the number of sticky entries and no operation copies the map. The
representation is canonical: two maps holding the same keys in the same recency order
are equal and hash alike, which lets model checkers keep states in ``seen`` sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import final

from immutables import Map

from .values import Value, register

__all__ = ["StickyLru"]

# (server_id, older neighbour, newer neighbour)
_Entry = tuple[str, "str | None", "str | None"]
_EMPTY: Map[str, _Entry] = Map()


@final
class StickyLru(Value):
    """An immutable LRU map ``request_id -> server_id`` with a fixed capacity (>= 1)."""

    __slots__ = ("capacity", "entries", "newest", "oldest")
    __match_args__ = ("capacity", "entries", "oldest", "newest")
    capacity: int
    entries: Map[str, _Entry]
    oldest: str | None
    newest: str | None

    def __init__(self, capacity: int, entries: Map[str, _Entry] = _EMPTY,
                 oldest: str | None = None, newest: str | None = None) -> None:
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "entries", entries)
        object.__setattr__(self, "oldest", oldest)
        object.__setattr__(self, "newest", newest)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, request_id: object) -> bool:
        # Membership never refreshes recency (R-LRU-1).
        return request_id in self.entries

    def peek(self, request_id: str) -> str | None:
        """The pinned server, without changing recency."""
        entry = self.entries.get(request_id)
        return None if entry is None else entry[0]

    def touch(self, request_id: str) -> StickyLru:
        """A lookup: the key becomes the most recent (R-LRU-2). The key must be present."""
        newest = self.newest
        if request_id == newest:
            return self
        assert newest is not None
        entries = self.entries
        server, older, newer = entries[request_id]
        assert newer is not None  # not the newest, so something is newer
        m = entries.mutate()
        oldest = self.oldest
        if older is None:
            oldest = newer
        else:
            o = m[older]
            m[older] = (o[0], o[1], newer)
        n = m[newer]
        m[newer] = (n[0], older, n[2])
        t = m[newest]  # read after the line above: newer may be the newest
        m[newest] = (t[0], t[1], request_id)
        m[request_id] = (server, newest, None)
        return StickyLru(self.capacity, m.finish(), oldest, request_id)

    def put(self, request_id: str, server_id: str) -> StickyLru:
        """A write (R-LRU-3): refresh an existing key, or evict the oldest key to make room."""
        entries, oldest, newest = self.entries, self.oldest, self.newest
        current = entries.get(request_id)
        if current is not None:
            if request_id == newest:
                return StickyLru(
                    self.capacity, entries.set(request_id, (server_id, current[1], None)),
                    oldest, newest,
                )
            entries, oldest, newest = _unlink(entries, oldest, newest, request_id)
        elif len(entries) >= self.capacity:
            assert oldest is not None
            entries, oldest, newest = _unlink(entries, oldest, newest, oldest)
        entries, oldest, newest = _append(entries, oldest, newest, request_id, server_id)
        return StickyLru(self.capacity, entries, oldest, newest)

    def evicts_on_put(self, request_id: str) -> str | None:
        """The key a write of ``request_id`` would evict, if any."""
        if request_id in self.entries or len(self.entries) < self.capacity:
            return None
        return self.oldest

    def delete(self, request_id: str) -> StickyLru:
        """Remove a key (R-LRU-4); absent keys are left alone."""
        if request_id not in self.entries:
            return self
        entries, oldest, newest = _unlink(self.entries, self.oldest, self.newest, request_id)
        return StickyLru(self.capacity, entries, oldest, newest)

    def cleared(self) -> StickyLru:
        return StickyLru(self.capacity)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        """``(request_id, server_id)`` pairs from least to most recent."""
        key = self.oldest
        while key is not None:
            server, _, newer = self.entries[key]
            yield key, server
            key = newer

    def items(self) -> tuple[tuple[str, str], ...]:
        return tuple(self)

    @classmethod
    def from_items(cls, capacity: int, items: tuple[tuple[str, str], ...]) -> StickyLru:
        """Build a map whose recency order is ``items`` (oldest first)."""
        lru = cls(capacity)
        for request_id, server_id in items:
            lru = lru.put(request_id, server_id)
        return lru


register(StickyLru)


def _unlink(
    entries: Map[str, _Entry], oldest: str | None, newest: str | None, key: str
) -> tuple[Map[str, _Entry], str | None, str | None]:
    _, older, newer = entries[key]
    m = entries.mutate()
    if older is None:
        oldest = newer
    else:
        o = m[older]
        m[older] = (o[0], o[1], newer)
    if newer is None:
        newest = older
    else:
        n = m[newer]
        m[newer] = (n[0], older, n[2])
    del m[key]
    return m.finish(), oldest, newest


def _append(
    entries: Map[str, _Entry], oldest: str | None, newest: str | None, key: str, server: str
) -> tuple[Map[str, _Entry], str | None, str | None]:
    m = entries.mutate()
    if newest is not None:
        n = m[newest]
        m[newest] = (n[0], n[1], key)
    m[key] = (server, newest, None)
    return m.finish(), (key if oldest is None else oldest), key
