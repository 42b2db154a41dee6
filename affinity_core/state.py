"""The balancer state and the configuration event that creates it.

Theory of operation
-------------------
The state is the legacy balancer's state made explicit (R-ST-1):

* ``pool``: the active servers in pool order with their in-flight counts
  (:class:`~affinity_core.loads.LoadTable`). A server is active iff it is in the pool.
* ``lru``: the sticky map ``request_id -> server_id`` with its recency order
  (:class:`~affinity_core.lru.StickyLru`). Entries may point at removed servers; they are
  invalidated lazily, on lookup (R-ACQ-3).
* ``affinity_kept`` / ``affinity_broken``: monotonic counters (R-CNT-1).
* ``sorted_servers``: the pool sorted by id, kept for the ``stable`` hash mode; it is a
  function of ``pool`` and changes only on add/remove.
* ``leases``: the lease book, used only with ``lease_accounting``.

Server handles are not state: they are opaque to routing and live in the adapters.
States are values: hashable, comparable, and never mutated.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from .config import Config, ConfigError
from .leases import LeaseBook
from .loads import LoadTable
from .lru import StickyLru

__all__ = ["State", "initial_state"]


_NO_LEASES = LeaseBook()


@attrs.frozen
class State:
    pool: LoadTable
    lru: StickyLru
    affinity_kept: int = 0
    affinity_broken: int = 0
    sorted_servers: tuple[str, ...] = ()
    leases: LeaseBook = _NO_LEASES

    @property
    def loads(self) -> dict[str, int]:
        """In-flight counts in pool order (a fresh dict)."""
        return dict(self.pool.items())


def initial_state(config: Config, servers: Iterable[str] = ()) -> State:
    """The configuration event (R-CFG-2): a fresh balancer over ``servers``, all idle."""
    ids = list(servers)
    for sid in ids:
        if not isinstance(sid, str) or sid == "":
            raise ConfigError(f"servers must be non-empty strings, got {sid!r}")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"servers must be unique, got {ids!r}")
    leases = LeaseBook().opened(tuple(ids)) if config.lease_accounting else LeaseBook()
    return State(
        pool=LoadTable.build((sid, 0) for sid in ids),
        lru=StickyLru(config.max_cache_size),
        sorted_servers=tuple(sorted(ids)),
        leases=leases,
    )
