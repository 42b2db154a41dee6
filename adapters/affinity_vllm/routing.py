"""The router's routing state: :class:`RoutingTable`, a thin wrapper over the one driver.

Theory of operation
-------------------
Every routing decision and every change of the pool is one event stepped through the
pure core by :class:`affinity_runtime.RoutingDriver`, the driver verl's balancer and the
simulator use too; the table's driver is the only place that holds a
:class:`~affinity_engine.State`. Everything runs on the asyncio event loop thread and
``step`` never awaits, so each event is applied atomically without locks. The table adds
what only the router has: the configured backends (active or not), the per-outcome
counters behind /metrics, and the router's wording of a refusal.

* :meth:`RoutingTable.acquire` -- ``Acquire(request_id=session key or None,
  context_tokens=c, group_id=g)`` (``c`` only with the context band, see :mod:`.context`;
  ``g`` only with group stickiness, SPEC §7.6). The tie
  draw comes from the table's own seeded RNG, uniform in ``[0, DRAW_RANGE)`` (the adapter
  may use randomness, the core may not); the driver draws only where the core reads the
  draw (SPEC R-TIE-5). Under ``full_determinism`` with ``hash_mode = "caller"`` the
  request hash is the portable :func:`~affinity_engine.stable_hash` of the placement key
  (the group id of a grouped request, else the session key), never the salted builtin
  ``hash()``. The result is a :class:`Lease` (or the core's ``Rejected``).
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
outcome and state digest. A log that cannot be written is reported (:meth:`log_health`)
and routing goes on; with ``required`` an acquire is refused instead
(:class:`LogUnavailable`), and an acquire whose record failed is undone -- the state
goes back to before it -- so no routed request is missing from the log. Per-outcome
counters feed the /metrics page.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from affinity_engine import (
    Config,
    Event,
    LoadsObserved,
    Outcome,
    Rejected,
    Released,
    State,
)
from affinity_runtime.decision_log import DecisionLogWriter
from affinity_runtime.driver import DecisionLogUnavailable, Lease, RoutingDriver

__all__ = ["DRAW_RANGE", "Lease", "LogUnavailable", "RoutingTable"]

# Tie draws are uniform in [0, DRAW_RANGE); the core reduces them modulo the tie count.
DRAW_RANGE = 1 << 30


@attrs.frozen
class LogUnavailable:
    """An acquire refused because the required decision log cannot be written."""

    message: str


class RoutingTable:
    """The router's face of :class:`~affinity_runtime.RoutingDriver`: configured backends,
    counters and views; the driver is the single writer of routing state."""

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
        randrange = random.Random(seed).randrange
        self._driver = RoutingDriver(config, self.servers,
                                     draw=lambda _ties: randrange(DRAW_RANGE))
        if decision_log is not None:
            self.attach_log(decision_log)
        self.decisions: dict[str, int] = {}  # acquire path (or "rejected") -> count
        self.release_results: dict[str, int] = {}
        self.pool_changes: dict[str, int] = {"added": 0, "removed": 0}

    @property
    def state(self) -> State:
        return self._driver.state

    @property
    def open_requests(self) -> dict[str, int]:
        """Requests holding a lease per backend, counted by the router: unlike the core's
        in-flight count it includes backends that left the pool with requests running."""
        return self._driver.held

    def attach_log(self, decision_log: DecisionLogWriter, *, required: bool = False,
                   warm: bool = True) -> str:
        """Start writing the decision log (the router calls this only after its port is
        bound, so a failed start never touches a log). Raises ``DecisionLogLocked`` when
        another writer holds the path. ``required``: refuse acquires
        (:class:`LogUnavailable`) while the log cannot be written.

        ``warm``: a log already at the path is replayed and the table continues from its
        state (R-LOG-3, :mod:`affinity_runtime.warm_start`): the sticky map and counters
        come back, the dead run's requests in flight are released as abandoned, and the
        pool is brought to the configured backends -- each a logged event with its
        reason. Returns what the start did, for the router's log."""
        return self._driver.attach_log(decision_log, configured=self.servers,
                                       required=required, warm=warm)

    # ------------------------------------------------------------------ events
    def apply(self, event: Event, reason: str | None = None) -> Outcome:
        """Step the core; log the event (with ``reason``, for the adapter's own)."""
        return self._driver.apply(event, reason)

    def acquire(self, request_id: str | None, context_tokens: int | None = None,
                group_id: str | None = None,
                cached_prefix: tuple[tuple[str, int], ...] = ()
                ) -> Lease | Rejected | LogUnavailable:
        try:
            lease = self._driver.lease(request_id, context_tokens, group_id, cached_prefix)
        except DecisionLogUnavailable as exc:
            self._count(self.decisions, "no_log")
            return LogUnavailable(f"{exc}; --require-decision-log refuses to route "
                                  "without it")
        self._count(self.decisions, "rejected" if isinstance(lease, Rejected) else lease.path)
        return lease

    def release(self, lease: Lease) -> Released | None:
        """Release once; a second call returns None and changes nothing."""
        outcome = self._driver.end(lease)
        if outcome is not None:
            self._count(self.release_results, outcome.result.value)
        return outcome

    def remove(self, server_id: str, reason: str | None = None) -> bool:
        """Take an active server out of the pool; False if it was not active."""
        if server_id not in self.state.pool:
            return False
        self._driver.remove([server_id], reason)
        self.pool_changes["removed"] += 1
        return True

    def add(self, server_id: str, reason: str | None = None) -> bool:
        """Put an inactive configured server back; False if it was already active."""
        if server_id in self.state.pool:
            return False
        self._driver.add([server_id], reason)
        self.pool_changes["added"] += 1
        return True

    def register(self, server_id: str) -> None:
        """Know a new backend (the admin API's add); :meth:`add` puts it in the pool."""
        if server_id not in self.servers:
            self.servers = (*self.servers, server_id)
            self._driver.held.setdefault(server_id, 0)

    def observe(self, observed: Iterable[tuple[str, int]]) -> LoadsObserved:
        return self._driver.observe(observed)

    # ------------------------------------------------------------------- views
    def is_active(self, server_id: str) -> bool:
        return server_id in self.state.pool

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(self.state.pool.servers)

    def inflight(self, server_id: str) -> int:
        return self._driver.inflight(server_id)

    def external(self, server_id: str) -> int:
        return self.state.external.get(server_id, 0)

    def open_leases(self) -> int:
        """Leases held in the lease book across all epochs (0 without lease accounting)."""
        return sum(count for held in self.state.leases.held.values() for _, count in held)

    def status(self) -> dict[str, Any]:
        out = self._driver.status()
        out["configured_servers"] = list(self.servers)
        out["inactive_servers"] = [s for s in self.servers if s not in self.state.pool]
        out["decisions"] = dict(self.decisions)
        out["decision_log"] = self.log_health()
        return out

    @property
    def decision_log(self) -> DecisionLogWriter | None:
        return self._driver.decision_log

    def log_health(self) -> dict[str, Any] | None:
        """The decision log's health (None without a log); looks for the live file
        deleted or replaced first, so a scrape of /metrics notices it."""
        return self._driver.log_health()

    def close(self) -> None:
        self._driver.close()

    @staticmethod
    def _count(table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1
