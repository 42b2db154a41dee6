"""The router's routing state: one :class:`RoutingTable` applying ``affinity_core.step``.

Theory of operation
-------------------
Every routing decision and every change of the pool is one event stepped through the
pure core; the table is the only place that holds a :class:`~affinity_core.State`.
Everything runs on the asyncio event loop thread and ``step`` never awaits, so each
event is applied atomically without locks.

* :meth:`RoutingTable.acquire` -- ``Acquire(request_id=session key or None)``. The tie
  draw comes from the table's own seeded RNG (the adapter may use randomness, the core
  may not); the core uses it only when ``tie_break`` asks for a draw. The result is a
  :class:`Lease` (or the core's ``Rejected``).
* :meth:`RoutingTable.release` -- ``Release(server_id, request_id)`` for a lease, at most
  once: a lease remembers that it was released, so a double release is a no-op here
  rather than an undercount in the core. Callers release in a ``finally``.
* :meth:`remove` / :meth:`add` -- ``RemoveServers`` / ``AddServers`` for faults and
  health checks. With ``lease_accounting`` (the router's default) a request that was in
  flight on a server when it was removed releases a *stale* lease and cannot decrement
  the fresh count of the re-added server (R-LEASE-5).
* :meth:`observe` -- ``ObserveLoads`` from the scraped vLLM gauges (R-OBS-1).

Each applied event is written to the decision log (if one is configured) with the
pre- and post-state, so ``affinity replay`` can re-run the core and compare every
outcome and state digest. Per-outcome counters feed the /metrics page.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from affinity_conformance.decision_log import DecisionLogWriter
from affinity_core import (
    Acquire,
    Acquired,
    AddServers,
    Config,
    Event,
    LoadsObserved,
    ObserveLoads,
    Outcome,
    Rejected,
    Release,
    Released,
    RemoveServers,
    State,
    initial_state,
    stable_hash,
    status,
    step,
)

__all__ = ["DRAW_RANGE", "Lease", "RoutingTable"]

# Tie draws are uniform in [0, DRAW_RANGE); the core reduces them modulo the tie count.
DRAW_RANGE = 1 << 30


@attrs.define
class Lease:
    """One acquired slot on a backend, released exactly once."""

    server_id: str
    request_id: str | None
    path: str
    released: bool = False


class RoutingTable:
    """Config + State + decision log; the single writer of routing state."""

    def __init__(
        self,
        config: Config,
        servers: Sequence[str],
        *,
        seed: int = 0,
        decision_log: DecisionLogWriter | None = None,
    ) -> None:
        self.config = config
        self.servers = tuple(servers)  # every configured backend, active or not
        self.state: State = initial_state(config, self.servers)
        self._rng = random.Random(seed)
        self._log = decision_log
        if decision_log is not None:
            decision_log.start(config, self.state)
        self.decisions: dict[str, int] = {}  # acquire path (or "rejected") -> count
        self.release_results: dict[str, int] = {}
        self.pool_changes: dict[str, int] = {"added": 0, "removed": 0}

    # ------------------------------------------------------------------ events
    def apply(self, event: Event) -> Outcome:
        pre = self.state
        transition = step(self.config, pre, event)
        self.state = transition.state
        if self._log is not None:
            self._log.record(self.config, pre, event, transition.outcome, transition.state)
        return transition.outcome

    def acquire(self, request_id: str | None) -> Lease | Rejected:
        request_hash = None
        if self.config.full_determinism and request_id is not None:
            # hash_mode "caller": the core indexes the pool by the caller's hash; the
            # router's hash is the portable one, never the salted builtin hash().
            request_hash = stable_hash(request_id)
        event = Acquire(request_id=request_id, tie_draw=self._rng.randrange(DRAW_RANGE),
                        request_hash=request_hash)
        outcome = self.apply(event)
        if isinstance(outcome, Rejected):
            self._count(self.decisions, "rejected")
            return outcome
        assert isinstance(outcome, Acquired), outcome
        self._count(self.decisions, outcome.path.value)
        return Lease(outcome.server_id, request_id, outcome.path.value)

    def release(self, lease: Lease) -> Released | None:
        """Release once; a second call returns None and changes nothing."""
        if lease.released:
            return None
        lease.released = True
        outcome = self.apply(Release(server_id=lease.server_id, request_id=lease.request_id))
        assert isinstance(outcome, Released), outcome
        self._count(self.release_results, outcome.result.value)
        return outcome

    def remove(self, server_id: str) -> bool:
        """Take an active server out of the pool; False if it was not active."""
        if server_id not in self.state.pool:
            return False
        self.apply(RemoveServers(server_ids=[server_id]))
        self.pool_changes["removed"] += 1
        return True

    def add(self, server_id: str) -> bool:
        """Put an inactive configured server back; False if it was already active."""
        if server_id in self.state.pool:
            return False
        self.apply(AddServers(server_ids=[server_id]))
        self.pool_changes["added"] += 1
        return True

    def observe(self, observed: Iterable[tuple[str, int]]) -> LoadsObserved:
        outcome = self.apply(ObserveLoads(observed=tuple(observed)))
        assert isinstance(outcome, LoadsObserved), outcome
        return outcome

    # ------------------------------------------------------------------- views
    def is_active(self, server_id: str) -> bool:
        return server_id in self.state.pool

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(self.state.pool.servers)

    def inflight(self, server_id: str) -> int:
        return self.state.inflight(server_id) if server_id in self.state.pool else 0

    def external(self, server_id: str) -> int:
        return self.state.external.get(server_id, 0)

    def open_leases(self) -> int:
        """Leases held in the lease book across all epochs (0 without lease accounting)."""
        return sum(count for held in self.state.leases.held.values() for _, count in held)

    def status(self) -> dict[str, Any]:
        out = status(self.config, self.state)
        out["configured_servers"] = list(self.servers)
        out["inactive_servers"] = [s for s in self.servers if s not in self.state.pool]
        out["decisions"] = dict(self.decisions)
        return out

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    @staticmethod
    def _count(table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1
