"""Group pins in the engine (SPEC §7.6, R-GRP-1..8): literal scenarios per group path.

Each scenario steps :func:`affinity_engine.step` by hand over three servers and checks the
outcome, the sticky map, the group map and the counters; each also steps the reference
along and requires the same outcome and abstracted state, so a scenario cannot pass on an
engine that merely agrees with itself.
"""

from __future__ import annotations

from typing import Any

import pytest

import affinity_core
from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    ClearStickyCache,
    Config,
    Event,
    Lookup,
    Outcome,
    Path,
    Release,
    RemoveServers,
    State,
    StickyCacheCleared,
    classify,
    initial_state,
    stable_hash,
    status,
    step,
)
from affinity_engine.abstraction import from_reference, to_reference

SERVERS = ("s0", "s1", "s2")


class Lockstep:
    """The engine and the reference stepped together; every step must agree."""

    def __init__(self, servers: tuple[str, ...] = SERVERS, **options: Any) -> None:
        self.config = Config(**options)
        self.state: State = initial_state(self.config, servers)
        self.reference = affinity_core.initial_state(self.config, servers)
        assert to_reference(self.state) == self.reference

    def step(self, event: Event) -> Outcome:
        mine = step(self.config, self.state, event)
        theirs = affinity_core.step(self.config, self.reference, event)
        assert mine.outcome == theirs.outcome, (event, mine.outcome, theirs.outcome)
        assert to_reference(mine.state) == theirs.state, event
        assert status(self.config, mine.state) == affinity_core.status(self.config,
                                                                        theirs.state)
        self.state, self.reference = mine.state, theirs.state
        return mine.outcome

    def acquire(self, rid: str | None, group: str | None = None, **fields: Any) -> Acquired:
        outcome = self.step(Acquire(request_id=rid, group_id=group, **fields))
        assert isinstance(outcome, Acquired), outcome
        return outcome

    @property
    def groups(self) -> tuple[tuple[str, str], ...]:
        return self.state.groups.lru.items()

    @property
    def sticky(self) -> tuple[tuple[str, str], ...]:
        return self.state.lru.items()


def test_fallback_group_miss_places_and_pins_both() -> None:
    run = Lockstep(group_stickiness="fallback")
    out = run.acquire("a", "g")
    assert (out.server_id, out.path) == ("s0", Path.NEW)
    assert run.sticky == (("a", "s0"),) and run.groups == (("g", "s0"),)


def test_fallback_sibling_joins_the_group_pin() -> None:
    run = Lockstep(group_stickiness="fallback")
    run.acquire("a", "g")
    out = run.acquire("b", "g")  # s0 holds 1; the legacy policy keeps the group pin
    assert (out.server_id, out.path) == ("s0", Path.GROUP_KEPT)
    assert run.sticky == (("a", "s0"), ("b", "s0"))
    assert (run.state.groups.kept, run.state.groups.broken) == (1, 0)
    assert (run.state.affinity_kept, run.state.affinity_broken) == (0, 0)


def test_fallback_own_pin_wins_over_the_group_pin() -> None:
    run = Lockstep(group_stickiness="fallback")
    run.acquire("a", "g")
    run.acquire("x", "h")  # s1
    out = run.acquire("x", "g")  # x has its own pin: the group is not read
    assert (out.server_id, out.path) == ("s1", Path.KEPT)
    assert run.groups == (("g", "s0"), ("h", "s1")) and run.state.groups.kept == 0


def test_group_break_margin_breaks_and_re_pins_the_group() -> None:
    run = Lockstep(group_stickiness="fallback", affinity_break_margin=5, group_break_margin=0)
    run.acquire("a", "g")
    out = run.acquire("b", "g")  # L[s0] = 1 > min 0 + 0: broken despite margin 5
    assert (out.server_id, out.path, out.previous) == ("s1", Path.GROUP_BROKEN, "s0")
    assert run.groups == (("g", "s1"),) and run.state.groups.broken == 1


def test_group_pin_on_a_removed_server_is_reselected() -> None:
    run = Lockstep(group_stickiness="fallback")
    run.acquire("a", "g")
    run.step(RemoveServers(server_ids=["s0"]))
    out = run.acquire("b", "g")
    assert (out.server_id, out.path, out.previous) == ("s1", Path.RESELECTED, "s0")
    assert run.groups == (("g", "s1"),)


def test_group_pin_on_a_removed_server_with_an_empty_pool_is_deleted() -> None:
    run = Lockstep(("s0",), group_stickiness="only")
    run.acquire("a", "g")
    run.step(RemoveServers(server_ids=["s0"]))
    outcome = run.step(Acquire(request_id="b", group_id="g"))
    assert not isinstance(outcome, Acquired)
    assert run.groups == ()  # R-ACQ-6: the stale entry goes even when the acquire is refused


def test_only_never_writes_the_request_pin() -> None:
    run = Lockstep(group_stickiness="only")
    run.acquire("a", "g")
    out = run.acquire("a", "g")
    assert (out.server_id, out.path) == ("s0", Path.GROUP_KEPT)
    assert run.sticky == () and run.groups == (("g", "s0"),)


def test_only_ignores_an_existing_own_pin() -> None:
    run = Lockstep(group_stickiness="only")
    run.acquire("a")  # not grouped: pinned as ever, on s0
    out = run.acquire("a", "g")  # grouped: the group map alone decides
    assert (out.server_id, out.path) == ("s1", Path.NEW)
    assert run.sticky == (("a", "s0"),) and run.groups == (("g", "s1"),)


@pytest.mark.parametrize("capacity", [1, 2])
def test_group_map_evicts_its_least_recent_group(capacity: int) -> None:
    run = Lockstep(group_stickiness="fallback", max_group_cache_size=capacity)
    run.acquire("a", "g0")
    if capacity == 2:
        run.acquire("b", "g1")
        run.acquire("c", "g0")  # a kept hit: g0 becomes most recent, g1 least
    out = run.acquire("d", "g2")
    assert out.evicted_group == ("g0" if capacity == 1 else "g1")
    assert len(run.groups) == capacity and run.groups[-1][0] == "g2"


def test_a_kept_group_hit_refreshes_the_group_entry() -> None:
    run = Lockstep(group_stickiness="fallback")
    run.acquire("a", "g0")
    run.acquire("b", "g1")
    assert [g for g, _ in run.groups] == ["g0", "g1"]
    run.acquire("c", "g0")
    assert [g for g, _ in run.groups] == ["g1", "g0"]


def test_clear_sticky_cache_reports_and_clears_groups() -> None:
    run = Lockstep(group_stickiness="fallback")
    run.acquire("a", "g0")
    run.acquire("b", "g1")
    outcome = run.step(ClearStickyCache())
    assert isinstance(outcome, StickyCacheCleared)
    assert (outcome.cleared_entries, outcome.cleared_groups) == (2, 2)
    assert run.sticky == () and run.groups == ()


def test_full_determinism_stable_hashes_the_group_id() -> None:
    run = Lockstep(group_stickiness="fallback", full_determinism=True, hash_mode="stable")
    want = sorted(SERVERS)[stable_hash("g") % 3]
    assert {run.acquire(f"r{i}", "g").server_id for i in range(4)} == {want}


def test_full_determinism_caller_uses_the_callers_hash() -> None:
    run = Lockstep(group_stickiness="only", full_determinism=True)
    assert run.acquire("a", "g", request_hash=5).server_id == SERVERS[5 % 3]
    # the group pin is kept under full_determinism, whatever a sibling's hash says
    assert run.acquire("b", "g", request_hash=0).path is Path.GROUP_KEPT


def test_hashed_tie_break_hashes_the_group_id() -> None:
    run = Lockstep(group_stickiness="only", tie_break="hashed")
    out = run.acquire("a", "g")
    assert out.server_id == SERVERS[stable_hash("g") % 3]


def test_groups_off_ignores_group_ids() -> None:
    run = Lockstep()
    run.acquire("a", "g")
    out = run.acquire("b", "g")
    assert (out.server_id, out.path) == ("s1", Path.NEW)
    assert run.groups == () and "group_entries" not in status(run.config, run.state)


def test_classify_names_each_group_lookup() -> None:
    run = Lockstep(group_stickiness="fallback", group_break_margin=0)
    assert classify(run.config, run.state, "a", None, "g") == (Lookup.GROUP_MISS, None)
    run.acquire("a", "g")  # s0
    assert classify(run.config, run.state, "a", None, "g") == (Lookup.HIT_KEEP, "s0")
    assert classify(run.config, run.state, "b", None, "g") == (Lookup.GROUP_BREAK, "s0")
    run.step(Release(server_id="s0"))
    assert classify(run.config, run.state, "b", None, "g") == (Lookup.GROUP_KEEP, "s0")
    run.step(RemoveServers(server_ids=["s0"]))
    assert classify(run.config, run.state, "b", None, "g") == (Lookup.GROUP_REMOVED, "s0")
    run.step(AddServers(server_ids=["s0"]))
    assert classify(run.config, run.state, "b", None, "g") == (Lookup.GROUP_KEEP, "s0")


def test_abstraction_round_trips_group_fields() -> None:
    run = Lockstep(group_stickiness="fallback", max_group_cache_size=2)
    for rid, group in (("a", "g0"), ("b", "g1"), ("c", "g0"), ("d", "g2")):
        run.acquire(rid, group)
    reference = to_reference(run.state)
    assert reference.groups == (("g0", "s0"), ("g2", "s2")) and reference.group_kept == 1
    again = from_reference(run.config, reference)
    assert again == run.state and to_reference(again) == reference
