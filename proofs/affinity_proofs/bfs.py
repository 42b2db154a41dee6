"""Explicit-state breadth-first model checker over the real ``affinity_engine.step``.

Theory of operation
-------------------
The checker enumerates every interleaving of events from a small universe (servers,
request ids, tie draws, pool changes, clears, releases) and calls the *real*
:func:`affinity_engine.step` on each edge. On every edge it evaluates a list of
:class:`Check` objects (which call the named predicates of ``affinity_conformance.invariants``);
a failing check yields a :class:`Violation` with the shortest trace from the initial
state, rebuilt from parent pointers.

Finiteness. Loads are bounded by ``load_cap``: edges into states above the cap are still
checked but not expanded. A post-state outside the *domain* of the state -- a negative
in-flight count, a stored external load <= 0, a held-lease count < 1, more held-lease
entries than ``lease_cap``, a total that is not the sum of the loads, a sticky map above
its capacity -- is a violation (:func:`out_of_domain`), never a new state: a broken core
cannot make the search space unbounded.

Fail fast. The first violation stops the search (every caller wants the shortest
counterexample, and a broken core must not be explored further). A crash of ``step`` is
a violation of R-OUT-1 (obligation 11) with the traceback's last line; a crash raised
by a negative control's own code is a :class:`ControlError` (the control is inconclusive).

Clamping. The affinity counters and the lease book's status counters grow forever, yet no
transition reads their values (only increments them), so a state is stored with each
such counter clamped to at most 1 (the lease status counters: 0) -- enough to see a reset
or a decrement, since every check compares a post-state with its stored pre-state. Lease
epochs are renumbered densely in order (the book only compares epochs for equality and
order), and the number of held leases is bounded by ``lease_cap``.

Environment. An :class:`Environment` decides which events are possible and may carry
its own ground truth (outstanding requests), so conservation and lease accounting are
checked against what the callers really have in flight, not against the core's view.

Symmetry. With ``symmetry=True`` a state is stored under the least image of its key over
all renamings of the server universe. Renaming keeps pool *order*, so it commutes with
every rule except those that read server names: the stable hash mode (sorted ids). The
caller only enables it for ``draw`` tie-break configurations (formal-methods.md section 9:
all minima are explored), and ``affinity verify`` cross-checks it: the number of orbits
of the unreduced state space must equal the reduced count.
"""

from __future__ import annotations

import gc
import itertools
import time
import traceback
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Protocol

import attrs
from immutables import Map

from affinity_engine import Config, Event, LeaseBook, State, Transition, initial_state, step
from affinity_engine.values import evolve

__all__ = [
    "BfsResult",
    "Check",
    "ControlError",
    "Edge",
    "Environment",
    "Violation",
    "explore",
    "normalize",
    "out_of_domain",
    "state_key",
]


@attrs.frozen
class Edge:
    config: Config
    pre: State
    event: Event
    transition: Transition | None  # None when step raised
    error: str | None
    label: Hashable  # the environment's name for this move (e.g. a late release)
    pre_env: Hashable
    post_env: Hashable | None


@attrs.frozen
class Check:
    """One property, evaluated on every edge of configurations it applies to."""

    name: str
    obligation: int
    applies: Callable[[Config], bool]
    violation: Callable[[Edge], str | None]  # a message when the property fails
    # A property of the post-state alone: evaluated once per distinct post-state.
    per_state: bool = False
    # Only edges of these event types can violate it (None: every edge).
    events: tuple[type[Any], ...] | None = None


@attrs.frozen
class Violation:
    check: str
    obligation: int
    message: str
    config: Config
    trace: tuple[Event, ...]  # from the initial state; the last event is the bad edge
    labels: tuple[Hashable, ...]  # the environment's label of each trace event


@attrs.frozen
class BfsResult:
    config: Config
    states: int
    edges: int
    seconds: float
    violations: tuple[Violation, ...]
    truncated: bool  # stopped early (first violation or state limit)
    orbits: int | None = None  # distinct states up to server renaming, when counted

    @property
    def states_per_second(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else float(self.states)


class Environment(Protocol):
    """The callers: which events can happen next, and their ground truth."""

    def initial(self, config: Config, state: State) -> Hashable: ...

    def moves(self, config: Config, state: State, env: Hashable
              ) -> Iterable[tuple[Event, Hashable]]:
        """The possible next events, each with a label that :meth:`advance` receives."""
        ...

    def advance(self, config: Config, pre: State, env: Hashable, label: Hashable,
                event: Event, t: Transition) -> Hashable | None:
        """The environment after the event, or None when it leaves the scope."""
        ...

    def rename(self, env: Hashable, mapping: dict[str, str]) -> Hashable: ...


def _clamp(n: int) -> int:
    return n if n < 1 else 1


def _normal_leases(book: LeaseBook) -> LeaseBook:
    if book.next_epoch == 0 and not book.held:
        return _NO_LEASES
    used = sorted({e for held in book.held.values() for e, _ in held} | set(book.epoch.values()))
    dense = {e: i for i, e in enumerate(used)}
    held: Map[tuple[str | None, str], tuple[tuple[int, int], ...]] = Map(
        {k: tuple((dense[e], c) for e, c in v) for k, v in book.held.items()})
    epoch: Map[str, int] = Map({s: dense[e] for s, e in book.epoch.items()})
    # unknown_leases / stale_leases only feed status(): no transition or check reads them.
    return LeaseBook(held, epoch, len(used))


_NO_LEASES = LeaseBook()


def normalize(state: State) -> State:
    """The stored representative: counters clamped, lease epochs renumbered."""
    book = state.leases
    if state.affinity_kept <= 1 and state.affinity_broken <= 1 and not book.epoch \
            and not book.held and book.next_epoch == 0:
        return state
    return evolve(
        state,
        affinity_kept=_clamp(state.affinity_kept),
        affinity_broken=_clamp(state.affinity_broken),
        leases=_normal_leases(state.leases),
    )


def _name(x: str | None) -> str:
    return "" if x is None else x  # sortable: real ids are non-empty


def state_key(state: State, mapping: dict[str, str] | None = None) -> tuple[Any, ...]:
    """A sortable tuple identifying a normalized state, optionally with servers renamed."""
    book = state.leases
    if mapping is None:
        base: tuple[Any, ...] = (state.pool.items(), state.lru.items(), state.affinity_kept,
                                 state.affinity_broken)
        ren: Callable[[str], str] = str
    else:
        ren = mapping.__getitem__
        base = (tuple((ren(s), n) for s, n in state.pool.items()),
                tuple((r, ren(s)) for r, s in state.lru.items()),
                state.affinity_kept, state.affinity_broken)
    if state.external:  # load observed from the backends (R-OBS-1)
        base = (*base, tuple(sorted((ren(s), n) for s, n in state.external.items())))
    if not book.epoch and not book.held:
        return base
    return (
        *base,
        tuple(sorted(((_name(r), ren(s)), v) for (r, s), v in book.held.items())),
        tuple(sorted((ren(s), e) for s, e in book.epoch.items())),
    )


def held_leases(state: State) -> int:
    return sum(c for held in state.leases.held.values() for _, c in held)


# Where a domain violation is reported: counts and totals are conservation (R-CONS-1,
# R-ST-2), the sticky map's size is the cache bound, held leases are lease accounting.
DOMAIN_OBLIGATION = {"count": 9, "cache": 10, "lease": 14}
STEP_TOTAL = "step_total"  # the check name of a crash of step (R-OUT-1)
STEP_TOTAL_OBLIGATION = 11


class ControlError(RuntimeError):
    """A negative control (a mutant of :mod:`.mutants`) crashed in its own code."""


def _raised_by_control(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    # mutants.py and the modules it is split into: mutants_base, _keep, _band, _beyond
    name = frames[-1].filename.replace("\\", "/").rsplit("/", 2)[-2:]
    return name[0] == "affinity_proofs" and name[-1].startswith("mutants")


def out_of_domain(config: Config, state: State, lease_cap: int) -> tuple[str, str] | None:
    """``(kind, message)`` when ``state`` is outside the domain every state must lie in."""
    items = state.pool.items()
    external = state.external
    if external:
        bad = [(s, n) for s, n in external.items() if n <= 0 or s not in state.pool]
        if bad:
            return "count", f"external load stored <= 0 or for an inactive server: {bad}"
        items_f = tuple((s, n - external.get(s, 0)) for s, n in items)
    else:
        items_f = items
    if any(n < 0 for _, n in items_f):
        return "count", f"in-flight count below 0: {[x for x in items_f if x[1] < 0]}"
    total = sum(n for _, n in items)
    if total != state.pool.total:
        return "count", f"pool total {state.pool.total} != sum of loads {total}"
    if len(state.lru) > config.max_cache_size:
        return "cache", f"{len(state.lru)} sticky entries > max_cache_size " \
                        f"{config.max_cache_size}"
    book = state.leases
    entries = [(k, e, c) for k, held in book.held.items() for e, c in held]
    if any(c < 1 for _, _, c in entries):
        return "lease", f"held lease count below 1: {[x for x in entries if x[2] < 1]}"
    if len(entries) > lease_cap + 1:
        return "lease", f"{len(entries)} held-lease entries > the declared bound {lease_cap}"
    if book.unknown_leases < 0 or book.stale_leases < 0:
        return "lease", f"lease counters below 0: unknown {book.unknown_leases}, " \
                        f"stale {book.stale_leases}"
    return None


def explore(
    config: Config,
    servers: Sequence[str],
    initial_pool: Sequence[str],
    env: Environment,
    checks: Sequence[Check],
    *,
    load_cap: int,
    lease_cap: int = 4,
    symmetry: bool = False,
    stop_on_first: bool = True,
    max_states: int = 2_000_000,
    count_orbits: bool = False,
    control_raises_by_design: bool = False,
) -> BfsResult:
    """Breadth-first search from ``initial_state(config, initial_pool)``."""
    start = time.perf_counter()
    active = [c for c in checks if c.applies(config)]
    perms = [dict(zip(servers, p, strict=True)) for p in itertools.permutations(servers)]

    def canonical(state: State, e: Hashable) -> Any:
        return min((state_key(state, m), env.rename(e, m)) for m in perms)

    def key_of(state: State, e: Hashable) -> Any:
        return canonical(state, e) if symmetry else (state_key(state), e)

    root = normalize(initial_state(config, initial_pool))
    root_env = env.initial(config, root)
    root_key = key_of(root, root_env)
    parents: dict[Any, tuple[Any, Event, Hashable] | None] = {root_key: None}
    queue: deque[tuple[Any, State, Hashable]] = deque([(root_key, root, root_env)])
    orbits: set[Any] = {canonical(root, root_env)} if count_orbits else set()
    # The active checks that can see an event of each type, in declaration order.
    by_type: dict[type[Any], tuple[Check, ...]] = {}

    def checks_seeing(event: Event) -> tuple[Check, ...]:
        kind = type(event)
        seen = by_type.get(kind)
        if seen is None:
            seen = by_type[kind] = tuple(c for c in active if c.events is None
                                         or issubclass(kind, c.events))
        return seen

    # The search keeps every stored state alive until it ends and leaves no cyclic
    # garbage (a collection after a run finds none), so the cyclic collector would only
    # rescan the growing heap, over and over: it is paused for the search.
    collecting = gc.isenabled()
    gc.disable()
    try:
        violations, edges, truncated = _search(
            config, env, active, checks_seeing, queue, parents, orbits, canonical, key_of,
            load_cap=load_cap, lease_cap=lease_cap, stop_on_first=stop_on_first,
            max_states=max_states, count_orbits=count_orbits,
            control_raises_by_design=control_raises_by_design)
    finally:
        if collecting:
            gc.enable()
    return BfsResult(config, len(parents), edges, time.perf_counter() - start,
                     tuple(violations), truncated, len(orbits) if count_orbits else None)


def _search(config: Config, env: Environment, active: Sequence[Check],
            checks_seeing: Callable[[Event], tuple[Check, ...]],
            queue: deque[tuple[Any, State, Hashable]],
            parents: dict[Any, tuple[Any, Event, Hashable] | None], orbits: set[Any],
            canonical: Callable[[State, Hashable], Any],
            key_of: Callable[[State, Hashable], Any], *, load_cap: int, lease_cap: int,
            stop_on_first: bool, max_states: int, count_orbits: bool,
            control_raises_by_design: bool) -> tuple[list[Violation], int, bool]:
    """The breadth-first loop of :func:`explore`: (violations, edges, truncated)."""
    violations: list[Violation] = []
    failed: set[str] = set()
    edges = 0
    truncated = False

    def trace_to(key: Any, last: Event, label: Hashable
                 ) -> tuple[tuple[Event, ...], tuple[Hashable, ...]]:
        out = [(last, label)]
        link = parents[key]
        while link is not None:
            key, ev, lab = link
            out.append((ev, lab))
            link = parents[key]
        out.reverse()
        return tuple(e for e, _ in out), tuple(lab for _, lab in out)

    while queue:
        key, pre, pre_env = queue.popleft()
        for event, label in env.moves(config, pre, pre_env):
            edges += 1
            t: Transition | None
            try:
                t = step(config, pre, event)
                error = None
            except Exception as exc:  # a crash is a finding: step must be total (R-OUT-1)
                if not control_raises_by_design and _raised_by_control(exc):
                    # the mutant's own code raised, not the core: the control is broken
                    raise ControlError(f"the negative control raised {exc!r}") from exc
                t, error = None, f"R-OUT-1: step raised {type(exc).__name__}: {exc}"
            domain = None if t is None else out_of_domain(config, t.state, lease_cap)
            if error is not None or domain is not None:
                trace, labels = trace_to(key, event, label)
                if domain is not None:
                    kind, why = domain
                    found = Violation(f"domain_{kind}", DOMAIN_OBLIGATION[kind], why,
                                      config, trace, labels)
                else:
                    found = Violation(STEP_TOTAL, STEP_TOTAL_OBLIGATION, str(error), config,
                                      trace, labels)
                violations.append(found)
                truncated = True
                queue.clear()
                break
            assert t is not None
            post_env = env.advance(config, pre, pre_env, label, event, t)
            edge = Edge(config, pre, event, t, None, label, pre_env, post_env)
            post = None if post_env is None else t.state
            post_key = None
            expand = post is not None and (len(post.pool) == 0 or
                                           post.pool.max_load <= load_cap) and (
                not config.lease_accounting or held_leases(post) <= lease_cap)
            if post is not None and expand:
                post = normalize(post)
                post_key = key_of(post, post_env)
            fresh = post_key is None or post_key not in parents
            for check in checks_seeing(event):
                if (check.per_state and not fresh) or (failed and check.name in failed):
                    continue
                try:
                    message = check.violation(edge)
                except Exception as exc:  # a check that cannot evaluate is a finding too
                    message = f"check raised {type(exc).__name__}: {exc}"
                if message is not None:
                    failed.add(check.name)
                    trace, labels = trace_to(key, event, label)
                    violations.append(Violation(check.name, check.obligation, message,
                                                config, trace, labels))
            if violations and stop_on_first:
                truncated = True
                queue.clear()
                break
            if post is None or post_key is None or not fresh:
                continue
            if len(parents) >= max_states:
                truncated = True
                continue
            parents[post_key] = (key, event, label)
            queue.append((post_key, post, post_env))
            if count_orbits:
                orbits.add(canonical(post, post_env))
    return violations, edges, truncated
