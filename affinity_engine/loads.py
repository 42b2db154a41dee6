"""The active pool and its in-flight counts, as a persistent wide segment tree.

Theory of operation
-------------------
verl keeps the active pool as the keys of a dict: *pool order* is insertion order, a
re-added server goes to the end, and "first in dict order" breaks ties (R-POOL-1..3).
Routing needs three queries on that pool, on every acquire:

* the load of one server (the pinned one);
* the minimum (and, for PR #6533's gate, the maximum) load;
* the k-th least-loaded server in pool order, for k-th-of-the-ties selection.

A :class:`LoadTable` answers all three from a segment tree over pool positions with
fan-out :data:`FANOUT` (32), the same shape as a HAMT:

* a leaf holds up to 32 loads as a tuple, with their ``min``, count at the min and
  ``max``;
* an internal node holds up to 32 children and the tuples of their mins, counts at the
  min and maxes, so its own summary is three C-level reductions.

Changing one load copies one node per level -- ``ceil(log32 n)`` levels, so two up to
1,024 replicas and three up to 32,768 -- and shares everything else: acquire and release
never copy the pool. Position ``p`` lives in leaf ``p >> 5`` at slot ``p & 31``.

**Up to 32 servers** there is no tree. Copying the one leaf of up to 32 loads on every
acquire and release was most of what the table cost at that size, so a flat table
changes its loads in place and stays persistent by keeping what it overwrote (Baker's
persistent arrays, with the claim protocol of the sticky map's log in
:mod:`affinity_engine.lru`):

* a family of versions shares one :class:`_Flat` store: ``loads``, the list of the
  newest version's loads, and ``undo``, a record ``(version, position, old load)`` of
  every write since the store was made, whose first version is ``base``. A version is its number
  ``version`` and its own summary: ``low``, ``ties`` (how many servers are at ``low``)
  and ``high``;
* **the tip** is the version with ``version == base + len(undo)``: nothing was written
  after it, so ``loads`` holds its loads and a read is one list index;
* **a write by the tip** claims the next undo position -- it appends its record and
  checks that the record landed there (``list.append`` is atomic, so of two writers of
  one version exactly one wins; the other proceeds as a non-tip) -- and only then
  overwrites the load. The summary follows from the old one as for a leaf
  (:func:`_bumped`), and the new version is the new tip: O(1), no copy;
* **a non-tip version** (an old state the model checkers branch from, or a writer that
  lost its claim) copies ``loads`` and undoes the records after its version, newest
  first, into a private, frozen store whose base is its version (:meth:`LoadTable._own`):
  O(n + writes since), once per such version. Its loads do not change, only where they
  are kept, and the swap is one reference store. Only committed records are undone: the
  record at undo position ``j`` was applied iff it was written from version ``base + j``
  (its writer won that claim); a losing writer's record lands later, was never applied,
  and holds a value from before the winner's write;
* **a frozen store is never written in place**: a write from it copies its loads into a
  new store, as a persistent tuple would, so an old state stepped many times (a model
  checker's) pays one copy per step and its own re-derivation once;
* **compaction**: the write that takes ``undo`` past ``2 x n + 32`` records starts a new
  store from a copy of the loads, so the copy is amortised O(1) per write;
* **readers validate**: a read of the tip's loads is trusted only if ``undo`` did not
  grow during it; otherwise it is redone on an owned store, as in the sticky map.

Equality, hashing, repr and pickling of a table go through its servers, total and loads,
never through the representation.

The pool tuple and the ``server -> position`` map change only when servers are added or
removed; those events rebuild the tree in ``O(n)``, off the hot path. The rebuild keeps
the structure canonical: equal pools with equal loads give equal tables.

All loads are Python ints; there are no floats anywhere in a routing decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, cast, final

from immutables import Map

from .values import Value, evolve, register

__all__ = ["FANOUT", "LoadTable"]

# Final: the compiled build inlines them as constants instead of reading the module's
# globals on every level of every walk.
FANOUT: Final = 32
_BITS: Final = 5
_MASK: Final = FANOUT - 1

# Leaf: (min, count_at_min, max, loads).
# Internal: (min, count_at_min, max, children, child_mins, child_counts, child_maxes).
Node = tuple[Any, ...]


def _leaf(loads: tuple[int, ...]) -> Node:
    # One typed pass for the three summaries: C in the compiled build, where the generic
    # min/count/max calls would each cost a full interpreter-speed scan.
    low = high = loads[0]
    count = 0
    for load in loads:
        if load < low:
            low, count = load, 1
        elif load == low:
            count += 1
        if load > high:
            high = load
    return (low, count, high, loads)


def _bumped(leaf: Node, j: int, delta: int) -> Node:
    """``leaf`` with slot ``j`` changed by ``delta``: equal to ``_leaf`` of the new loads.

    Acquire and release move one load by one, so the summary is updated from the old
    one instead of rescanned; a scan remains only when the unique minimum moves up or
    a maximum moves down. Any other delta (an observation) rescans.
    """
    loads: tuple[int, ...] = leaf[3]
    old = loads[j]
    new = old + delta
    changed = _with_int(loads, j, new)
    low: int = leaf[0]
    count: int = leaf[1]
    high: int = leaf[2]
    if delta == 1 and (old != low or count > 1):
        # The minimum stays (one fewer at it if ``old`` was there); the max may grow.
        return (low, count - 1 if old == low else count, new if new > high else high,
                changed)
    if delta == -1 and old != high:
        # The maximum stays; the minimum may be joined or undercut.
        if new < low:
            return (new, 1, high, changed)
        return (low, count + 1 if new == low else count, high, changed)
    return _leaf(changed)


def _internal(children: tuple[Node, ...]) -> Node:
    mins = tuple(c[0] for c in children)
    counts = tuple(c[1] for c in children)
    maxes = tuple(c[2] for c in children)
    return _summarise(children, mins, counts, maxes)


def _summarise(
    children: tuple[Node, ...],
    mins: tuple[int, ...],
    counts: tuple[int, ...],
    maxes: tuple[int, ...],
) -> Node:
    low, high = mins[0], maxes[0]
    at_low = 0
    for i in range(len(mins)):  # one typed pass, as in _leaf
        child_min = mins[i]
        if child_min < low:
            low, at_low = child_min, counts[i]
        elif child_min == low:
            at_low += counts[i]
        if maxes[i] > high:
            high = maxes[i]
    return (low, at_low, high, children, mins, counts, maxes)


# One-item replacements in a tuple, through a list: cheaper than slicing and unpacking,
# and typed, so the compiled build copies without generic object calls.
def _with_item(items: tuple[Node, ...], i: int, value: Node) -> tuple[Node, ...]:
    copy = list(items)
    copy[i] = value
    return tuple(copy)


def _with_int(items: tuple[int, ...], i: int, value: int) -> tuple[int, ...]:
    copy = list(items)
    copy[i] = value
    return tuple(copy)


def _build(loads: list[int]) -> tuple[Node, int]:
    """The root and the number of internal levels above the leaves."""
    level = [_leaf(tuple(loads[i : i + FANOUT])) for i in range(0, len(loads), FANOUT)]
    depth = 0
    while len(level) > 1:
        level = [_internal(tuple(level[i : i + FANOUT])) for i in range(0, len(level), FANOUT)]
        depth += 1
    return level[0], depth


_NO_POSITIONS: Map[str, int] = Map()

# An undo record is the 3-tuple ``(version written from, position, old load)``, held as an
# opaque ``object``: a claim is checked by identity (each write makes a new one), and a
# tuple typed as such would be unboxed by mypyc and re-boxed as a new object at every
# store (as lru._Record).
_Undo = object


def _undo_record(version: int, position: int, old: int) -> _Undo:
    record: _Undo = (version, position, old)
    return record


@final
class _Flat:
    """The loads and undo log shared by a family of flat tables (module docstring)."""

    __slots__ = ("base", "frozen", "loads", "undo")
    loads: list[int]
    undo: list[_Undo]
    base: int
    frozen: bool  # an old version's private copy: never written in place

    def __init__(self, loads: list[int], base: int, frozen: bool = False) -> None:
        self.loads = loads
        self.undo = []
        self.base = base
        self.frozen = frozen

    def __repr__(self) -> str:
        # The loads of the newest version only; a table's loads are its items().
        return f"_Flat(base={self.base}, {len(self.undo)} writes, frozen={self.frozen})"


def _flat_summary(loads: list[int]) -> tuple[int, int, int]:
    """``(min, count at the min, max)`` of a non-empty list, in one typed pass: :func:`_leaf`'s
    loop over a flat table's list (typed apart, so each stays a C loop when compiled)."""
    low = high = loads[0]
    count = 0
    for load in loads:
        if load < low:
            low, count = load, 1
        elif load == low:
            count += 1
        if load > high:
            high = load
    return low, count, high


@final
class LoadTable(Value):
    """Active servers in pool order with their in-flight counts (a native value)."""

    __slots__ = ("depth", "flat", "high", "low", "position", "servers", "ties", "total",
                 "tree", "version")
    __match_args__ = ("servers", "position", "tree", "depth", "total", "flat", "version",
                      "low", "ties", "high")
    servers: tuple[str, ...]
    position: Map[str, int]
    tree: Node | None  # more than 32 servers: the segment tree
    depth: int
    total: int
    flat: _Flat | None  # 1 to 32 servers: the shared store, and this version's summary
    version: int
    low: int
    ties: int
    high: int

    def __init__(self, servers: tuple[str, ...] = (), position: Map[str, int] = _NO_POSITIONS,
                 tree: Node | None = None, depth: int = 0, total: int = 0,
                 flat: _Flat | None = None, version: int = 0, low: int = 0, ties: int = 0,
                 high: int = 0) -> None:
        object.__setattr__(self, "servers", servers)
        object.__setattr__(self, "position", position)
        object.__setattr__(self, "tree", tree)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "flat", flat)
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "ties", ties)
        object.__setattr__(self, "high", high)

    # ----------------------------------------------------------------- building
    @classmethod
    def build(cls, items: Iterable[tuple[str, int]]) -> LoadTable:
        pairs = list(items)
        if not pairs:
            return cls()
        servers = tuple(s for s, _ in pairs)
        loads = [n for _, n in pairs]
        position = Map({s: i for i, s in enumerate(servers)})
        if len(loads) <= FANOUT:
            low, ties, high = _flat_summary(loads)
            return cls(servers, position, None, 0, sum(loads), _Flat(loads, 0), 0, low, ties,
                       high)
        root, depth = _build(loads)
        return cls(servers, position, root, depth, sum(loads))

    def items(self) -> tuple[tuple[str, int], ...]:
        """``(server_id, load)`` pairs in pool order."""
        if self.flat is not None:  # the pairs straight from the store (checkers read a lot)
            while True:
                store = self._tip()
                pairs = tuple(zip(self.servers, store.loads, strict=True))
                if store.base + len(store.undo) == self.version:  # no claim during the read
                    return pairs
        return tuple(zip(self.servers, self._loads(), strict=True))

    def _loads(self) -> list[int]:
        """The loads in pool order (a fresh list)."""
        if self.flat is not None:
            while True:
                store = self._tip()
                copy = list(store.loads)
                if store.base + len(store.undo) == self.version:  # no claim during the copy
                    return copy
        out: list[int] = []
        if self.tree is not None:
            _collect(self.tree, self.depth, out)
        return out

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.servers)

    def __contains__(self, server_id: object) -> bool:
        return server_id in self.position

    def load(self, server_id: str) -> int:
        """The load of an active server, or 0 for an inactive one (verl's ``get``)."""
        # One C-level subscript of the Map: routing asks about active servers, so the
        # KeyError is the rare case. (``Map.get`` is a generic method call in the
        # compiled build, about four times the cost.)
        try:
            p: int = self.position[server_id]
        except KeyError:
            return 0
        if self.flat is not None:
            while True:
                store = self._tip()
                load = store.loads[p]
                if store.base + len(store.undo) == self.version:
                    return load
        node = self.tree
        assert node is not None
        for level in range(self.depth, 0, -1):
            node = node[3][(p >> (_BITS * level)) & _MASK]
        loads: tuple[int, ...] = node[3]
        return loads[p & _MASK]

    @property
    def min_load(self) -> int:
        if self.flat is not None:
            return self.low
        tree = self.tree
        assert tree is not None, "empty pool has no minimum"
        low: int = tree[0]  # a typed local: an unboxing check, not a call of int()
        return low

    @property
    def max_load(self) -> int:
        if self.flat is not None:
            return self.high
        tree = self.tree
        assert tree is not None, "empty pool has no maximum"
        high: int = tree[2]
        return high

    @property
    def tie_count(self) -> int:
        """How many active servers share the minimum load."""
        if self.flat is not None:
            return self.ties
        tree = self.tree
        assert tree is not None, "empty pool has no ties"
        ties: int = tree[1]
        return ties

    def least_loaded(self, k: int) -> str:
        """The k-th (0-based, pool order) server among those at the minimum load."""
        if self.flat is not None:
            assert 0 <= k < self.ties, "k outside the tie set"
            while True:
                store = self._tip()
                slot = _kth_at(store.loads, self.low, k)
                if store.base + len(store.undo) == self.version:  # no claim during the scan
                    assert slot >= 0, "k outside the tie set"
                    return self.servers[slot]
        node = self.tree
        assert node is not None, "empty pool has no ties"
        ties: int = node[1]
        assert 0 <= k < ties, "k outside the tie set"
        low: int = node[0]
        base = 0
        for level in range(self.depth, 0, -1):
            # Skip the children at the minimum until the one holding the k-th tie; the
            # scans for the next child at the minimum are C-level tuple.index calls.
            mins, counts = node[4], node[5]
            i = mins.index(low)
            while k >= counts[i]:
                k -= counts[i]
                i = mins.index(low, i + 1)
            node = node[3][i]
            base += i << (_BITS * level)
        # The k-th slot of the leaf at the minimum, in one typed pass: tuple.index would
        # compare boxed objects through the generic protocol in the compiled build.
        loads: tuple[int, ...] = node[3]
        slot = 0
        for load in loads:
            if load == low:
                if k == 0:
                    break
                k -= 1
            slot += 1
        server: str = self.servers[base + slot]
        return server

    def least_loaded_all(self) -> tuple[str, ...]:
        """Every server at the minimum load, in pool order (for ``allowed``)."""
        if not self.servers:
            return ()
        # One pass over the loads: asking least_loaded for each of k ties costs O(k * n).
        low = self.min_load
        return tuple([s for s, n in zip(self.servers, self._loads(), strict=True) if n == low])

    # ---------------------------------------------------------------- updating
    def add_load(self, server_id: str, delta: int) -> LoadTable:
        """Add ``delta`` to an active server's load (the caller keeps it >= 0)."""
        p = self.position[server_id]
        if self.flat is not None:
            return self._add_flat(p, delta)
        node = self.tree
        assert node is not None
        path: list[tuple[Node, int]] = []
        for level in range(self.depth, 0, -1):
            i = (p >> (_BITS * level)) & _MASK
            path.append((node, i))
            node = node[3][i]
        new = _bumped(node, p & _MASK, delta)
        child = node  # the node that ``new`` replaces
        for parent, i in reversed(path):
            children = _with_item(parent[3], i, new)
            if new[0] == child[0] and new[1] == child[1] and new[2] == child[2]:
                # The child's summary did not change (the usual case away from the
                # minimum and the maximum): only its pointer moves, and the parent keeps
                # its summary and summary tuples -- the value _summarise would give.
                new = (parent[0], parent[1], parent[2], children, parent[4], parent[5],
                       parent[6])
                child = parent
                continue
            child = parent
            new = _summarise(children, _with_int(parent[4], i, new[0]),
                             _with_int(parent[5], i, new[1]), _with_int(parent[6], i, new[2]))
        return LoadTable(self.servers, self.position, new, self.depth, self.total + delta)

    def _add_flat(self, p: int, delta: int) -> LoadTable:
        """A write of a flat table: in place by the tip (module docstring)."""
        store = self._tip()
        version = self.version + 1
        if store.frozen:  # an old version's copy: the write goes to a new store
            loads = list(store.loads)
            old = loads[p]
            loads[p] = old + delta
            store = _Flat(loads, version)
        else:
            loads, undo = store.loads, store.undo
            old = loads[p]
            record = _undo_record(self.version, p, old)
            claim = self.version - store.base
            undo.append(record)
            if undo[claim] is not record:
                return self._add_flat(p, delta)  # lost the claim: redo on an owned store
            loads[p] = old + delta
            if len(undo) > 2 * len(loads) + 32:
                store = _Flat(list(loads), version)  # compaction: a new store for the tip
        new = old + delta
        low, ties, high = self.low, self.ties, self.high
        # As _bumped: acquire and release move one load by one, so the summary follows
        # from the old one; a scan remains only when the unique minimum moves up or a
        # maximum moves down, and for any other delta (an observation).
        if delta == 1 and (old != low or ties > 1):
            if old == low:
                ties -= 1
            if new > high:
                high = new
        elif delta == -1 and old != high:
            if new < low:
                low, ties = new, 1
            elif new == low:
                ties += 1
        else:
            low, ties, high = _flat_summary(loads)
        return LoadTable(self.servers, self.position, None, 0, self.total + delta, store,
                         version, low, ties, high)

    def set_load(self, server_id: str, value: int) -> LoadTable:
        return self.add_load(server_id, value - self.load(server_id))

    # ------------------------------------------------------- value semantics
    def __eq__(self, other: object) -> bool:
        if other.__class__ is not LoadTable:
            return NotImplemented
        assert isinstance(other, LoadTable)
        if self.servers != other.servers or self.total != other.total:
            return False
        if self.flat is other.flat and self.version == other.version:
            return True  # the same version of the same store
        return self._loads() == other._loads()

    def __ne__(self, other: object) -> bool:
        if other.__class__ is not LoadTable:
            return NotImplemented
        return not self.__eq__(other)

    def __hash__(self) -> int:
        # Canonical: servers, total and loads, never the representation.
        return ("LoadTable", self.servers, self.total, tuple(self._loads())).__hash__()

    def __repr__(self) -> str:
        return f"LoadTable(items={self.items()!r}, total={self.total!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (self.items(), self.total)

    # --------------------------------------------------------------- internals
    def _tip(self) -> _Flat:
        """A store of which this flat version is the tip: its own, or a private copy."""
        store = self.flat
        assert store is not None
        if store.base + len(store.undo) == self.version:
            return store
        return self._own()

    def _own(self) -> _Flat:
        """Re-derive this version's loads into a private store (module docstring)."""
        while True:
            store = self.flat
            assert store is not None
            undo = store.undo
            written = len(undo)
            loads = list(store.loads)
            after = undo[self.version - store.base:written]
            if len(undo) == written:  # no claim during the copy
                break
        version = self.version
        for j in range(len(after) - 1, -1, -1):  # newest first, back to this version
            written_from, p, old = cast("tuple[int, int, int]", after[j])
            if written_from == version + j:  # committed: its writer won the claim
                loads[p] = old
        own = _Flat(loads, self.version, frozen=True)
        # The loads are unchanged, only where they are kept: one reference store.
        object.__setattr__(self, "flat", own)
        return own


register(LoadTable)


def _kth_at(loads: list[int], low: int, k: int) -> int:
    """The slot of the k-th load equal to ``low`` (-1 if there is none), in one typed pass."""
    for slot, load in enumerate(loads):
        if load == low:
            if k == 0:
                return slot
            k -= 1
    return -1


def _restore(items: tuple[tuple[str, int], ...], total: int) -> LoadTable:
    table = LoadTable.build(items)
    if table.total == total:
        return table
    return evolve(table, total=total)  # a table whose total was set apart from its loads


def _collect(node: Node, depth: int, out: list[int]) -> None:
    if depth == 0:
        out.extend(node[3])
        return
    for child in node[3]:
        _collect(child, depth - 1, out)
