"""The sticky map: an LRU map from request id to server id (SPEC §6).

Theory of operation
-------------------
verl keeps ``request_id -> server_id`` in a ``cachetools.LRUCache``. Which entry is evicted
decides which conversation is re-placed, so the recency rules are routing semantics
(R-LRU-1..5). Here the map is a tuple of ``(request_id, server_id)`` pairs, least recent
first, with distinct request ids; its capacity is the configuration's ``max_cache_size``.

* a membership test (:func:`pinned_server`) does not change recency (R-LRU-1);
* a lookup (:func:`touch`) makes the key most recent (R-LRU-2);
* a write (:func:`put`) of a present key updates it and makes it most recent without
  eviction; a write of a new key into a full map first evicts the least recent entry
  (R-LRU-3);
* :func:`delete` removes one entry (R-LRU-4).

Every operation is O(size); the engine's sticky map does the same in O(1).
"""

from __future__ import annotations

__all__ = ["Sticky", "delete", "pinned_server", "put", "touch"]

Sticky = tuple[tuple[str, str], ...]


def pinned_server(sticky: Sticky, request_id: str) -> str | None:
    """The pinned server of ``request_id``, or None; recency is unchanged (R-LRU-1)."""
    for key, server in sticky:
        if key == request_id:
            return server
    return None


def delete(sticky: Sticky, request_id: str) -> Sticky:
    return tuple(pair for pair in sticky if pair[0] != request_id)


def touch(sticky: Sticky, request_id: str) -> Sticky:
    """Make a present ``request_id`` the most recent entry (R-LRU-2)."""
    server = pinned_server(sticky, request_id)
    assert server is not None, "touch is a lookup of a present key"
    return (*delete(sticky, request_id), (request_id, server))


def put(sticky: Sticky, request_id: str, server_id: str, capacity: int
        ) -> tuple[Sticky, str | None]:
    """Write ``request_id -> server_id`` as most recent; returns the map and the evicted key."""
    if pinned_server(sticky, request_id) is not None:
        return (*delete(sticky, request_id), (request_id, server_id)), None
    evicted = None
    if len(sticky) == capacity:
        evicted, sticky = sticky[0][0], sticky[1:]
    return (*sticky, (request_id, server_id)), evicted
