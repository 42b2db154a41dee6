"""Group pins (SPEC section 7.6) explored exhaustively on the reference, at small scopes.

Theory of operation
-------------------
:func:`explore` runs a breadth-first search over every state of ``affinity_core.step``
reachable in a small universe -- two servers, two request ids, two group ids, acquires
with and without a group id (and with tie draws 0 and 1 under ``draw``), releases, the
removal and re-addition of a server -- with the in-flight total capped and the counters
zeroed (a check reads a counter only as one step's difference), so the space is finite.
Every transition is checked against properties computed *independently* of
``classify`` from the state before the step:

* ``well_formed`` (R-GRP-4, R-LRU-5): ``|G| <= max_group_cache_size``, ``|C| <=
  max_cache_size``, unique keys in both maps; under ``only`` a grouped acquire leaves the
  sticky map as it was;
* ``group_counters`` (R-GRP-5): ``group_kept + group_broken`` grows by one exactly on a
  group hit on an active server (a grouped acquire that reads ``G`` -- ``only``, or no own
  entry -- and finds its group pinned to an active server); ``affinity_kept`` and
  ``affinity_broken`` do not move on a group row, and the path agrees with the counter;
* ``tie_set`` (R-TIE-1, R-GRP-4): a placement (paths new, reselected, broken,
  group_broken, unkeyed) lands on a server at the minimum load before the step;
* ``group_skew`` (R-GRP-3): with a margin ``m`` and ``group_break_margin`` ``gm``, a
  group-kept acquire's server has ``L <= min + gm`` and a kept one ``L <= min + m``; an
  idle server bounds the chosen load by the same margin (no starvation);
* ``legacy_group`` (R-GRP-8, R-GRP-3): with ``only`` and the legacy policy a group hit on
  an active server always stays on the group's server.

Each configuration runs with the reference's ``step`` and with every mutant transition
of :data:`MUTANTS`; a mutant must be refuted (a check fails) in the same run. The rows
say which configurations and bounds were explored; nothing here is claimed beyond them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from affinity_core import (
    Acquire,
    Acquired,
    AddServers,
    Config,
    Path,
    Release,
    RemoveServers,
    State,
    initial_state,
    step,
)
from affinity_core.machine import Transition
from affinity_core.policy import is_grouped
from affinity_core.state import load, loads

from .report import MutantVerdict, Row

__all__ = ["CHECKS", "CONFIGS", "MUTANTS", "GroupConfig", "explore", "group_bfs_job"]

Step = Callable[[Config, State, Any], Transition]

SERVERS = ("a", "b")
REQUESTS = ("r1", "r2")
GROUPS = ("g1", "g2")
LOAD_CAP = 3  # in-flight total; acquires beyond it are not explored


@attrs.frozen
class GroupConfig:
    label: str
    config: Config


CONFIGS: tuple[GroupConfig, ...] = (
    GroupConfig("fallback m=1 gm=0 G<=1 C<=2 draw",
                Config(affinity_break_margin=1, group_stickiness="fallback",
                       group_break_margin=0, max_group_cache_size=1, max_cache_size=2,
                       tie_break="draw")),
    GroupConfig("fallback m=0 gm=1 G<=2 C<=1 first",
                Config(affinity_break_margin=0, group_stickiness="fallback",
                       group_break_margin=1, max_group_cache_size=2, max_cache_size=1)),
    GroupConfig("only legacy G<=1 first",
                Config(group_stickiness="only", max_group_cache_size=1, max_cache_size=1)),
)


def _events(config: Config, state: State) -> Iterator[Any]:
    draws = (0, 1) if config.tie_break.value == "draw" else (0,)
    if sum(state.inflight.values()) < LOAD_CAP:
        for rid in REQUESTS:
            for gid in (None, *GROUPS):
                for draw in draws:
                    yield Acquire(request_id=rid, group_id=gid, tie_draw=draw)
    for server in SERVERS:
        if server in state.pool:
            yield Release(server_id=server)
    if "b" in state.pool:
        yield RemoveServers(server_ids=("b",))
    else:
        yield AddServers(server_ids=("b",))


# ------------------------------------------------------------------ the checks
Check = Callable[[Config, State, Any, Transition], str | None]
_PLACED = {Path.NEW, Path.RESELECTED, Path.BROKEN, Path.GROUP_BROKEN, Path.UNKEYED}


def _keys(entries: tuple[tuple[str, str], ...]) -> list[str]:
    return [key for key, _ in entries]


def well_formed(config: Config, state: State, event: Any, t: Transition) -> str | None:
    after = t.state
    groups, sticky = _keys(after.groups), _keys(after.sticky)
    if len(groups) > config.max_group_cache_size or len(set(groups)) != len(groups):
        return f"group map {after.groups} breaks |G| <= {config.max_group_cache_size}/unique"
    if len(sticky) > config.max_cache_size or len(set(sticky)) != len(sticky):
        return f"sticky map {after.sticky} breaks |C| <= {config.max_cache_size}/unique"
    grouped = isinstance(event, Acquire) and is_grouped(config, event)
    if config.group_stickiness.value == "only" and grouped and after.sticky != state.sticky:
        return f"only: a grouped acquire changed the sticky map to {after.sticky}"
    return None


def _group_hit(config: Config, state: State, event: Acquire) -> bool:
    """A grouped acquire reads the group map and finds an active pin (R-GRP-2)."""
    if not is_grouped(config, event):
        return False
    if config.group_stickiness.value == "fallback" and event.request_id in _keys(state.sticky):
        return False
    pins = dict(state.groups)
    return event.group_id in pins and pins[event.group_id] in state.pool


def group_counters(config: Config, state: State, event: Any, t: Transition) -> str | None:
    after = t.state
    group = (after.group_kept - state.group_kept) + (after.group_broken - state.group_broken)
    own = (after.affinity_kept - state.affinity_kept) + (
        after.affinity_broken - state.affinity_broken)
    hit = isinstance(event, Acquire) and _group_hit(config, state, event)
    if group != int(hit):
        return f"group counters moved by {group} on a {'group hit' if hit else 'non-hit'}"
    if hit and own:
        return "a group row moved the affinity counters"
    if isinstance(t.outcome, Acquired):
        kept = after.group_kept - state.group_kept
        path = t.outcome.path
        if hit and (path is Path.GROUP_KEPT) != bool(kept):
            return f"path {path.value} disagrees with group_kept +{kept}"
    return None


def tie_set(config: Config, state: State, event: Any, t: Transition) -> str | None:
    outcome = t.outcome
    if not isinstance(outcome, Acquired) or outcome.path not in _PLACED:
        return None
    low = min(loads(state))
    if load(state, outcome.server_id) != low:
        return f"{outcome.path.value} placed on {outcome.server_id} above the minimum {low}"
    return None


def group_skew(config: Config, state: State, event: Any, t: Transition) -> str | None:
    outcome, m, gm = t.outcome, config.affinity_break_margin, config.group_break_margin
    if not isinstance(outcome, Acquired) or m is None or gm is None:
        return None
    width = gm if outcome.path is Path.GROUP_KEPT else m
    low, chosen = min(loads(state)), load(state, outcome.server_id)
    if chosen > low + width:
        return f"{outcome.path.value} on L={chosen} > min {low} + {width}"
    if 0 in loads(state) and chosen > width:
        return f"{outcome.path.value} on L={chosen} > {width} beside an idle server"
    return None


def legacy_group(config: Config, state: State, event: Any, t: Transition) -> str | None:
    if config.affinity_break_margin is not None or config.dual_threshold is not None:
        return None
    if not (isinstance(event, Acquire) and _group_hit(config, state, event)):
        return None
    assert event.group_id is not None
    pinned = dict(state.groups)[event.group_id]
    outcome = t.outcome
    if not isinstance(outcome, Acquired) or outcome.server_id != pinned:
        return f"legacy group hit on {pinned} went elsewhere: {outcome}"
    return None


@attrs.frozen
class GroupCheck:
    name: str
    obligation: int
    requirements: tuple[str, ...]
    check: Check


CHECKS: tuple[GroupCheck, ...] = (
    GroupCheck("well_formed", 10, ("R-GRP-4", "R-LRU-5"), well_formed),
    GroupCheck("group_counters", 8, ("R-GRP-5", "R-CNT-1"), group_counters),
    GroupCheck("tie_set", 3, ("R-TIE-1", "R-GRP-4", "R-PLACE-1"), tie_set),
    GroupCheck("group_skew", 3, ("R-GRP-3", "R-KEEP-3"), group_skew),
    GroupCheck("legacy_group", 3, ("R-GRP-8", "R-GRP-3"), legacy_group),
)


# ------------------------------------------------------------------ the mutant transitions
def _keeps_one_wider(config: Config, state: State, event: Any) -> Transition:
    """Group pins kept at ``min + gm + 1``."""
    gm = config.group_break_margin
    wider = config if gm is None else attrs.evolve(config, group_break_margin=gm + 1)
    return step(wider, state, event)


def _break_counted_as_affinity(config: Config, state: State, event: Any) -> Transition:
    """A group break bumps ``affinity_broken`` instead of ``group_broken``."""
    t = step(config, state, event)
    if isinstance(t.outcome, Acquired) and t.outcome.path is Path.GROUP_BROKEN:
        moved = attrs.evolve(t.state, group_broken=t.state.group_broken - 1,
                             affinity_broken=t.state.affinity_broken + 1)
        return Transition(moved, t.outcome)
    return t


def _group_evicts_late(config: Config, state: State, event: Any) -> Transition:
    """The group map evicts one write late (capacity + 1)."""
    wider = attrs.evolve(config, max_group_cache_size=config.max_group_cache_size + 1)
    return step(wider, state, event)


def _legacy_group_breaks(config: Config, state: State, event: Any) -> Transition:
    """Under ``only`` and the legacy policy, a group pin is judged by margin 0."""
    if config.affinity_break_margin is None and config.dual_threshold is None:
        return step(attrs.evolve(config, group_break_margin=0), state, event)
    return step(config, state, event)


MUTANTS: dict[str, tuple[Step, str, str]] = {  # name -> (step, check refuting it, what)
    "group_keep_plus_one_bfs": (_keeps_one_wider, "group_skew",
                                "group pins kept at min + gm + 1"),
    "group_break_counted_as_affinity": (_break_counted_as_affinity, "group_counters",
                                        "a group break bumps affinity_broken"),
    "group_map_evicts_late": (_group_evicts_late, "well_formed",
                              "the group map holds max_group_cache_size + 1 entries"),
    "legacy_group_pin_breaks": (_legacy_group_breaks, "legacy_group",
                                "only + legacy: a group pin breaks at margin 0"),
}


# ------------------------------------------------------------------ the search
@attrs.frozen
class Explored:
    states: int
    transitions: int
    applied: dict[str, int]  # check -> transitions it judged (returned a verdict)
    violation: tuple[str, str] | None  # (check, description with the trace's last event)


def _without_counters(state: State) -> State:
    """The state with its four counters at zero. The counters only ever grow, so without
    this the reachable space is infinite; every check reads a counter as a difference
    across one step, which zeroing before the step leaves unchanged."""
    return attrs.evolve(state, affinity_kept=0, affinity_broken=0, group_kept=0,
                        group_broken=0)


def explore(gc: GroupConfig, transition: Step = step,
            checks: tuple[GroupCheck, ...] = CHECKS) -> Explored:
    """Every reachable state of ``gc`` under ``transition``; stops at the first violation."""
    config = gc.config
    start = initial_state(config, SERVERS)
    seen = {start}
    queue = deque([start])
    transitions = 0
    applied = {c.name: 0 for c in checks}
    while queue:
        state = queue.popleft()
        for event in _events(config, state):
            t = transition(config, state, event)
            transitions += 1
            for c in checks:
                problem = c.check(config, state, event, t)
                if problem is not None:
                    return Explored(len(seen), transitions, applied, (c.name, f"{problem}; "
                                    f"event {event!r} from pool {state.pool} loads "
                                    f"{loads(state)} C={state.sticky} G={state.groups}"))
                applied[c.name] += 1
            after = _without_counters(t.state)
            if after not in seen:
                seen.add(after)
                queue.append(after)
    return Explored(len(seen), transitions, applied, None)


SCOPE = (f"{len(SERVERS)} servers, request ids {len(REQUESTS)}, group ids {len(GROUPS)} "
         f"(and none), releases, remove/add of one server, in-flight total <= {LOAD_CAP}; "
         "configurations: " + "; ".join(gc.label for gc in CONFIGS))


def group_bfs_job() -> list[Row]:
    """The reference explored under every configuration, then each mutant transition; one
    row per obligation the checks serve."""
    start = time.perf_counter()
    spec = {gc.label: explore(gc) for gc in CONFIGS}
    refutations: dict[str, tuple[bool, str]] = {}
    for name, (mutant, expected, _) in MUTANTS.items():
        found = [(gc.label, r.violation) for gc in CONFIGS
                 if (r := explore(gc, mutant)).violation is not None]
        hit = [(label, v) for label, v in found if v is not None and v[0] == expected]
        refutations[name] = ((True, f"{hit[0][0]}: {hit[0][1][1]}") if hit
                             else (False, f"not refuted by {expected}: {found}"))
    seconds = time.perf_counter() - start
    states = sum(r.states for r in spec.values())
    rows = []
    for obligation in sorted({c.obligation for c in CHECKS}):
        checks = [c for c in CHECKS if c.obligation == obligation]
        names = {c.name for c in checks}
        violations = [f"{label}: {r.violation}" for label, r in spec.items()
                      if r.violation is not None and r.violation[0] in names]
        broken = [r for r in spec.values() if r.violation is not None]
        holds = not violations and not broken
        mutants = tuple(MutantVerdict(name, what, *refutations[name])
                        for name, (_, expected, what) in MUTANTS.items() if expected in names)
        applied = {c.name: sum(r.applied[c.name] for r in spec.values()) for c in checks}
        requirements = tuple(dict.fromkeys(r for c in checks for r in c.requirements))
        detail = (f"group pins BFS on affinity_core.step: checks {sorted(names)}, "
                  f"{states} states")
        if not holds:
            detail += f"; VIOLATED: {violations or [r.violation for r in broken]}"
        rows.append(Row(obligation, "BFS of the reference, group pins", SCOPE, holds,
                        seconds, mutants, detail, requirements,
                        {"states": {k: v.states for k, v in spec.items()},
                         "transitions": {k: v.transitions for k, v in spec.items()},
                         "applied": applied}))
    return rows
