"""A replica's KV pool: fixed block capacity, hashed prefix cache, LRU eviction.

Theory of operation
-------------------
vLLM stores KV in fixed-size blocks (16 tokens). A full block is identified by the hash
of its tokens chained with the hash of the block before it, so a block can be reused
only behind an identical prefix. Blocks held by running requests are pinned; when a
request ends its blocks stay cached but become *evictable*, queued least-recently-freed
first, tail block first (vLLM frees a request's blocks in reverse order, so a prefix
outlives its suffix). A lookup walks the chain from block 0 and stops at the first miss.

The simulator knows token identity without hashing. A conversation only ever appends,
so its block ``j`` is the same content every turn; and the full blocks of a prompt are
the same content for every sample of that prompt. The pool is therefore kept as
*segments*, each a run of blocks that is always cached as a prefix of itself:

* a group segment (key ``-1 - group``): the ``G = prompt // block`` full prompt blocks
  shared by the samples of one prompt;
* a trajectory segment (key ``trajectory index``): that conversation's blocks from ``G``
  on.

Because eviction takes tail blocks first, a segment's resident blocks are always a
prefix of it, and one integer per segment is its whole cache state. The evictable
segments sit in an ``OrderedDict`` in LRU order; evicting ``n`` blocks trims segments
from the front. A group segment is pinned while any running request of the group uses
it (``group_refs``); a trajectory segment is owned outright by its running request.

Accounting: ``pinned + evictable <= capacity``; ``free = capacity - pinned - evictable``.
Admission succeeds iff the blocks it pins fit in ``capacity - pinned`` (evictable
blocks can always be reclaimed). Hits are counted in tokens, as vLLM's
``prefix_cache_hits / prefix_cache_queries``; a lookup never covers the prompt's last
token (vLLM recomputes at least one token to produce logits).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["KvPool"]


class KvPool:
    """Segment-granular prefix cache of one replica (see the module docstring)."""

    __slots__ = ("block", "capacity", "evictable", "evicted_blocks", "group_refs", "lru",
                 "pinned", "pinned_groups")

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.capacity = capacity_blocks
        self.block = block_size
        self.pinned = 0
        self.evictable = 0
        self.evicted_blocks = 0
        self.lru: OrderedDict[int, int] = OrderedDict()  # segment -> resident blocks
        self.group_refs: dict[int, int] = {}  # pinned group segment -> running users
        self.pinned_groups: dict[int, int] = {}  # pinned group segment -> its blocks

    @property
    def available(self) -> int:
        """Blocks a new pin may take: free plus evictable."""
        return self.capacity - self.pinned

    def resident(self, segment: int) -> int:
        if segment in self.pinned_groups:
            return self.pinned_groups[segment]
        return self.lru.get(segment, 0)

    def lookup(self, group_key: int, shared: int, traj_key: int, tokens: int) -> int:
        """Cached blocks usable for a prompt of ``tokens`` tokens (a chained prefix)."""
        limit = (tokens - 1) // self.block
        if shared > 0:
            have = self.resident(group_key)
            if have < shared:
                return min(have, limit)
        hit = shared + self.lru.get(traj_key, 0)
        return min(hit, limit)

    def pin_cost(self, group_key: int, shared: int, traj_key: int, own_blocks: int) -> int:
        """How many more blocks become pinned if a request takes these segments."""
        extra = own_blocks
        if shared > 0 and group_key not in self.group_refs:
            extra += shared
        return extra

    def admit(self, group_key: int, shared: int, traj_key: int, own_blocks: int) -> None:
        """Pin the group and trajectory segments for a request; reclaim space if needed.

        The caller checked ``pin_cost(...) <= available``.
        """
        if shared > 0:
            refs = self.group_refs.get(group_key, 0)
            if refs == 0:
                self.evictable -= self.lru.pop(group_key, 0)
                self.pinned += shared
                self.pinned_groups[group_key] = shared
            self.group_refs[group_key] = refs + 1
        self.evictable -= self.lru.pop(traj_key, 0)
        self.pinned += own_blocks
        self._reclaim()

    def grow(self, blocks: int) -> None:
        """A running request pins ``blocks`` more (decode crossed block boundaries)."""
        self.pinned += blocks
        self._reclaim()

    def release(
        self, group_key: int, shared: int, traj_key: int, own_blocks: int, cached_own: int
    ) -> None:
        """A request stops: its own full blocks (``cached_own``) stay cached, evictable."""
        self.pinned -= own_blocks
        if cached_own > 0:
            self.lru[traj_key] = cached_own
            self.evictable += cached_own
        if shared > 0:
            refs = self.group_refs[group_key] - 1
            if refs == 0:
                del self.group_refs[group_key]
                del self.pinned_groups[group_key]
                self.pinned -= shared
                self.lru[group_key] = shared
                self.evictable += shared
            else:
                self.group_refs[group_key] = refs

    def truncate(self, traj_key: int, keep_blocks: int) -> None:
        """A conversation dropped its tail (a new branch): blocks past ``keep_blocks`` of
        its own segment can never hit again, so they stop counting as cached."""
        have = self.lru.get(traj_key, 0)
        if have > keep_blocks:
            self.evictable -= have - keep_blocks
            if keep_blocks > 0:
                self.lru[traj_key] = keep_blocks
            else:
                del self.lru[traj_key]

    def _reclaim(self) -> None:
        """Evict least recently freed blocks, tail first, until the pool fits."""
        excess = self.pinned + self.evictable - self.capacity
        if excess <= 0:
            return
        self.evicted_blocks += excess
        self.evictable -= excess
        lru = self.lru
        while excess > 0:
            segment, blocks = next(iter(lru.items()))
            if blocks <= excess:
                del lru[segment]
                excess -= blocks
            else:
                lru[segment] = blocks - excess
                excess = 0
        if self.evictable < 0:
            raise AssertionError("KV pool over-committed: pinned blocks exceed capacity")
