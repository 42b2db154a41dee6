"""The balancer state and the configuration event that creates it.

Theory of operation
-------------------
The state is the legacy balancer's state made explicit (R-ST-1):

* ``pool``: the active servers in pool order with their in-flight counts
  (:class:`~affinity_engine.loads.LoadTable`). A server is active iff it is in the pool.
* ``lru``: the sticky map ``request_id -> server_id`` with its recency order
  (:class:`~affinity_engine.lru.StickyLru`). Entries may point at removed servers; they are
  invalidated lazily, on lookup (R-ACQ-3).
* ``affinity_kept`` / ``affinity_broken``: monotonic counters (R-CNT-1).
* ``sorted_servers``: the pool sorted by id, kept for the ``stable`` hash mode; it is a
  function of ``pool`` and changes only on add/remove.
* ``leases``: the lease book, used only with ``lease_accounting``.
* ``groups``: the group pins (R-GRP-1, R-GRP-5), a :class:`GroupPins` holding the group
  map ``group_id -> server_id`` (a :class:`~affinity_engine.lru.StickyLru` with the sticky
  map's recency rules) and its counters ``group_kept`` / ``group_broken``. One field, so
  the non-group hot path passes it along with one read; it stays empty unless group
  stickiness is on.
* ``external``: load the router did not send, from an :class:`ObserveLoads` event
  (R-OBS-1). Only non-zero entries are stored. ``pool`` holds *effective* loads,
  in-flight plus external, because that is what routing compares; the in-flight count
  of a server is its effective load minus its external load.

Server handles are not state: they are opaque to routing and live in the adapters.
States are values: hashable, comparable, and never mutated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, final

from immutables import Map

from affinity_core.config import Config, ConfigError
from affinity_core.events import is_valid_id

from .leases import LeaseBook
from .loads import LoadTable
from .lru import StickyLru
from .values import Value, register

__all__ = ["GroupPins", "State", "initial_state"]


@final
class GroupPins(Value):
    """The group map and its counters (R-GRP-1, R-GRP-5)."""

    __slots__ = ("broken", "kept", "lru")
    __match_args__ = ("lru", "kept", "broken")
    lru: StickyLru
    kept: int
    broken: int

    def __init__(self, lru: StickyLru, kept: int = 0, broken: int = 0) -> None:
        object.__setattr__(self, "lru", lru)
        object.__setattr__(self, "kept", kept)
        object.__setattr__(self, "broken", broken)


register(GroupPins)

_NO_LEASES = LeaseBook()
_NO_EXTERNAL: Map[str, int] = Map()
# The group pins of a state built without them: empty, so any capacity stands for them
# until group stickiness writes the first pin (the machine then uses the config's).
NO_GROUPS: Final = GroupPins(StickyLru(1))


@final
class State(Value):
    # A native value (values.py): the machine builds one per applied event.
    __slots__ = (
        "affinity_broken",
        "affinity_kept",
        "external",
        "groups",
        "leases",
        "lru",
        "pool",
        "sorted_servers",
    )
    __match_args__ = ("pool", "lru", "affinity_kept", "affinity_broken", "sorted_servers",
                      "leases", "external", "groups")
    pool: LoadTable
    lru: StickyLru
    affinity_kept: int
    affinity_broken: int
    sorted_servers: tuple[str, ...]
    leases: LeaseBook
    external: Map[str, int]
    groups: GroupPins

    def __init__(
        self,
        pool: LoadTable,
        lru: StickyLru,
        affinity_kept: int = 0,
        affinity_broken: int = 0,
        sorted_servers: tuple[str, ...] = (),
        leases: LeaseBook = _NO_LEASES,
        external: Map[str, int] = _NO_EXTERNAL,
        groups: GroupPins = NO_GROUPS,
    ) -> None:
        object.__setattr__(self, "pool", pool)
        object.__setattr__(self, "lru", lru)
        object.__setattr__(self, "affinity_kept", affinity_kept)
        object.__setattr__(self, "affinity_broken", affinity_broken)
        object.__setattr__(self, "sorted_servers", sorted_servers)
        object.__setattr__(self, "leases", leases)
        object.__setattr__(self, "external", external)
        object.__setattr__(self, "groups", groups)

    def inflight(self, server_id: str) -> int:
        """The router's own in-flight count (0 for an inactive server)."""
        external = self.external
        if not len(external):  # the usual case: nothing observed, no Map.get call
            return self.pool.load(server_id)
        return self.pool.load(server_id) - external.get(server_id, 0)

    def inflight_items(self) -> tuple[tuple[str, int], ...]:
        """``(server_id, in-flight count)`` in pool order."""
        items = self.pool.items()
        if not self.external:
            return items
        ext = self.external
        return tuple((s, n - ext.get(s, 0)) for s, n in items)

    @property
    def inflight_total(self) -> int:
        return self.pool.total - sum(self.external.values())

    @property
    def loads(self) -> dict[str, int]:
        """In-flight counts in pool order (a fresh dict)."""
        return dict(self.inflight_items())


register(State)


def initial_state(config: Config, servers: Iterable[str] = ()) -> State:
    """The configuration event (R-CFG-2): a fresh balancer over ``servers``, all idle."""
    # Checked as plain objects: a compiled build type-checks ``str`` variables itself (and
    # the narrowed ``servers`` below) and would raise TypeError before this clear error.
    supplied: object = servers
    if isinstance(supplied, str) or not isinstance(supplied, Iterable):
        raise ConfigError(f"servers must be a list of server ids, got {supplied!r}")
    given: list[object] = list(supplied)
    for value in given:
        if not is_valid_id(value):
            raise ConfigError(
                f"servers must be non-empty strings of Unicode scalar values, got {value!r}"
            )
    ids = [str(sid) for sid in given]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"servers must be unique, got {ids!r}")
    leases = LeaseBook().opened(tuple(ids)) if config.lease_accounting else LeaseBook()
    return State(
        pool=LoadTable.build((sid, 0) for sid in ids),
        lru=StickyLru(config.max_cache_size),
        sorted_servers=tuple(sorted(ids)),
        leases=leases,
        groups=GroupPins(StickyLru(config.max_group_cache_size)) if config.groups else NO_GROUPS,
    )
