"""The router's routing state: one :class:`RoutingTable` applying ``affinity_engine.step``.

Theory of operation
-------------------
Every routing decision and every change of the pool is one event stepped through the
pure core; the table is the only place that holds a :class:`~affinity_engine.State`.
Everything runs on the asyncio event loop thread and ``step`` never awaits, so each
event is applied atomically without locks.

* :meth:`RoutingTable.acquire` -- ``Acquire(request_id=session key or None,
  context_tokens=c)`` (``c`` only with the context band, see :mod:`.context`). The tie
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
from affinity_runtime.decision_log import DecisionLogWriter
from affinity_runtime.warm_start import ABANDONED, start_log

__all__ = ["DRAW_RANGE", "Lease", "LogUnavailable", "RoutingTable"]

# Tie draws are uniform in [0, DRAW_RANGE); the core reduces them modulo the tie count.
DRAW_RANGE = 1 << 30


class _Unlogged(Exception):
    """apply() undid an acquire the required decision log did not take."""


@attrs.frozen
class LogUnavailable:
    """An acquire refused because the required decision log cannot be written."""

    message: str


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
        self._log: DecisionLogWriter | None = None
        self.require_log = False
        if decision_log is not None:
            self.attach_log(decision_log)
        # Requests holding a lease per backend, counted by the router: unlike the core's
        # in-flight count it includes backends that left the pool with requests running.
        self.open_requests: dict[str, int] = dict.fromkeys(self.servers, 0)
        self.decisions: dict[str, int] = {}  # acquire path (or "rejected") -> count
        self.release_results: dict[str, int] = {}
        self.pool_changes: dict[str, int] = {"added": 0, "removed": 0}

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
        resumed = start_log(decision_log, self.config, self.state, warm=warm)
        self.state = resumed.state
        self._log = decision_log
        self.require_log = required
        for release in resumed.abandoned:
            self.apply(release, reason=ABANDONED)
        if resumed.warm:
            gone = [s for s in self.state.pool.servers if s not in self.servers]
            if gone:
                self.apply(RemoveServers(server_ids=gone),
                           reason="restart: no longer configured")
            back = [s for s in self.servers if s not in self.state.pool]
            if back:
                self.apply(AddServers(server_ids=back), reason="restart: configured")
        return resumed.message

    # ------------------------------------------------------------------ events
    def apply(self, event: Event, reason: str | None = None) -> Outcome:
        """Step the core; log the event (with ``reason``, for the adapter's own)."""
        pre = self.state
        transition = step(self.config, pre, event)
        self.state = transition.state
        if self._log is not None and not self._log.record(
                self.config, pre, event, transition.outcome, transition.state,
                reason=reason) and (
                self.require_log and isinstance(event, Acquire)):
            # --require-decision-log: an acquire the log did not take never happened.
            self.state = pre
            raise _Unlogged
        return transition.outcome

    def acquire(self, request_id: str | None, context_tokens: int | None = None
                ) -> Lease | Rejected | LogUnavailable:
        request_hash = None
        if self.config.full_determinism and request_id is not None:
            # hash_mode "caller": the core indexes the pool by the caller's hash; the
            # router's hash is the portable one, never the salted builtin hash().
            request_hash = stable_hash(request_id)
        event = Acquire(request_id=request_id, tie_draw=self._rng.randrange(DRAW_RANGE),
                        request_hash=request_hash, context_tokens=context_tokens)
        log = self._log
        if self.require_log and log is not None and not log.ready(self.config, self.state):
            return self._log_unavailable(log)
        try:
            outcome = self.apply(event)
        except _Unlogged:
            assert log is not None
            return self._log_unavailable(log)
        if isinstance(outcome, Rejected):
            self._count(self.decisions, "rejected")
            return outcome
        assert isinstance(outcome, Acquired), outcome
        self._count(self.decisions, outcome.path.value)
        self.open_requests[outcome.server_id] += 1
        return Lease(outcome.server_id, request_id, outcome.path.value)

    def release(self, lease: Lease) -> Released | None:
        """Release once; a second call returns None and changes nothing."""
        if lease.released:
            return None
        lease.released = True
        self.open_requests[lease.server_id] -= 1
        outcome = self.apply(Release(server_id=lease.server_id, request_id=lease.request_id))
        assert isinstance(outcome, Released), outcome
        self._count(self.release_results, outcome.result.value)
        return outcome

    def remove(self, server_id: str, reason: str | None = None) -> bool:
        """Take an active server out of the pool; False if it was not active."""
        if server_id not in self.state.pool:
            return False
        self.apply(RemoveServers(server_ids=[server_id]), reason)
        self.pool_changes["removed"] += 1
        return True

    def add(self, server_id: str, reason: str | None = None) -> bool:
        """Put an inactive configured server back; False if it was already active."""
        if server_id in self.state.pool:
            return False
        self.apply(AddServers(server_ids=[server_id]), reason)
        self.pool_changes["added"] += 1
        return True

    def register(self, server_id: str) -> None:
        """Know a new backend (the admin API's add); :meth:`add` puts it in the pool."""
        if server_id not in self.servers:
            self.servers = (*self.servers, server_id)
            self.open_requests[server_id] = 0

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
        out["decision_log"] = self.log_health()
        return out

    @property
    def decision_log(self) -> DecisionLogWriter | None:
        return self._log

    def log_health(self) -> dict[str, Any] | None:
        """The decision log's health (None without a log); looks for the live file
        deleted or replaced first, so a scrape of /metrics notices it."""
        if self._log is None:
            return None
        self._log.check()
        return self._log.health()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    def _log_unavailable(self, log: DecisionLogWriter) -> LogUnavailable:
        self._count(self.decisions, "no_log")
        return LogUnavailable(f"decision log unavailable ({log.problem}); "
                              "--require-decision-log refuses to route without it")

    @staticmethod
    def _count(table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1
