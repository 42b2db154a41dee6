"""Default-null equivalence: the core in lockstep with the naive legacy model (R-LEG-1).

Theory of operation
-------------------
With ``affinity_break_margin=None`` and no gate, the core must *be* verl's balancer. The
independent :mod:`affinity_conformance.legacy` model (plain tuples, linear scans) is driven with
the same random trace as the core, and after every step the test compares

* the decision: the same server, or the same rejection message;
* the state: ``project(state) == legacy_projection(model)`` (pool order with counts, and
  the sticky map in recency order);
* the verl status keys, recomputed from the model;
* the ``clear_sticky_cache`` entry count.

Both tie versions are covered (``first``: Aug-2026 main and PR #7435; ``draw``: 0.9.1's
``random.choice`` with the draw on the event), with and without ``full_determinism``
(caller hash mode: the hash rides on the event), and with tiny sticky maps so that
evictions happen. Seeded traces over pools of 33, 65 and 1030 servers exercise the
multi-level load tree against the model's linear scans. Unkeyed requests and load
observations are not part of verl's API and are left out.
"""

from __future__ import annotations

import random
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affinity_conformance.invariants import legacy_projection, project
from affinity_conformance.legacy import LegacyModel, legacy_step
from affinity_engine import (
    VERL_STATUS_KEYS,
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    Config,
    Event,
    Rejected,
    Release,
    RemoveServers,
    StickyCacheCleared,
    initial_state,
    status,
    step,
)

IDS = ("s0", "s1", "s2", "s3")
RIDS = ("a", "b", "c", "d")

EVENT_KINDS: dict[str, st.SearchStrategy[Event]] = {
    "acquire": st.builds(Acquire, request_id=st.sampled_from(RIDS), tie_draw=st.integers(0, 5),
                         request_hash=st.integers(-6, 6)),
    "release": st.builds(Release, server_id=st.sampled_from((*IDS, "ghost"))),
    "add": st.builds(AddServers,
                     server_ids=st.lists(st.sampled_from(IDS), unique=True, max_size=2)),
    "remove": st.builds(RemoveServers, server_ids=st.lists(st.sampled_from((*IDS, "ghost")),
                                                           min_size=1, max_size=2)),
    "clear": st.just(ClearStickyCache()),
}
events: st.SearchStrategy[Event] = st.sampled_from(
    ["acquire"] * 8 + ["release"] * 3 + ["add"] * 2 + ["remove"] * 2 + ["clear"]
).flatmap(EVENT_KINDS.__getitem__)


def legacy_decision(model: LegacyModel, event: Event, ties: Literal["first", "draw"]
                    ) -> tuple[LegacyModel, Any]:
    """Apply an event to the model; returns it and the comparable decision."""
    result = legacy_step(model, event, ties=ties)
    if isinstance(event, Acquire):
        return result.model, (result.server_id, result.error)
    return result.model, result.cleared


def core_decision(event: Event, outcome: object) -> Any:
    """The core outcome in the model's terms."""
    if isinstance(event, Acquire):
        if isinstance(outcome, Acquired):
            return outcome.server_id, None
        assert isinstance(outcome, Rejected)
        return None, outcome.message
    if isinstance(event, ClearStickyCache):
        assert isinstance(outcome, StickyCacheCleared)
        return outcome.cleared_entries
    return None


def verl_status(model: LegacyModel) -> dict[str, Any]:
    loads = dict(model.pool)
    return {"servers": loads, "total_inflight": sum(loads.values()),
            "active_servers": len(loads), "registered_handles": list(loads)}


@settings(max_examples=300)
@given(ties=st.sampled_from(["first", "draw"]), full_determinism=st.booleans(),
       max_cache_size=st.integers(1, 4),
       servers=st.lists(st.sampled_from(IDS), unique=True, min_size=1, max_size=4),
       trace=st.lists(events, min_size=5, max_size=60))
def test_core_equals_legacy_model(ties: Literal["first", "draw"], full_determinism: bool,
                                  max_cache_size: int, servers: list[str],
                                  trace: list[Event]) -> None:
    """R-LEG-1, R-RLS-1, R-POOL-1, R-POOL-2, R-POOL-3, R-LRU-1..5, R-DET-2: with margin
    null every decision, state projection and status equals the legacy model's."""
    config = Config(tie_break=ties, full_determinism=full_determinism,
                    max_cache_size=max_cache_size)
    state = initial_state(config, servers)
    model = LegacyModel.fresh(servers, max_cache_size, full_determinism)
    for event in trace:
        t = step(config, state, event)
        model, expected = legacy_decision(model, event, ties)
        assert core_decision(event, t.outcome) == expected, (event, t.outcome)
        state = t.state
        assert project(state) == legacy_projection(model), event
        core_status = status(config, state)
        assert {k: core_status[k] for k in VERL_STATUS_KEYS} == verl_status(model)


@pytest.mark.parametrize(("pool_size", "ties"), [(33, "first"), (65, "draw"), (1030, "draw")])
def test_wide_pools_in_lockstep(pool_size: int, ties: Literal["first", "draw"]) -> None:
    """R-LEG-1, R-TIE-1: pools wider than one 32-slot leaf (two and three tree levels)
    still choose exactly as the linear-scan model, over a seeded random trace."""
    rng = random.Random(pool_size)
    ids = [f"s{i}" for i in range(pool_size)]
    config = Config(tie_break=ties, max_cache_size=40)
    state, model = initial_state(config, ids), LegacyModel.fresh(ids, 40)
    for _ in range(300):
        roll = rng.random()
        event: Event
        if roll < 0.6:
            event = Acquire(request_id=f"r{rng.randrange(60)}", tie_draw=rng.randrange(4096),
                            request_hash=0)
        elif roll < 0.9:
            event = Release(server_id=rng.choice(ids))
        elif roll < 0.95:
            event = RemoveServers(server_ids=rng.sample(ids, 3))
        else:
            event = AddServers(server_ids=rng.sample(ids, 2))
        t = step(config, state, event)
        model, expected = legacy_decision(model, event, ties)
        assert core_decision(event, t.outcome) == expected, event
        state = t.state
        assert project(state) == legacy_projection(model), event


def test_lockstep_sees_a_divergence() -> None:
    """The comparison can fail: a margin-0 core breaks a pin the legacy model keeps."""
    config = Config(affinity_break_margin=0)
    state = initial_state(config, ["s0", "s1"])
    model = LegacyModel.fresh(["s0", "s1"])
    for _ in range(2):
        event = Acquire(request_id="a", request_hash=0)
        t = step(config, state, event)
        model, expected = legacy_decision(model, event, "first")
        state = t.state
    assert core_decision(event, t.outcome) != expected
    assert project(state) != legacy_projection(model)
