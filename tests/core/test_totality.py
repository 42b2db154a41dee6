"""Totality of ``step`` over (state shape x event), h2-style (R-OUT-1, R-OUT-2).

Theory of operation
-------------------
For every configuration axis (policy, tie mode, ``full_determinism`` with each hash mode,
lease accounting) and every state shape (empty pool, one server, stale entries, full
sticky map, drained, observed external load, a hot pin), the same probe events --
including ones that must be rejected -- are applied to the same pre-state.
:func:`checked_step` then demands that

* ``step`` returns, without raising, exactly one outcome of the type that belongs to the
  event (R-OUT-1);
* an acquire is rejected exactly when an independent oracle says so: ``invalid_for_config``
  for a missing request id / hash under ``full_determinism`` (R-ACQ-9), else
  ``no_servers`` when a placement meets an empty pool (R-ACQ-5);
* a rejected event leaves the state equal, except that an acquire may delete its own
  stale entry (R-ACQ-6);
* an acquired server is in :func:`affinity_engine.allowed` and ``allowed`` is empty iff the
  acquire is rejected (R-REL-1); under ``draw`` the inverse :func:`draw_for` replays the
  same transition (R-REL-2);
* every :func:`step_invariants` predicate holds, and along a trace the counters and the
  total load stay consistent with the history (R-CNT-1, R-CONS-2).

The named shapes are enumerated exhaustively; a Hypothesis test adds random configs,
random prefixes and random probe events.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from affinity_conformance.invariants import Ledger, conserved, counters_consistent, step_invariants
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
    RejectReason,
    Release,
    RemoveServers,
    State,
    TieBreak,
    allowed,
    draw_for,
    initial_state,
    step,
)
from affinity_engine.values import evolve

from .driver import outcome_fits_event


def expected_rejection(config: Config, state: State, event: Acquire) -> RejectReason | None:
    """The oracle: why this acquire must be rejected, or None when it must succeed."""
    if config.full_determinism and (
        event.request_id is None
        or (config.hash_mode is HashMode.CALLER and event.request_hash is None)
    ):
        return RejectReason.INVALID_FOR_CONFIG
    pinned = None if event.request_id is None else state.lru.peek(event.request_id)
    hit_on_active = pinned is not None and pinned in state.pool
    if len(state.pool) == 0 and not hit_on_active:
        return RejectReason.NO_SERVERS
    return None


def checked_step(config: Config, pre: State, event: Event, ledger: Ledger) -> tuple[State,
                                                                                    Ledger]:
    """One step with every totality check of the module docstring."""
    t = step(config, pre, event)
    outcome = t.outcome
    assert outcome_fits_event(event, outcome), f"{event!r} -> {outcome!r}"
    if isinstance(event, Acquire):
        reason = expected_rejection(config, pre, event)
        permitted = allowed(config, pre, event)
        if reason is None:
            assert isinstance(outcome, Acquired), f"{event!r} -> {outcome!r}"
            assert outcome.server_id in permitted
            if config.tie_break is TieBreak.DRAW:
                replay = draw_for(config, pre, event, outcome.server_id)
                assert replay is not None and step(config, pre, replay) == t
        else:
            assert isinstance(outcome, Rejected) and outcome.reason is reason, outcome
            assert outcome.message, outcome
            assert permitted == frozenset()
    if isinstance(outcome, Rejected) and t.state != pre:
        assert isinstance(event, Acquire) and event.request_id is not None
        rid = event.request_id
        stale = pre.lru.peek(rid)
        assert stale is not None and stale not in pre.pool, "only a stale entry may go"
        assert t.state.lru.items() == tuple(e for e in pre.lru.items() if e[0] != rid)
        assert evolve(t.state, lru=pre.lru) == pre
    failed = [k for k, ok in step_invariants(config, pre, event, t).items() if not ok]
    assert not failed, f"{event!r} -> {outcome!r} broke {failed}"
    ledger = ledger.record(pre, event, t)
    assert counters_consistent(t.state, ledger) and conserved(t.state, ledger)
    return t.state, ledger


def run_trace(config: Config, state: State, events: list[Event]) -> tuple[State, Ledger]:
    ledger = Ledger()
    for event in events:
        state, ledger = checked_step(config, state, event, ledger)
    return state, ledger


# ------------------------------------------------------------------ configurations
POLICIES: dict[str, dict[str, Any]] = {
    "legacy": {},
    "margin": {"affinity_break_margin": 1},
    "gate": {"dual_threshold": DualThreshold(1, "1.5")},
}
DETERMINISM: dict[str, dict[str, Any]] = {
    "off": {},
    "caller": {"full_determinism": True},
    "stable": {"full_determinism": True, "hash_mode": "stable"},
}
CONFIGS = [
    Config(max_cache_size=2, tie_break=tie, lease_accounting=lease, **policy, **det)
    for policy, tie, det, lease in itertools.product(
        POLICIES.values(), ("first", "draw", "hashed"), DETERMINISM.values(), (False, True))
]


def acquire(rid: str | None, n: int = 0) -> Acquire:
    """An acquire that is valid in every mode when rid is given (hash and draw vary)."""
    return Acquire(request_id=rid, tie_draw=n, request_hash=n - 2)


# --------------------------------------------------------------------- state shapes
Shape = Callable[[Config], tuple[list[str], list[Event]]]


def empty_pool(config: Config) -> tuple[list[str], list[Event]]:
    return [], []


def one_server(config: Config) -> tuple[list[str], list[Event]]:
    return ["s0"], [acquire("a"), acquire("a", 1)]


def stale_entries(config: Config) -> tuple[list[str], list[Event]]:
    """Pins a and b, then removes every server but s2 (so a or b points at a removed one)."""
    return (["s0", "s1", "s2"], [acquire("a", 0), acquire("b", 1), acquire(None, 2),
                                 RemoveServers(server_ids=["s0", "s1"])])


def all_removed(config: Config) -> tuple[list[str], list[Event]]:
    """Stale entries and an empty pool: the R-ACQ-6 situation."""
    return ["s0", "s1"], [acquire("a", 0), acquire("b", 1),
                          RemoveServers(server_ids=["s0", "s1"])]


def full_cache(config: Config) -> tuple[list[str], list[Event]]:
    return ["s0", "s1", "s2"], [acquire(r, i) for i, r in enumerate("abc")]


def drained(config: Config) -> tuple[list[str], list[Event]]:
    """Releases beyond the acquires, a remove / re-add and a clear."""
    return (["s0", "s1"], [acquire("a", 0), Release(server_id="s0", request_id="a"),
                           Release(server_id="s0"), RemoveServers(server_ids=["s1"]),
                           AddServers(server_ids=["s1", "s0"]), ClearStickyCache()])


def observed(config: Config) -> tuple[list[str], list[Event]]:
    """External load on s1 (R-OBS-1) next to the router's own in-flight requests."""
    return ["s0", "s1", "s2"], [acquire("a", 0), acquire("b", 1),
                                ObserveLoads(observed=[("s1", 4), ("s9", 2)])]


def hot_pin(config: Config) -> tuple[list[str], list[Event]]:
    """One id hit repeatedly: the margin and gate policies break its pin."""
    return ["s0", "s1", "s2"], [acquire("a", i) for i in range(4)]


SHAPES: list[Shape] = [empty_pool, one_server, stale_entries, all_removed, full_cache, drained,
                       observed, hot_pin]

PROBES: list[Event] = [
    acquire("a", 1), acquire("b", 2), acquire("new", 5), acquire(None, 2),
    Acquire(request_id="a"),  # no request_hash: rejected in caller mode
    Acquire(request_id=None),  # unkeyed: rejected under full_determinism
    Release(server_id="s0"), Release(server_id="s2", request_id="b"),
    Release(server_id="ghost", request_id="a"),
    AddServers(server_ids=["s0", "s9"]), AddServers(server_ids=[]),
    RemoveServers(server_ids=["s1", "ghost", "s1"]), ClearStickyCache(),
    ObserveLoads(observed=[("s0", 3), ("ghost", 1)]), ObserveLoads(observed=[("s2", 0)]),
]


def test_every_probe_on_every_shape_and_config() -> None:
    """R-OUT-1, R-OUT-2, R-ACQ-5, R-ACQ-6, R-ACQ-9, R-REL-1, R-REL-2: every probe event on
    every named shape under every configuration is total and well behaved."""
    reached = {"stale": 0, "full": 0, "external": 0, "broken": 0, "rejected": 0,
               "r-acq-6": 0}
    for config in CONFIGS:
        for shape in SHAPES:
            servers, prefix = shape(config)
            pre, ledger = run_trace(config, initial_state(config, servers), prefix)
            reached["stale"] += any(s not in pre.pool for _, s in pre.lru.items())
            reached["full"] += len(pre.lru) == config.max_cache_size
            reached["external"] += len(pre.external) > 0
            reached["broken"] += pre.affinity_broken > 0
            for probe in PROBES:
                post, _ = checked_step(config, pre, probe, ledger)
                rejected = isinstance(step(config, pre, probe).outcome, Rejected)
                reached["rejected"] += rejected
                reached["r-acq-6"] += rejected and post != pre
    # The shapes really were reached (a test that never meets them would prove nothing).
    assert all(n > 0 for n in reached.values()), reached


# ------------------------------------------------------------------------ Hypothesis
IDS = ("s0", "s1", "s2", "s3")
RIDS = (None, "a", "b", "c")


@st.composite
def configs(draw: st.DrawFn) -> Config:
    kind = draw(st.sampled_from(["legacy", "margin", "margin", "gate"]))
    policy: dict[str, Any] = {}
    if kind == "margin":
        policy = {"affinity_break_margin": draw(st.integers(0, 2))}
    elif kind == "gate":
        policy = {"dual_threshold": DualThreshold(draw(st.integers(-1, 2)),
                                                  draw(st.sampled_from(["1", "1.5", "2"])))}
    det = draw(st.sampled_from([DETERMINISM["off"], *DETERMINISM.values()]))
    return Config(max_cache_size=draw(st.integers(1, 4)), tie_break=draw(st.sampled_from(
        ["first", "draw", "hashed"])), lease_accounting=draw(st.booleans()), **policy, **det)


EVENT_KINDS: dict[str, st.SearchStrategy[Event]] = {
    "acquire": st.builds(Acquire, request_id=st.sampled_from(RIDS),
                         tie_draw=st.integers(0, 7),
                         request_hash=st.sampled_from([None, *range(-9, 10)])),
    "release": st.builds(Release, server_id=st.sampled_from((*IDS, "ghost")),
                         request_id=st.sampled_from(RIDS)),
    "add": st.builds(AddServers,
                     server_ids=st.lists(st.sampled_from(IDS), unique=True, max_size=3)),
    "remove": st.builds(RemoveServers,
                        server_ids=st.lists(st.sampled_from((*IDS, "ghost")), max_size=3)),
    "clear": st.just(ClearStickyCache()),
    "observe": st.builds(ObserveLoads, observed=st.dictionaries(
        st.sampled_from((*IDS, "ghost")), st.integers(0, 6), max_size=3)),
}
# Acquires dominate (sticky hits and breaks need repeated ids on a loaded pool); pool
# changes are rarer so that the pool is not empty most of the time.
events: st.SearchStrategy[Event] = st.sampled_from(
    ["acquire"] * 8 + ["release"] * 3 + ["add", "remove", "clear", "observe"]
).flatmap(EVENT_KINDS.__getitem__)


@settings(max_examples=300)
@given(config=configs(),
       servers=st.lists(st.sampled_from(IDS), unique=True, min_size=1, max_size=4),
       prefix=st.lists(events, min_size=8, max_size=40),
       probes=st.lists(events, min_size=1, max_size=6))
def test_random_traces_and_probes(config: Config, servers: list[str], prefix: list[Event],
                                  probes: list[Event]) -> None:
    """R-OUT-1, R-OUT-2, R-ST-2, R-CNT-1, R-CNT-2, R-CONS-1, R-CONS-2, R-POOL-4: random
    prefixes build a state; every probe applied to it passes every check."""
    pre, ledger = run_trace(config, initial_state(config, servers), prefix)
    for probe in probes:
        checked_step(config, pre, probe, ledger)
