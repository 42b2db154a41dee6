"""A compact DSL for writing conformance cases; the core computes every expectation.

Theory of operation
-------------------
A :class:`Scenario` is a case under construction: a configuration, the current core
state and the steps so far. Each fluent call builds one event, runs it through
:func:`affinity_engine.step`, and records ``{"event", "expect", "allowed"}`` with the
outcome *the core produced*. So no generated expectation is ever typed by hand.

Hand-checked facts are still stated where a scenario is written: ``expect=``, ``path=``,
``result=``, ``cleared=`` and :meth:`Scenario.assert_loads` assert what the author
worked out on paper, and building fails (:class:`ScenarioError`) when the core
disagrees. That keeps the generator from being circular: a core bug shows up as a
scenario that no longer builds, not as a silently regenerated vector.

Every step also asserts all of :func:`affinity_conformance.invariants.step_invariants`.

Loads are reached through events only (:meth:`Scenario.fill`): fresh keyed "filler"
requests (``f1``, ``f2``, ...) fill the pool evenly, then releases lower each server to
its target. Fillers are keyed (not unkeyed) so that legacy cases stay within verl
0.9.1's API; they occupy sticky entries, which eviction scenarios take into account.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    Config,
    Event,
    HashMode,
    ObserveLoads,
    Outcome,
    Rejected,
    Release,
    Released,
    RemoveServers,
    State,
    StickyCacheCleared,
    allowed,
    config_to_json,
    event_to_json,
    initial_state,
    outcome_to_json,
    state_to_json,
    step,
)

from .invariants import step_invariants
from .vector_format import VECTOR_FORMAT
from .vector_runner import observed_fields

__all__ = ["DEFAULT_SERVERS", "Scenario", "ScenarioError", "features_of"]

DEFAULT_SERVERS: tuple[str, ...] = ("s0", "s1", "s2")
_DEFAULT_CHECKS = ("servers", "lru", "affinity_kept", "affinity_broken")


class ScenarioError(AssertionError):
    """A hand-checked expectation in a scenario disagrees with the core."""


class Scenario:
    """One case under construction (see the module docstring)."""

    def __init__(self, suite: str, case: str, description: str, *,
                 requirements: Iterable[str], servers: Sequence[str] = DEFAULT_SERVERS,
                 source: str = "scenario", config: Config | None = None,
                 **options: Any) -> None:
        self.suite, self.case, self.description, self.source = suite, case, description, source
        self.requirements = set(requirements)
        self.config = config if config is not None else Config(**options)
        self.state: State = initial_state(self.config, servers)
        self.initial = self.state
        self.steps: list[dict[str, Any]] = []
        self.events: list[Event] = []
        self.outcomes: list[Outcome] = []
        self._fillers = 0
        self._filler_servers: dict[str, list[str]] = {}
        self._extra_features: set[str] = set()
        self._raw_config: dict[str, Any] | None = None
        self.hand_checks = 0  # expectations the author stated (not merely recorded)

    # ----------------------------------------------------------------- stepping
    def apply(self, event: Event) -> Outcome:
        """Run one event through the core and record it as a step."""
        pre = self.state
        t = step(self.config, pre, event)
        broken = [n for n, ok in step_invariants(self.config, pre, event, t).items() if not ok]
        if broken:
            raise ScenarioError(f"{self.case}: {event!r} broke invariants {broken}")
        record: dict[str, Any] = {"event": event_to_json(event),
                                  "expect": outcome_to_json(t.outcome)}
        if isinstance(event, Acquire):
            permitted = allowed(self.config, pre, event)
            record["allowed"] = [s for s, _ in pre.pool.items() if s in permitted]
        if isinstance(t.outcome, Rejected):
            record["valid"] = False
        self.steps.append(record)
        self.events.append(event)
        self.outcomes.append(t.outcome)
        self.state = t.state
        return t.outcome

    def _fail(self, message: str) -> ScenarioError:
        return ScenarioError(f"{self.suite}/{self.case} step {len(self.events)}: {message}")

    def acquire(self, request_id: str | None, *, draw: int = 0, request_hash: int | None = None,
                expect: str | None = None, path: str | None = None,
                evicted: str | None = None, context: int | None = None,
                group: str | None = None, previous: str | None = None,
                evicted_group: str | None = None,
                cached: Mapping[str, int] | None = None) -> Scenario:
        """One acquire; ``context`` is its ``context_tokens`` (the band's c, R-BAND-1),
        ``group`` its ``group_id`` (R-GRP-2), ``cached`` its ``cached_prefix`` estimate
        (R-PFX-3), in keyword order."""
        outcome = self.apply(Acquire(request_id=request_id, tie_draw=draw,
                                     request_hash=request_hash, context_tokens=context,
                                     group_id=group,
                                     cached_prefix=tuple((cached or {}).items())))
        self.hand_checks += sum(x is not None for x in (expect, path, evicted, previous,
                                                        evicted_group))
        if not isinstance(outcome, Acquired):
            if expect is not None or path is not None:
                raise self._fail(f"acquire({request_id!r}) was rejected: {outcome!r}")
            return self
        if expect is not None and outcome.server_id != expect:
            raise self._fail(f"acquire({request_id!r}) chose {outcome.server_id}, "
                             f"the author expected {expect}")
        if path is not None and outcome.path.value != path:
            raise self._fail(f"acquire({request_id!r}) took path {outcome.path.value}, "
                             f"the author expected {path}")
        if evicted is not None and outcome.evicted != evicted:
            raise self._fail(f"acquire({request_id!r}) evicted {outcome.evicted!r}, "
                             f"the author expected {evicted!r}")
        if previous is not None and outcome.previous != previous:
            raise self._fail(f"acquire({request_id!r}) reported previous "
                             f"{outcome.previous!r}, the author expected {previous!r}")
        if evicted_group is not None and outcome.evicted_group != evicted_group:
            raise self._fail(f"acquire({request_id!r}) evicted group "
                             f"{outcome.evicted_group!r}, the author expected {evicted_group!r}")
        return self

    def acquires(self, *request_ids: str) -> Scenario:
        for rid in request_ids:
            self.acquire(rid)
        return self

    def reject(self, request_id: str | None, *, reason: str,
               request_hash: int | None = None, context: int | None = None) -> Scenario:
        outcome = self.apply(Acquire(request_id=request_id, request_hash=request_hash,
                                     context_tokens=context))
        self.hand_checks += 1
        if not isinstance(outcome, Rejected) or outcome.reason.value != reason:
            raise self._fail(f"acquire({request_id!r}) gave {outcome!r}, "
                             f"the author expected a {reason} rejection")
        return self

    def release(self, server_id: str, request_id: str | None = None, *,
                result: str | None = None) -> Scenario:
        outcome = self.apply(Release(server_id=server_id, request_id=request_id))
        assert isinstance(outcome, Released)
        self.hand_checks += result is not None
        if result is not None and outcome.result.value != result:
            raise self._fail(f"release({server_id!r}) gave {outcome.result.value}, "
                             f"the author expected {result}")
        return self

    def add(self, *server_ids: str) -> Scenario:
        self.apply(AddServers(server_ids=list(server_ids)))
        return self

    def remove(self, *server_ids: str) -> Scenario:
        self.apply(RemoveServers(server_ids=list(server_ids)))
        return self

    def clear(self, *, cleared: int | None = None,
              cleared_groups: int | None = None) -> Scenario:
        outcome = self.apply(ClearStickyCache())
        assert isinstance(outcome, StickyCacheCleared)
        self.hand_checks += (cleared is not None) + (cleared_groups is not None)
        if cleared is not None and outcome.cleared_entries != cleared:
            raise self._fail(f"clear cleared {outcome.cleared_entries}, "
                             f"the author expected {cleared}")
        if cleared_groups is not None and outcome.cleared_groups != cleared_groups:
            raise self._fail(f"clear cleared {outcome.cleared_groups} groups, "
                             f"the author expected {cleared_groups}")
        return self

    def observe(self, **observed: int) -> Scenario:
        """observe_loads with the given (server, load) pairs, in keyword order."""
        self.apply(ObserveLoads(observed=list(observed.items())))
        return self

    def needs(self, *features: str) -> Scenario:
        """Declare features the automatic detection cannot see (e.g. ``core_events``)."""
        self._extra_features.update(features)
        return self

    def bad_event(self, raw: Mapping[str, Any], key: str) -> Scenario:
        """An event JSON a decoder must reject (``key`` names the offending field)."""
        self.steps.append({"event": dict(raw), "valid": False,
                           "error": {"stage": "event", "key": key}})
        self._extra_features.add("core_events")
        return self

    # ------------------------------------------------------------- observations
    def check(self, *fields: str, status_keys: Sequence[str] = ()) -> Scenario:
        """Record a check step comparing ``fields`` (default: pool, LRU, counters)."""
        observed = observed_fields(self.config, self.state)
        checks = {f: observed[f] for f in (fields or _DEFAULT_CHECKS)}
        if status_keys:
            checks["status"] = {k: observed["status"][k] for k in status_keys}
        self.steps.append({"checks": checks})
        return self

    def assert_loads(self, **loads: int) -> Scenario:
        """Hand-checked loads; fails the build if the core disagrees."""
        self.hand_checks += 1
        actual = {s: n for s, n in self.state.inflight_items() if s in loads}
        if actual != loads:
            raise self._fail(f"loads are {dict(self.state.inflight_items())}, "
                             f"the author expected {loads}")
        return self

    def assert_spread(self, at_most: int) -> Scenario:
        """Hand-checked bound on ``max(L) - min(L)`` (effective loads) right now."""
        self.hand_checks += 1
        spread = self.state.pool.max_load - self.state.pool.min_load
        if spread > at_most:
            raise self._fail(f"spread max-min = {spread} > {at_most}: "
                             f"{dict(self.state.pool.items())}")
        return self

    def assert_pool(self, *servers: str) -> Scenario:
        """Hand-checked pool order."""
        self.hand_checks += 1
        if self.state.pool.servers != servers:
            raise self._fail(f"pool is {list(self.state.pool.servers)}, "
                             f"the author expected {list(servers)}")
        return self

    def assert_external(self, **external: int) -> Scenario:
        """Hand-checked non-zero external loads (R-OBS-1)."""
        self.hand_checks += 1
        if dict(self.state.external) != external:
            raise self._fail(f"external loads are {dict(self.state.external)}, "
                             f"the author expected {external}")
        return self

    def assert_pinned(self, request_id: str, server_id: str | None) -> Scenario:
        self.hand_checks += 1
        pinned = self.state.lru.peek(request_id)
        if pinned != server_id:
            raise self._fail(f"{request_id!r} is pinned to {pinned!r}, "
                             f"the author expected {server_id!r}")
        return self

    def assert_group(self, group_id: str, server_id: str | None) -> Scenario:
        """Hand-checked group pin (R-GRP-4): ``group_id``'s server, or None when absent."""
        self.hand_checks += 1
        pinned = dict(state_to_json(self.state).get("groups", [])).get(group_id)
        if pinned != server_id:
            raise self._fail(f"group {group_id!r} is pinned to {pinned!r}, "
                             f"the author expected {server_id!r}")
        return self

    def assert_counters(self, kept: int, broken: int) -> Scenario:
        self.hand_checks += 1
        got = (self.state.affinity_kept, self.state.affinity_broken)
        if got != (kept, broken):
            raise self._fail(f"(kept, broken) = {got}, the author expected {(kept, broken)}")
        return self

    # ------------------------------------------------------------ reaching loads
    def fill(self, **targets: int) -> Scenario:
        """Reach the given loads with filler requests and releases (see module docs)."""
        if self.config.full_determinism:
            return self._fill_deterministic(targets)
        current = dict(self.state.inflight_items())
        wanted = {**current, **targets}
        level = max(wanted.values())
        while self.state.pool.min_load < level:
            self._fillers += 1
            rid = f"f{self._fillers}"
            outcome = self.apply(Acquire(request_id=rid))
            assert isinstance(outcome, Acquired)
            self._filler_servers.setdefault(outcome.server_id, []).append(rid)
        for sid, load in wanted.items():
            for _ in range(self.state.inflight(sid) - load):
                self._release_filler(sid)
        return self.assert_loads(**wanted)

    def _release_filler(self, sid: str) -> None:
        rid = None
        if self.config.lease_accounting:
            rid = self._filler_servers[sid].pop()
        self.release(sid, rid, result="applied")

    def _fill_deterministic(self, targets: Mapping[str, int]) -> Scenario:
        if self.config.hash_mode is not HashMode.CALLER:
            raise self._fail("fill() under full_determinism needs hash_mode caller")
        servers = [s for s, _ in self.state.pool.items()]
        for sid, load in targets.items():
            for _ in range(load - self.state.pool.load(sid)):
                self._fillers += 1
                self.acquire(f"f{self._fillers}", request_hash=servers.index(sid), expect=sid)
        return self.assert_loads(**targets)

    # ------------------------------------------------------------------ output
    def with_raw_config(self, raw: dict[str, Any]) -> Scenario:
        """Write ``raw`` as the vector's config (a non-canonical but valid spelling)."""
        self._raw_config = dict(raw)
        return self

    def build(self) -> dict[str, Any]:
        """The vector JSON (without ``_info``), ending with a full check step."""
        steps = list(self.steps)
        if not steps or "checks" not in steps[-1]:
            observed = observed_fields(self.config, self.state)
            final = {f: observed[f] for f in _DEFAULT_CHECKS}
            steps.append({"checks": final})
        return {
            "format": VECTOR_FORMAT,
            "suite": self.suite,
            "case": self.case,
            "description": self.description,
            "source": self.source,
            "requirements": sorted(self.requirements),
            "features": features_of(self.config, self.events, steps, self._extra_features),
            "config": (config_to_json(self.config) if self._raw_config is None
                       else self._raw_config),
            "initial_state": state_to_json(self.initial),
            "steps": steps,
        }


def _group_optional(config: Config, events: Sequence[Event]) -> bool:
    """Whether a case needs group ids to be optional (R-GRP-1, R-GRP-7): a keyed acquire
    without one under group stickiness, or group ids where group stickiness is off."""
    acquires = [e for e in events if isinstance(e, Acquire)]
    if not config.groups:
        return any(e.group_id is not None for e in acquires)
    return any(e.request_id is not None and e.group_id is None for e in acquires)


def features_of(config: Config, events: Sequence[Event], steps: Sequence[dict[str, Any]],
                extra: Iterable[str] = ()) -> list[str]:
    """The implementation features a case needs (vocabulary: vector_format.FEATURES)."""
    needed = set(extra)
    if config.affinity_break_margin is not None:
        needed.add("margin")
    if config.dual_threshold is not None:
        needed.add("dual_threshold")
    # The band's options, or any acquire carrying context_tokens (even where R-BAND-3 says
    # it is ignored): a consumer that does not know the field must not be judged on it.
    if config.affinity_break_tokens is not None or any(
            isinstance(e, Acquire) and e.context_tokens is not None for e in events):
        needed.add("context_band")
    if config.full_determinism:
        needed.add("full_determinism")
        if config.hash_mode is HashMode.STABLE:
            needed.add("hash_stable")
    if config.tie_break.value == "hashed":
        needed.add("tie_hashed")
    if config.lease_accounting:
        needed.add("lease_accounting")
    if any(isinstance(e, Acquire) and e.request_id is None for e in events):
        needed.add("unkeyed")
    if any(isinstance(e, ObserveLoads) for e in events):
        needed.add("observe_loads")
    # Group stickiness, or any acquire carrying group_id (even where R-GRP-1 says it is
    # never read): a consumer that does not know the field must not be judged on it.
    if config.groups or any(isinstance(e, Acquire) and e.group_id is not None for e in events):
        needed.add("group_pins")
    # Prefix-aware placement, or any acquire carrying cached_prefix (even where R-PFX-1
    # says it is never read), as for the band and groups above.
    if config.placement_margin is not None or any(
            isinstance(e, Acquire) and e.cached_prefix for e in events):
        needed.add("prefix_placement")
    if _group_optional(config, events):
        needed.add("group_optional")
    if config.groups:
        if config.group_stickiness.value == "fallback":
            needed.add("group_fallback")
        if config.group_break_margin is not None:
            needed.add("group_margin")
        if config.max_group_cache_size != config.max_cache_size:
            needed.add("group_cache_size")
    for item in steps:
        checks = item.get("checks", {})
        status_keys = set(checks.get("status", {}))
        if status_keys & {"affinity_kept", "affinity_broken"}:
            needed.add("counters")
    return sorted(needed)
