"""Stateful lockstep: the core, the naive legacy model and the verl adapter, step by step.

Theory of operation
-------------------
One :class:`RuleBasedStateMachine` drives three participants with the same events:

* the core (:func:`affinity_engine.step`), always; after every step all of
  :func:`affinity_conformance.invariants.step_invariants` must hold, the history predicates
  (R-CNT-1 counters, R-CONS-2 conservation) must hold, the choice must lie in
  :func:`affinity_engine.allowed` (empty iff rejected, R-REL-1), and re-running the step on
  the same pre-state must give the same transition (R-PURE-1);
* the independent legacy model (:mod:`affinity_conformance.legacy`), whenever the configuration
  is one verl has (margin and gate null, no lease accounting, ``first`` or ``draw`` ties,
  ``caller`` hashing, keyed requests, no observations): decisions and the projected state
  (pool with counts, sticky map in recency order) must equal the core's (R-LEG-1);
* Affinity's verl adapter (``affinity_verl.AffinityLoadBalancer``, in process), whenever
  it can express the configuration (not ``caller`` hashing, which needs the process's own
  ``hash()``, and no observations): its choice must be the core's (deterministic ties) or
  allowed and then fed back (``draw`` ties, R-REL-2), and its status must equal the core's.

Rules: acquire (keyed; unkeyed when the configuration is not legacy-comparable), release
with and without a request id, add servers, remove servers, clear the sticky cache,
observe loads (extension configurations), and a *fresh configuration* that re-initializes
every participant with a new random configuration and server list. Small universes (4
servers, 4 request ids, caches of 1-4 entries, margins 0-3) force ties, LRU evictions,
removed-server hits and re-adds.

Sizes per Hypothesis profile: tests/conformance/stateful_profiles.py.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from affinity_conformance.invariants import (
    Ledger,
    conserved,
    counters_consistent,
    legacy_projection,
    project,
    step_invariants,
    well_formed,
)
from affinity_conformance.legacy import (
    LegacyModel,
    legacy_acquire,
    legacy_add,
    legacy_clear,
    legacy_release,
    legacy_remove,
)
from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    Config,
    DualThreshold,
    Event,
    HashMode,
    ObserveLoads,
    Rejected,
    Release,
    RemoveServers,
    State,
    TieBreak,
    allowed,
    draw_for,
    initial_state,
    status,
    step,
)

from .stateful_profiles import stateful_settings

ADAPTER_CLASS: Any
try:
    from affinity_verl import AffinityLoadBalancer as ADAPTER_CLASS
except ImportError:  # the adapter is optional here; the machine then runs two participants
    ADAPTER_CLASS = None

UNIVERSE = ("s0", "s1", "s2", "s3")
RIDS = ("a", "b", "c", "d")
STATUS_KEYS = ("servers", "total_inflight", "active_servers", "registered_handles",
               "affinity_kept", "affinity_broken", "sticky_entries")


@st.composite
def configs(draw: st.DrawFn) -> Config:
    policy = draw(st.sampled_from(["legacy", "legacy", "legacy", "margin", "margin", "gate"]))
    margin = draw(st.integers(0, 3)) if policy == "margin" else None
    gate = None
    if policy == "gate":
        gate = DualThreshold(draw(st.integers(-1, 3)), draw(st.sampled_from(["1", "3/2", "2"])))
    return Config(
        affinity_break_margin=margin,
        dual_threshold=gate,
        max_cache_size=draw(st.integers(1, 4)),
        full_determinism=draw(st.integers(0, 4)) == 0,
        tie_break=draw(st.sampled_from(["first", "draw", "draw", "hashed"])),
        hash_mode=draw(st.sampled_from(["caller", "stable"])),
        lease_accounting=draw(st.integers(0, 4)) == 0,
    )


server_lists = st.permutations(UNIVERSE).flatmap(
    lambda order: st.integers(0, 3).map(lambda n: list(order[:n]) if n else list(order[:1])))


def legacy_comparable(config: Config) -> bool:
    return (config.policy == "legacy" and not config.lease_accounting
            and config.tie_break in (TieBreak.FIRST, TieBreak.DRAW)
            and (not config.full_determinism or config.hash_mode is HashMode.CALLER))


class Adapter:
    """The verl adapter as a participant (see the module docstring)."""

    def __init__(self, config: Config, servers: list[str], seed: int) -> None:
        options: dict[str, Any] = {"max_cache_size": config.max_cache_size,
                                   "tie_break": config.tie_break.value,
                                   "hash_mode": config.hash_mode.value,
                                   "full_determinism": config.full_determinism,
                                   "lease_accounting": config.lease_accounting, "seed": seed}
        if config.affinity_break_margin is not None:
            options["affinity_break_margin"] = config.affinity_break_margin
        if config.dual_threshold is not None:
            options["balance_abs_threshold"] = config.dual_threshold.balance_abs_threshold
            options["balance_rel_threshold"] = str(config.dual_threshold.balance_rel_threshold)
        assert ADAPTER_CLASS is not None
        self.balancer: Any = ADAPTER_CLASS(servers=dict.fromkeys(servers), **options)

    def acquire(self, request_id: str | None) -> str | None:
        try:
            return str(self.balancer.acquire_server(request_id=request_id)[0])
        except (RuntimeError, ValueError):
            return None


class LockstepMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.config = Config()
        self.state: State = initial_state(self.config, ["s0"])
        self.ledger = Ledger()
        self.legacy: LegacyModel | None = None
        self.adapter: Adapter | None = None
        self.extensions = False
        self.steps_in_config = 0

    # ----------------------------------------------------------- configuration
    def _configure(self, config: Config, servers: list[str], seed: int,
                   extensions: bool) -> None:
        self.config = config
        self.state = initial_state(config, servers)
        self.ledger = Ledger()
        self.steps_in_config = 0
        comparable = legacy_comparable(config)
        self.extensions = extensions and not comparable
        self.legacy = (LegacyModel.fresh(servers, config.max_cache_size,
                                         config.full_determinism) if comparable else None)
        caller_hash = config.full_determinism and config.hash_mode is HashMode.CALLER
        self.adapter = (Adapter(config, servers, seed)
                        if ADAPTER_CLASS is not None and not caller_hash
                        and not self.extensions else None)

    @initialize(config=configs(), servers=server_lists, seed=st.integers(0, 2**32),
                extensions=st.booleans())
    def configure(self, config: Config, servers: list[str], seed: int,
                  extensions: bool) -> None:
        self._configure(config, servers, seed, extensions)

    @precondition(lambda self: self.steps_in_config >= 20)
    @rule(config=configs(), servers=server_lists, seed=st.integers(0, 2**32),
          extensions=st.booleans())
    def fresh_configuration(self, config: Config, servers: list[str], seed: int,
                            extensions: bool) -> None:
        self._configure(config, servers, seed, extensions)

    # ------------------------------------------------------------------- core
    def _step(self, event: Event) -> Any:
        pre = self.state
        t = step(self.config, pre, event)
        broken = [n for n, ok in step_invariants(self.config, pre, event, t).items() if not ok]
        assert not broken, f"{event!r} -> {t.outcome!r} broke {broken}"
        assert step(self.config, pre, event).outcome == t.outcome, "step is not a function"
        if isinstance(event, Acquire):
            permitted = allowed(self.config, pre, event)
            if isinstance(t.outcome, Acquired):
                assert t.outcome.server_id in permitted, (t.outcome, permitted)
            else:
                assert isinstance(t.outcome, Rejected) and not permitted
        self.ledger = self.ledger.record(pre, event, t)
        self.state = t.state
        self.steps_in_config += 1
        assert counters_consistent(self.state, self.ledger), "R-CNT-1"
        assert conserved(self.state, self.ledger), "R-CONS-2"
        return t.outcome

    # ------------------------------------------------------------------ rules
    @rule(rid=st.sampled_from(RIDS), draw=st.integers(0, 5), request_hash=st.integers(-3, 10))
    def acquire(self, rid: str, draw: int, request_hash: int) -> None:
        self._acquire(rid, draw, request_hash)

    @rule(rids=st.lists(st.sampled_from(RIDS), min_size=2, max_size=4),
          draw=st.integers(0, 5), request_hash=st.integers(-3, 10))
    def acquire_burst(self, rids: list[str], draw: int, request_hash: int) -> None:
        """Several turns in a row without releases: loads climb, pins leave the band."""
        for offset, rid in enumerate(rids):
            self._acquire(rid, draw + offset, request_hash + offset)

    @precondition(lambda self: self.extensions)
    @rule(draw=st.integers(0, 5))
    def acquire_unkeyed(self, draw: int) -> None:
        self._acquire(None, draw, None)

    def _acquire(self, rid: str | None, draw: int, request_hash: int | None) -> None:
        config, pre = self.config, self.state
        hashed = config.full_determinism and config.hash_mode is HashMode.CALLER
        event = Acquire(request_id=rid, tie_draw=draw,
                        request_hash=request_hash if hashed else None)
        chosen = self.adapter.acquire(rid) if self.adapter is not None else None
        if self.adapter is not None and config.tie_break is TieBreak.DRAW and chosen:
            fed = draw_for(config, pre, event, chosen)  # refinement (R-REL-2)
            assert fed is not None, f"adapter chose {chosen}, not in {allowed(config, pre, event)}"
            event = fed
        outcome = self._step(event)
        core_choice = outcome.server_id if isinstance(outcome, Acquired) else None
        if self.adapter is not None:
            assert chosen == core_choice, f"adapter chose {chosen}, core {core_choice}"
        if self.legacy is not None:
            assert rid is not None
            ties: Literal["first", "draw"] = (
                "first" if config.tie_break is TieBreak.FIRST else "draw")
            result = legacy_acquire(self.legacy, rid, ties=ties,
                                    tie_draw=event.tie_draw, request_hash=request_hash or 0)
            self.legacy = result.model
            assert result.server_id == core_choice, (result, outcome)

    @rule(sid=st.sampled_from((*UNIVERSE, "s9")), rid=st.none() | st.sampled_from(RIDS))
    def release(self, sid: str, rid: str | None) -> None:
        self._release(sid, rid)

    @precondition(lambda self: self.state.inflight_total > 0)
    @rule(index=st.integers(0, 3), with_id=st.booleans())
    def release_loaded(self, index: int, with_id: bool) -> None:
        """A release that ends a request in flight (with the id pinned there, if any)."""
        loaded = [s for s, n in self.state.inflight_items() if n > 0]
        sid = loaded[index % len(loaded)]
        pinned = [r for r, s in self.state.lru.items() if s == sid]
        self._release(sid, pinned[0] if with_id and pinned else None)

    def _release(self, sid: str, rid: str | None) -> None:
        self._step(Release(server_id=sid, request_id=rid))
        if self.adapter is not None:
            self.adapter.balancer.release_server(sid, request_id=rid)
        if self.legacy is not None:
            self.legacy = legacy_release(self.legacy, sid)

    @rule(ids=st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=2, unique=True))
    def add_servers(self, ids: list[str]) -> None:
        self._step(AddServers(server_ids=ids))
        if self.adapter is not None:
            self.adapter.balancer.add_servers(dict.fromkeys(ids))
        if self.legacy is not None:
            self.legacy = legacy_add(self.legacy, ids)

    @rule(ids=st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=2))
    def remove_servers(self, ids: list[str]) -> None:
        self._step(RemoveServers(server_ids=ids))
        if self.adapter is not None:
            self.adapter.balancer.remove_servers(ids)
        if self.legacy is not None:
            self.legacy = legacy_remove(self.legacy, ids)

    @rule()
    def clear_sticky_cache(self) -> None:
        outcome = self._step(ClearStickyCache())
        if self.adapter is not None:
            result = self.adapter.balancer.clear_sticky_cache()
            assert result["cleared_entries"] == outcome.cleared_entries
            assert list(result["server_loads"].items()) == list(outcome.server_loads)
        if self.legacy is not None:
            self.legacy, cleared = legacy_clear(self.legacy)
            assert cleared == outcome.cleared_entries

    @precondition(lambda self: self.extensions)
    @rule(sid=st.sampled_from((*UNIVERSE, "s9")), load=st.integers(0, 4))
    def observe_loads(self, sid: str, load: int) -> None:
        self._step(ObserveLoads(observed=[(sid, load)]))

    # ------------------------------------------------------------- invariants
    @invariant()
    def participants_agree(self) -> None:
        assert well_formed(self.config, self.state)
        if self.legacy is not None:
            assert project(self.state) == legacy_projection(self.legacy)
        if self.adapter is not None:
            theirs = self.adapter.balancer.get_status()
            ours = status(self.config, self.state)
            for key in STATUS_KEYS:
                assert theirs[key] == ours[key], (key, theirs[key], ours[key])


LockstepMachine.TestCase.settings = stateful_settings()
TestLockstep = LockstepMachine.TestCase


def test_legacy_comparable_is_not_vacuous() -> None:
    assert legacy_comparable(Config())
    assert legacy_comparable(Config(full_determinism=True, tie_break="draw"))
    assert not legacy_comparable(Config(affinity_break_margin=0))
    assert not legacy_comparable(Config(full_determinism=True, hash_mode="stable"))
    assert not legacy_comparable(attrs.evolve(Config(), lease_accounting=True))
