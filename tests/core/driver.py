"""A tiny fluent driver for literal scenario tests of :func:`affinity_engine.step`.

Theory of operation
-------------------
A :class:`Run` holds a configuration and the current state. Each fluent method builds one
event, feeds it to ``step`` and asserts what the scenario says about the outcome, so a
scenario reads as the event sequence it is::

    Run.of(affinity_break_margin=2).acquire("a", expect="s0", path="new").release("s0")

Every step also checks, silently, everything the core promises about *any* step:

* all of :func:`affinity_conformance.invariants.step_invariants` hold;
* the history-level predicates hold: ``kept + broken`` equals the sticky hits on active
  servers (R-CNT-1) and the total load is conserved (R-CONS-2);
* the outcome has the type that belongs to the event (R-OUT-1).

So a scenario that only checks a routing decision still fails if the step that made it
broke an invariant on the way.

Loads are reached through events only (:meth:`Run.set_loads`): the core has no way to
set a count directly, and the tests should not invent one. Unkeyed acquires fill every
server up to a common level (each goes to a least-loaded server, so the pool fills
evenly), then releases bring each server down to its target. Under ``full_determinism``
unkeyed requests are rejected, so the fill uses fresh keyed ids whose caller hash points
at the server to fill; those ids stay in the sticky map.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from affinity_conformance.invariants import Ledger, conserved, counters_consistent, step_invariants
from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    Config,
    Event,
    HashMode,
    LoadsObserved,
    ObserveLoads,
    Outcome,
    Path,
    PoolChanged,
    Rejected,
    RejectReason,
    Release,
    Released,
    ReleaseResult,
    RemoveServers,
    State,
    StickyCacheCleared,
    Transition,
    allowed,
    initial_state,
    status,
    step,
)

__all__ = ["SERVERS", "Run", "outcome_fits_event"]

SERVERS: tuple[str, ...] = ("s0", "s1", "s2")

_ANY: Any = object()  # "do not check this field"


def outcome_fits_event(event: Event, outcome: Outcome) -> bool:
    """R-OUT-1: the outcome type that belongs to the event type."""
    if isinstance(event, Acquire):
        return isinstance(outcome, (Acquired, Rejected))
    if isinstance(event, Release):
        return isinstance(outcome, Released)
    if isinstance(event, (AddServers, RemoveServers)):
        return isinstance(outcome, PoolChanged)
    if isinstance(event, ObserveLoads):
        return isinstance(outcome, LoadsObserved)
    return isinstance(event, ClearStickyCache) and isinstance(outcome, StickyCacheCleared)


class Run:
    """A scenario in progress: a configuration, the current state and a history ledger."""

    def __init__(self, config: Config | None = None, servers: Sequence[str] = SERVERS) -> None:
        self.config = config if config is not None else Config()
        self.state: State = initial_state(self.config, servers)
        self.ledger = Ledger()
        self.outcomes: list[Outcome] = []
        self._fill_ids = 0

    @classmethod
    def of(cls, servers: Sequence[str] = SERVERS, /, **options: Any) -> Run:
        """A run over ``servers`` with ``Config(**options)``."""
        return cls(Config(**options), servers)

    # ------------------------------------------------------------------ stepping
    def step(self, event: Event) -> Outcome:
        """Apply one event, check the step invariants, and return the outcome."""
        pre = self.state
        t: Transition = step(self.config, pre, event)
        broken = [name for name, ok in step_invariants(self.config, pre, event, t).items()
                  if not ok]
        assert not broken, f"{event!r} -> {t.outcome!r} broke invariants {broken}"
        assert outcome_fits_event(event, t.outcome), f"{event!r} -> {t.outcome!r}"
        self.ledger = self.ledger.record(pre, event, t)
        self.state = t.state
        assert counters_consistent(self.state, self.ledger), "R-CNT-1 broken"
        assert conserved(self.state, self.ledger), "R-CONS-2 broken"
        self.outcomes.append(t.outcome)
        return t.outcome

    @property
    def last(self) -> Outcome:
        return self.outcomes[-1]

    def acquire(
        self,
        request_id: str | None,
        *,
        expect: str | None = None,
        expect_in: Collection[str] | None = None,
        path: Path | str | None = None,
        previous: str | None = _ANY,
        evicted: str | None = _ANY,
        tie_draw: int = 0,
        request_hash: int | None = None,
        context_tokens: int | None = None,
    ) -> Run:
        """An acquire that must succeed, with the given expectations."""
        event = Acquire(request_id=request_id, tie_draw=tie_draw, request_hash=request_hash,
                        context_tokens=context_tokens)
        outcome = self.step(event)
        assert isinstance(outcome, Acquired), f"{event!r} was not acquired: {outcome!r}"
        if expect is not None:
            assert outcome.server_id == expect, f"{event!r} -> {outcome!r}, wanted {expect}"
        if expect_in is not None:
            assert outcome.server_id in expect_in, f"{event!r} -> {outcome!r}"
        if path is not None:
            assert outcome.path is Path(path), f"{event!r} -> {outcome!r}, wanted {path}"
        if previous is not _ANY:
            assert outcome.previous == previous, f"{outcome!r}: previous != {previous}"
        if evicted is not _ANY:
            assert outcome.evicted == evicted, f"{outcome!r}: evicted != {evicted}"
        return self

    def reject(
        self,
        request_id: str | None,
        *,
        reason: RejectReason | str,
        tie_draw: int = 0,
        request_hash: int | None = None,
    ) -> Run:
        """An acquire that must be rejected for ``reason``."""
        event = Acquire(request_id=request_id, tie_draw=tie_draw, request_hash=request_hash)
        outcome = self.step(event)
        assert isinstance(outcome, Rejected), f"{event!r} was not rejected: {outcome!r}"
        assert outcome.reason is RejectReason(reason), f"{outcome!r}"
        return self

    def release(
        self,
        server_id: str,
        *,
        request_id: str | None = None,
        result: ReleaseResult | str | None = None,
    ) -> Run:
        outcome = self.step(Release(server_id=server_id, request_id=request_id))
        assert isinstance(outcome, Released) and outcome.server_id == server_id
        if result is not None:
            assert outcome.result is ReleaseResult(result), f"{outcome!r}, wanted {result}"
        return self

    def add(self, *server_ids: str) -> Run:
        outcome = self.step(AddServers(server_ids=list(server_ids)))
        assert isinstance(outcome, PoolChanged) and outcome.servers == self.servers
        return self

    def remove(self, *server_ids: str) -> Run:
        outcome = self.step(RemoveServers(server_ids=list(server_ids)))
        assert isinstance(outcome, PoolChanged) and outcome.servers == self.servers
        return self

    def clear(self, *, cleared: int | None = None) -> Run:
        outcome = self.step(ClearStickyCache())
        assert isinstance(outcome, StickyCacheCleared)
        if cleared is not None:
            assert outcome.cleared_entries == cleared, f"{outcome!r}, wanted {cleared}"
        return self

    # ------------------------------------------------------------ reaching loads
    def set_loads(self, **targets: int) -> Run:
        """Bring the named servers to the given loads through events only.

        Servers not named keep their load. Without ``full_determinism`` unkeyed
        acquires fill the pool evenly to a common level, then releases lower each server
        to its target. Lease mode needs every target at or above the current load (the
        releases must settle fill leases, not the scenario's own).
        """
        current = self.loads
        wanted = {**current, **targets}
        assert set(wanted) == set(current), f"unknown servers in {targets}"
        if self.config.lease_accounting:
            assert all(wanted[s] >= current[s] for s in current), "lease mode only fills"
        if self.config.full_determinism:
            for sid, load in wanted.items():
                for _ in range(load - current[sid]):
                    self._fill_one(sid)
            lower = {s: current[s] - n for s, n in wanted.items() if n < current[s]}
        else:
            level = max([*current.values(), *wanted.values()])
            for _ in range(sum(level - n for n in current.values())):
                self.acquire(None, path="unkeyed")
            lower = {s: level - n for s, n in wanted.items()}
        for sid, count in lower.items():
            for _ in range(count):
                self.release(sid, result="applied")
        assert self.loads == wanted, f"{self.loads} != {wanted}"
        return self

    def _fill_one(self, server_id: str) -> None:
        assert self.config.hash_mode is HashMode.CALLER, "stable-mode fill is not supported"
        self._fill_ids += 1
        index = self.servers.index(server_id)
        self.acquire(f"fill-{self._fill_ids}", expect=server_id, request_hash=index)

    # -------------------------------------------------------------- observations
    @property
    def loads(self) -> dict[str, int]:
        """Routing loads in pool order (equal to in-flight counts: no scenario here
        observes external load)."""
        return dict(self.state.pool.items())

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(s for s, _ in self.state.pool.items())

    @property
    def lru(self) -> tuple[tuple[str, str], ...]:
        return self.state.lru.items()

    @property
    def counters(self) -> tuple[int, int]:
        """``(affinity_kept, affinity_broken)``."""
        return self.state.affinity_kept, self.state.affinity_broken

    def status(self) -> dict[str, Any]:
        return status(self.config, self.state)

    def allowed(self, request_id: str | None, **fields: Any) -> frozenset[str]:
        return allowed(self.config, self.state, Acquire(request_id=request_id, **fields))
