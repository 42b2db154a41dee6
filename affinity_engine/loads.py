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

Changing one load copies one node per level -- ``ceil(log32 n)`` levels, so one level up
to 32 replicas and three up to 32,768 -- and shares everything else: acquire and release
never copy the pool. Position ``p`` lives in leaf ``p >> 5`` at slot ``p & 31``. Up to
32 servers the root is that one leaf -- a flat tuple of loads with its summary -- and
``load`` and ``add_load`` index it directly instead of walking levels.

The pool tuple and the ``server -> position`` map change only when servers are added or
removed; those events rebuild the tree in ``O(n)``, off the hot path. The rebuild keeps
the structure canonical: equal pools with equal loads give equal tables.

All loads are Python ints; there are no floats anywhere in a routing decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, final

from immutables import Map

from .values import Value, register

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


@final
class LoadTable(Value):
    """Active servers in pool order with their in-flight counts (a native value)."""

    __slots__ = ("depth", "position", "servers", "total", "tree")
    __match_args__ = ("servers", "position", "tree", "depth", "total")
    servers: tuple[str, ...]
    position: Map[str, int]
    tree: Node | None
    depth: int
    total: int

    def __init__(self, servers: tuple[str, ...] = (), position: Map[str, int] = _NO_POSITIONS,
                 tree: Node | None = None, depth: int = 0, total: int = 0) -> None:
        object.__setattr__(self, "servers", servers)
        object.__setattr__(self, "position", position)
        object.__setattr__(self, "tree", tree)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "total", total)

    # ----------------------------------------------------------------- building
    @classmethod
    def build(cls, items: Iterable[tuple[str, int]]) -> LoadTable:
        pairs = list(items)
        if not pairs:
            return cls()
        servers = tuple(s for s, _ in pairs)
        loads = [n for _, n in pairs]
        root, depth = _build(loads)
        return cls(servers, Map({s: i for i, s in enumerate(servers)}), root, depth, sum(loads))

    def items(self) -> tuple[tuple[str, int], ...]:
        """``(server_id, load)`` pairs in pool order."""
        tree = self.tree
        if tree is None:
            return ()
        if not self.depth:  # up to 32 servers: the root is the one leaf, its loads in order
            flat: tuple[int, ...] = tree[3]
            return tuple(zip(self.servers, flat, strict=True))
        out: list[int] = []
        _collect(tree, self.depth, out)
        return tuple(zip(self.servers, out, strict=True))

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.servers)

    def __contains__(self, server_id: object) -> bool:
        return server_id in self.position

    def load(self, server_id: str) -> int:
        """The load of an active server, or 0 for an inactive one (verl's ``get``)."""
        node = self.tree
        if node is None:
            return 0
        # One C-level subscript of the Map: routing asks about active servers, so the
        # KeyError is the rare case. (``Map.get`` is a generic method call in the
        # compiled build, about four times the cost.)
        try:
            p: int = self.position[server_id]
        except KeyError:
            return 0
        if not self.depth:  # up to 32 servers: the root is the one leaf
            flat: tuple[int, ...] = node[3]
            return flat[p]
        for level in range(self.depth, 0, -1):
            node = node[3][(p >> (_BITS * level)) & _MASK]
        loads: tuple[int, ...] = node[3]
        return loads[p & _MASK]

    @property
    def min_load(self) -> int:
        tree = self.tree
        assert tree is not None, "empty pool has no minimum"
        low: int = tree[0]  # a typed local: an unboxing check, not a call of int()
        return low

    @property
    def max_load(self) -> int:
        tree = self.tree
        assert tree is not None, "empty pool has no maximum"
        high: int = tree[2]
        return high

    @property
    def tie_count(self) -> int:
        """How many active servers share the minimum load."""
        tree = self.tree
        assert tree is not None, "empty pool has no ties"
        ties: int = tree[1]
        return ties

    def least_loaded(self, k: int) -> str:
        """The k-th (0-based, pool order) server among those at the minimum load."""
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
        tree = self.tree
        if tree is None:
            return ()
        # One pass over the loads: asking least_loaded for each of k ties costs O(k * n).
        low: int = tree[0]
        loads: list[int] = []
        _collect(tree, self.depth, loads)
        return tuple([s for s, n in zip(self.servers, loads, strict=True) if n == low])

    # ---------------------------------------------------------------- updating
    def add_load(self, server_id: str, delta: int) -> LoadTable:
        """Add ``delta`` to an active server's load (the caller keeps it >= 0)."""
        p = self.position[server_id]
        node = self.tree
        assert node is not None
        if not self.depth:  # up to 32 servers: one leaf, no path to copy
            return LoadTable(self.servers, self.position, _bumped(node, p, delta),
                             0, self.total + delta)
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

    def set_load(self, server_id: str, value: int) -> LoadTable:
        return self.add_load(server_id, value - self.load(server_id))


register(LoadTable)


def _collect(node: Node, depth: int, out: list[int]) -> None:
    if depth == 0:
        out.extend(node[3])
        return
    for child in node[3]:
        _collect(child, depth - 1, out)
