"""The refinement obligation: the engine computes what the reference defines.

Theory of operation
-------------------
``affinity_core`` is the readable reference and ``affinity_engine`` the optimised engine that
adapters run. They share the configuration, event and outcome values, and the engine has
one abstraction function, :func:`affinity_engine.abstraction.to_reference`, from its own
state representation to the reference state. The engine *refines* the reference when, for
every state pair related by the abstraction and every event, the two ``step`` results agree:

* the outcomes are equal (``==``; they are the same classes);
* ``to_reference`` of the engine's successor equals the reference's successor;
* the status views are equal, and for an acquire so are the ``allowed`` sets.

:func:`compare` checks one such edge. The traces it is applied to (:func:`wide_traces`):

* derandomised traces over pools of 1 to 2,000 servers (single-leaf, multi-leaf and
  multi-level load tables), sticky maps of capacity 1, 32, 33, 1,024 and 1,025, request
  hashes that are negative or beyond 2**64, observed loads, lease accounting, the gate,
  the context band and both deterministic hash modes;
* grouped acquires (:func:`_group_configs`): group stickiness ``fallback`` and ``only``,
  group maps of capacity 1, 32 and 33, ``group_break_margin`` unset and set, the
  ``hashed`` tie-break (which hashes the group id), ``full_determinism`` in both hash
  modes, and group pins left on removed servers and cleared by ``clear_sticky_cache``;
* prefix-aware placement (:func:`_prefix_configs`): ``placement_margin`` 0, 1 and 3
  with the margin, the gate, the legacy policy, group pins and every tie-break, and
  ``full_determinism`` (where it is ignored), on acquires whose ``cached_prefix`` names
  active, removed and unknown servers with few distinct token counts (so the load and
  configured tie-breaks among the best cached are exercised);
* old states branched from: the trace keeps earlier engine states and steps them again,
  which is the persistence contract of the engine's shared-log sticky map;
* the runtime's hot paths (:mod:`affinity_engine.cursor`): each trace is stepped through
  a ``Cursor``, and every seventh step also checks the cursor's keyed acquire and cached
  release and the ``KeyedBalancer`` (verl's two calls) against ``step`` of the event they
  stand for (:func:`keyed_paths_agree`);
* every shipped conformance vector (:func:`vector_traces`);
* the engine's fast event builders (:mod:`affinity_engine.builders`), on a grid of good
  and bad fields: each builds an equal event of the same class, or raises the
  reference's own error (:func:`builders_agree`);
* and, in ``affinity verify``'s model checker, every edge of the small scopes (the
  ``engine refines reference`` check of :mod:`.bfs_checks`).

Each run also applies the engine mutants of :data:`ENGINE_MUTANTS` and requires the same
comparison to refute every one of them.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from fractions import Fraction
from typing import Any

import attrs

import affinity_core
import affinity_engine
from affinity_core import (
    Acquire,
    AddServers,
    ClearStickyCache,
    Config,
    DualThreshold,
    Event,
    ObserveLoads,
    Release,
    RemoveServers,
)
from affinity_engine.abstraction import to_reference
from affinity_engine.cursor import Cursor, KeyedBalancer

__all__ = ["ENGINE_MUTANTS", "EngineMutant", "builders_agree", "compare",
           "keyed_paths_agree", "refinement_run", "run_trace", "vector_traces", "wide_traces"]

cursor_mod = importlib.import_module("affinity_engine.cursor")
loads_mod = importlib.import_module("affinity_engine.loads")
lru_mod = importlib.import_module("affinity_engine.lru")
machine_mod = importlib.import_module("affinity_engine.machine")

Trace = tuple[Config, tuple[str, ...], tuple[Event, ...]]


EngineStep = Callable[[Event], tuple[affinity_engine.Outcome, affinity_engine.State]]


def compare(config: Config, engine_state: affinity_engine.State,
            reference_state: affinity_core.State, event: Event,
            engine_step: EngineStep | None = None,
            ) -> tuple[str | None, affinity_engine.State, affinity_core.State]:
    """One edge: a description of the first disagreement (or None) and both successors.
    ``engine_step`` steps the engine from ``engine_state`` (default: ``step``; the trace
    runner passes a :class:`~affinity_engine.cursor.Cursor` holding that state)."""
    if isinstance(event, Acquire):
        engine_allowed = affinity_engine.allowed(config, engine_state, event)
        reference_allowed = affinity_core.allowed(config, reference_state, event)
        if engine_allowed != reference_allowed:
            return (f"allowed: engine {sorted(engine_allowed)}, reference "
                    f"{sorted(reference_allowed)}"), engine_state, reference_state
    if engine_step is None:
        engine = affinity_engine.step(config, engine_state, event)
    else:
        outcome, successor = engine_step(event)
        engine = affinity_engine.Transition(successor, outcome)
    reference = affinity_core.step(config, reference_state, event)
    if engine.outcome != reference.outcome:
        return (f"outcome: engine {engine.outcome!r}, reference {reference.outcome!r}",
                engine.state, reference.state)
    abstracted = to_reference(engine.state)
    if abstracted != reference.state:
        return (f"state: engine {_difference(abstracted, reference.state)}",
                engine.state, reference.state)
    if affinity_engine.status(config, engine.state) != affinity_core.status(
            config, reference.state):
        return "status view differs", engine.state, reference.state
    return None, engine.state, reference.state


def _difference(got: affinity_core.State, want: affinity_core.State) -> str:
    for field in attrs.fields(affinity_core.State):
        mine, theirs = getattr(got, field.name), getattr(want, field.name)
        if mine != theirs:
            return f"{field.name} = {_short(mine)}, reference {_short(theirs)}"
    return "differs"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 240 else text[:240] + "..."


# ----------------------------------------------------------------------- the traces
def _configs(cache: int) -> list[Config]:
    return [
        Config(max_cache_size=cache),
        Config(affinity_break_margin=0, max_cache_size=cache, tie_break="hashed"),
        Config(affinity_break_margin=2, max_cache_size=cache, tie_break="draw"),
        Config(affinity_break_margin=1, affinity_break_tokens=64, affinity_break_band_cap=3,
               max_cache_size=cache, tie_break="draw"),
        Config(dual_threshold=DualThreshold(2, Fraction(3, 2)), max_cache_size=cache),
        Config(affinity_break_margin=1, lease_accounting=True, max_cache_size=cache,
               tie_break="draw"),
        Config(full_determinism=True, max_cache_size=cache),
        Config(full_determinism=True, hash_mode="stable", max_cache_size=cache),
    ]


def _group_configs(cache: int, group_cache: int) -> list[Config]:
    common: dict[str, Any] = {"max_cache_size": cache, "max_group_cache_size": group_cache}
    return [
        Config(group_stickiness="fallback", **common),
        Config(group_stickiness="fallback", affinity_break_margin=0, tie_break="hashed",
               **common),
        Config(group_stickiness="fallback", affinity_break_margin=2, group_break_margin=0,
               tie_break="draw", **common),
        Config(group_stickiness="fallback", affinity_break_margin=1, affinity_break_tokens=64,
               affinity_break_band_cap=3, group_break_margin=1, lease_accounting=True,
               tie_break="draw", **common),
        Config(group_stickiness="fallback", dual_threshold=DualThreshold(2, Fraction(3, 2)),
               **common),
        Config(group_stickiness="only", **common),
        Config(group_stickiness="only", affinity_break_margin=0, tie_break="hashed", **common),
        Config(group_stickiness="only", affinity_break_margin=1, group_break_margin=2,
               tie_break="draw", **common),
        Config(group_stickiness="fallback", full_determinism=True, group_break_margin=0,
               hash_mode="stable", **common),
        Config(group_stickiness="fallback", full_determinism=True, **common),
        Config(group_stickiness="only", full_determinism=True, hash_mode="stable", **common),
        Config(group_stickiness="only", full_determinism=True, **common),
    ]


def _prefix_configs(cache: int) -> list[Config]:
    common: dict[str, Any] = {"max_cache_size": cache}
    return [
        Config(placement_margin=0, affinity_break_margin=1, tie_break="draw", **common),
        Config(placement_margin=1, affinity_break_margin=0, tie_break="hashed", **common),
        Config(placement_margin=3, affinity_break_margin=1, **common),
        Config(placement_margin=2, **common),
        Config(placement_margin=2, dual_threshold=DualThreshold(2, Fraction(3, 2)),
               tie_break="draw", **common),
        Config(placement_margin=2, affinity_break_margin=1, group_stickiness="fallback",
               group_break_margin=0, tie_break="hashed", **common),
        Config(placement_margin=1, affinity_break_margin=2, lease_accounting=True,
               tie_break="draw", **common),
        Config(placement_margin=2, full_determinism=True, hash_mode="stable", **common),
    ]


_HASHES = (0, 1, -1, 7, -(2**70), 2**70 + 3, 2**63 - 1, -(2**63))
_CACHED = (0, 0, 16, 16, 48, 10**12)  # few distinct values, so equal estimates are common


def _estimate(rng: random.Random, config: Config, servers: tuple[str, ...],
              spare: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """A ``cached_prefix`` over a sample of the servers (and sometimes a spare one)."""
    if config.placement_margin is None or rng.random() < 0.1:
        return ()
    named = rng.sample(servers, min(len(servers), rng.randrange(1, 9)))
    if rng.random() < 0.2:
        named.append(rng.choice(spare))
    return tuple((server, rng.choice(_CACHED)) for server in dict.fromkeys(named))


def _trace(rng: random.Random, config: Config, n: int, length: int) -> Trace:
    servers = tuple(f"s{i}" for i in range(n))
    spare = tuple(f"x{i}" for i in range(4))
    keys = max(2, config.max_cache_size * 3 // 2 + 2)  # more ids than the map holds
    group_keys = max(2, config.max_group_cache_size * 3 // 2 + 2)  # ... and more groups
    events: list[Event] = []
    for _ in range(length):
        roll = rng.random()
        if roll < 0.55:
            rid = None if rng.random() < 0.05 else f"r{rng.randrange(keys)}"
            group = (f"g{rng.randrange(group_keys)}"
                     if config.groups and rng.random() < 0.8 else None)
            events.append(Acquire(request_id=rid, tie_draw=rng.randrange(2**31),
                                  request_hash=rng.choice(_HASHES) if rng.random() < 0.5
                                  else rng.randrange(-(2**40), 2**40),
                                  context_tokens=rng.choice((None, 0, 63, 64, 200, 10**9)),
                                  group_id=group,
                                  cached_prefix=_estimate(rng, config, servers, spare)))
        elif roll < 0.85:
            rid = f"r{rng.randrange(keys)}" if rng.random() < 0.5 else None
            events.append(Release(server_id=rng.choice(servers + spare), request_id=rid))
        elif roll < 0.90:
            events.append(ObserveLoads(observed=[(rng.choice(servers + spare),
                                                  rng.randrange(0, 6))]))
        elif roll < 0.94:
            events.append(RemoveServers(server_ids=[rng.choice(servers + spare)]))
        elif roll < 0.98:
            events.append(AddServers(server_ids=[rng.choice(servers + spare)]))
        else:
            events.append(ClearStickyCache())
    return config, servers, tuple(events)


FAMILIES = ("plain", "group", "prefix")


def wide_traces(seed: int, steps: int, families: tuple[str, ...] = FAMILIES) -> list[Trace]:
    """The derandomised wide traces (see the module docstring), about ``steps`` events each,
    of the given families (plain, grouped, prefix-aware); each family draws from its own
    stream, so selecting families changes no trace."""
    traces: list[Trace] = []
    if "plain" in families:
        traces += _plain_traces(random.Random(seed), steps)
    if "group" in families:
        traces += _group_traces(random.Random(seed + 1), steps)
    if "prefix" in families:
        traces += _prefix_traces(random.Random(seed + 2), steps)
    return traces


def _length(n: int, steps: int) -> int:
    return steps if n <= 64 else max(40, steps // 8)


def _plain_traces(rng: random.Random, steps: int) -> list[Trace]:
    traces: list[Trace] = []
    shapes = ((1, 1), (2, 32), (31, 33), (32, 1024), (33, 1025), (1024, 33), (1025, 32),
              (2000, 1025))
    for n, cache in shapes:
        for config in _configs(cache):
            traces.append(_trace(rng, config, n, _length(n, steps)))
    return traces


def _group_traces(rng: random.Random, steps: int) -> list[Trace]:
    return [_trace(rng, config, n, _length(n, steps))
            for n, cache, group_cache in ((1, 1, 1), (3, 33, 32), (5, 32, 33), (31, 1, 33),
                                          (33, 1025, 1), (1025, 32, 32))
            for config in _group_configs(cache, group_cache)]


def _prefix_traces(rng: random.Random, steps: int) -> list[Trace]:
    return [_trace(rng, config, n, _length(n, steps))
            for n, cache in ((1, 1), (3, 2), (6, 33), (33, 32), (1025, 1025))
            for config in _prefix_configs(cache)]


def vector_traces() -> list[tuple[Config, affinity_engine.State, tuple[Event, ...]]]:
    """The configuration, initial state and events of every shipped vector that has them."""
    from affinity_conformance.shipped import shipped_vectors
    from affinity_conformance.vector_format import EventStep, load_case, vector_files

    out = []
    for path in vector_files(shipped_vectors()):
        case = load_case(path)
        if not case.valid or case.config is None or case.initial_state is None:
            continue
        events = tuple(s.event for s in case.steps
                       if isinstance(s, EventStep) and s.event is not None)
        out.append((case.config, case.initial_state, events))
    return out


def run_trace(config: Config, start: affinity_engine.State, events: tuple[Event, ...],
              branch_every: int = 7) -> str | None:
    """Step both packages along ``events``, the engine through a
    :class:`~affinity_engine.cursor.Cursor` (a release without a request id through its
    cached :meth:`~affinity_engine.cursor.Cursor.release`). Every ``branch_every`` steps,
    also step an earlier engine state again (persistence), and check the cursor's keyed
    operations and :class:`~affinity_engine.cursor.KeyedBalancer` against ``step`` on
    the current state (:func:`keyed_paths_agree`). The first disagreement, or None."""
    cursor = Cursor(config, start)
    engine_state, reference_state = start, to_reference(start)
    history: list[tuple[affinity_engine.State, affinity_core.State]] = []

    def through_cursor(event: Event) -> tuple[affinity_engine.Outcome, affinity_engine.State]:
        if (isinstance(event, Release) and event.request_id is None
                and type(event.server_id) is str):
            return cursor.release(event.server_id), cursor.state
        return cursor.apply(event), cursor.state

    for index, event in enumerate(events):
        history.append((engine_state, reference_state))
        if index % branch_every == 3:
            problem = keyed_paths_agree(config, engine_state, event, face=index % 2 == 0)
            if problem is not None:
                return f"step {index}, keyed path of {event!r}: {problem}"
        problem, engine_state, reference_state = compare(config, engine_state,
                                                         reference_state, event,
                                                         through_cursor)
        if problem is not None:
            return f"step {index} {event!r}: {problem}"
        if index % branch_every == branch_every - 1:
            old_engine, old_reference = history[(index * 5) % len(history)]
            problem, _, _ = compare(config, old_engine, old_reference, event)
            if problem is not None:
                return f"step {index}, branched from an old state, {event!r}: {problem}"
    return None


def keyed_paths_agree(config: Config, state: affinity_engine.State, event: Event,
                      face: bool) -> str | None:
    """The hot paths of :mod:`affinity_engine.cursor` from ``state``, for the id of an
    ``Acquire`` or the fields of a ``Release`` in ``event`` (other events: nothing to
    check), against ``step`` of the event they stand for: equal outcomes (a
    :class:`~affinity_engine.cursor.KeyedBalancer` returns ``(server, handle)`` or hands
    the outcome to ``refused``) and equal successor states. ``face`` picks the balancer
    over the bare cursor."""
    cursor = Cursor(config, state)
    handles = {server: ("handle", server) for server in state.pool.servers}
    refused: list[affinity_engine.Outcome] = []
    balancer = KeyedBalancer(cursor, handles, lambda _rid, outcome: refused.append(outcome))
    if isinstance(event, Acquire) and isinstance(event.request_id, str):
        rid = event.request_id
        want = affinity_engine.step(config, state, affinity_engine.acquire_event(rid))
        if face:
            pair = balancer.acquire_server(rid)
            served = want.outcome
            if isinstance(served, affinity_engine.Acquired):
                expected: object = (served.server_id, ("handle", served.server_id))
                if pair != expected or refused:
                    return f"acquire_server({rid!r}) = {pair!r}, step gives {served!r}"
            elif refused != [served]:
                return f"acquire_server({rid!r}) refused {refused!r}, step gives {served!r}"
        else:
            got = cursor.acquire_keyed(rid)
            if got != want.outcome:
                return f"acquire_keyed({rid!r}) = {got!r}, step gives {want.outcome!r}"
    elif isinstance(event, Release):
        server, request = event.server_id, event.request_id
        want = affinity_engine.step(config, state,
                                    affinity_engine.release_event(server, request))
        if face:
            balancer.release_server(server, request)
        elif request is None:
            got = cursor.release(server)
            if got != want.outcome:
                return f"release({server!r}) = {got!r}, step gives {want.outcome!r}"
        else:
            return None
    else:
        return None
    if cursor.state != want.state:
        return f"successor: {_short(cursor.state)}, step gives {_short(want.state)}"
    return None


class _Text(str):
    """A str subclass: the reference accepts it as an id, the fast path must not."""


_IDS: tuple[object, ...] = (None, "r", "r-\u00e9", "", "\ud800", 3, b"r", True, _Text("r"))
_COUNTS: tuple[object, ...] = (None, 0, 7, 2**70, -1, True, 1.0, "1")


def _built(build: Callable[..., Any], *args: object) -> tuple[str, Any]:
    try:
        event = build(*args)
    except affinity_core.EventError as error:
        return "error", str(error)
    return "event", (event, type(event), tuple(type(v) for v in attrs.astuple(event)))


def builders_agree() -> tuple[int, str | None]:
    """The engine's ``acquire_event``/``release_event`` against the reference constructors
    on every combination of the grid's fields: the same error message, or an equal event
    of the same class whose fields have the same types. Returns (cases, first failure)."""
    builders = importlib.import_module("affinity_engine.builders")
    cases = 0
    for request_id in _IDS:
        for tie_draw in _COUNTS:
            for request_hash in _COUNTS:
                for context in _COUNTS:
                    args = (request_id, tie_draw, request_hash, context)
                    cases += 1
                    want = _built(affinity_core.acquire_event, *args)
                    got = _built(builders.acquire_event, *args)
                    if got != want:
                        return cases, f"acquire_event{args!r}: engine {got!r}, reference {want!r}"
        for server_id in _IDS:
            cases += 1
            want = _built(affinity_core.release_event, server_id, request_id)
            got = _built(builders.release_event, server_id, request_id)
            if got != want:
                return cases, (f"release_event({server_id!r}, {request_id!r}): engine {got!r}, "
                               f"reference {want!r}")
    for cached in ((), (("s0", 1),), (("s0", -1),), (("", 1),), "s0", (("s0", 1), ("s0", 2)),
                   {"s0": 3}, [["s0", True]]):  # the estimate, with the other fields good
        estimated = ("r", 0, None, None, None, cached)
        cases += 1
        want = _built(affinity_core.acquire_event, *estimated)
        got = _built(builders.acquire_event, *estimated)
        if got != want:
            return cases, f"acquire_event{estimated!r}: engine {got!r}, reference {want!r}"
    for group_id in _IDS:  # the group id, with the other fields good
        grouped = ("r", 0, None, None, group_id)
        cases += 1
        want = _built(affinity_core.acquire_event, *grouped)
        got = _built(builders.acquire_event, *grouped)
        if got != want:
            return cases, f"acquire_event{grouped!r}: engine {got!r}, reference {want!r}"
    return cases, None


@attrs.frozen
class RefinementResult:
    traces: int
    steps: int
    failure: str | None


def refinement_run(seed: int, steps: int, with_vectors: bool = True,
                   stop_first: bool = False,
                   families: tuple[str, ...] = FAMILIES) -> RefinementResult:
    cases, failure = builders_agree()
    if failure is not None:
        return RefinementResult(0, cases, f"event builders: {failure}")
    traces = 0
    total = 0
    runs: list[tuple[Config, affinity_engine.State, tuple[Event, ...]]] = [
        (config, affinity_engine.initial_state(config, servers), events)
        for config, servers, events in wide_traces(seed, steps, families)]
    if with_vectors:
        runs += vector_traces()
    for config, start, events in runs:
        traces += 1
        total += len(events)
        failure = run_trace(config, start, events)
        if failure is not None:
            return RefinementResult(traces, total, f"{config!r}: {failure}")
    return RefinementResult(traces, total, None)


# -------------------------------------------------------------------- engine mutants
@attrs.frozen
class EngineMutant:
    name: str
    description: str
    patch: Callable[[], AbstractContextManager[None]]
    # The trace families its refutation runs (all by default): a mutant of one extension's
    # code need not replay the others' traces first, a cost and not a weaker check, since
    # the unmutated run covers every family.
    families: tuple[str, ...] = FAMILIES


@contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


def _ties_in_first_child() -> AbstractContextManager[None]:
    original = loads_mod._summarise

    def summarise(children: Any, mins: Any, counts: Any, maxes: Any) -> Any:
        node = original(children, mins, counts, maxes)
        if len(mins) > 1 and mins.count(node[0]) > 1:  # ties spread over several children
            return (node[0], counts[mins.index(node[0])], *node[2:])
        return node

    return _patched(loads_mod, "_summarise", summarise)


def _compaction_drops_oldest_live() -> AbstractContextManager[None]:
    original = lru_mod._settled

    def settled(capacity: int, size: int, lo: int, hi: int, store: Any) -> Any:
        if hi > 2 * size + 32 and size > 1:
            index = store.index
            live = [c for c in store.log[lo:hi] if index.get(c[0]) is c]
            index.pop(live[0][0], None)
            return lru_mod.StickyLru(capacity, size - 1, 0, len(live) - 1,
                                     lru_mod._Store(live[1:], index))
        return original(capacity, size, lo, hi, store)

    return _patched(lru_mod, "_settled", settled)


def _old_version_keeps_evicted() -> AbstractContextManager[None]:
    def own(self: Any) -> Any:
        log = self.store.log[:self.hi]
        index: dict[str, Any] = {}
        for cell in log:  # from the log's start, not the window's: evicted records revive
            request_id, server = cell
            if server is None:
                index.pop(request_id, None)
            else:
                index[request_id] = cell
        store = lru_mod._Store(log, index)
        object.__setattr__(self, "store", store)
        return store

    return _patched(lru_mod.StickyLru, "_own", own)


def _owned_table(undo_in: Callable[[list[Any]], Any]) -> AbstractContextManager[None]:
    """A flat load table's ``_own`` that undoes its records in the order ``undo_in`` gives."""
    def own(self: Any) -> Any:
        store = self.flat
        loads = list(store.loads)
        for _, position, old in undo_in(store.undo[self.version - store.base:]):
            loads[position] = old
        mine = loads_mod._Flat(loads, self.version)
        object.__setattr__(self, "flat", mine)
        return mine

    return _patched(loads_mod.LoadTable, "_own", own)


def _old_table_reads_newest() -> AbstractContextManager[None]:
    return _owned_table(lambda records: [])  # nothing undone: the newest loads


def _old_table_undoes_oldest_first() -> AbstractContextManager[None]:
    return _owned_table(list)  # a position written twice keeps its middle value


def _cursor_release_keeps_state() -> AbstractContextManager[None]:
    def release(self: Any, server_id: str) -> Any:
        return machine_mod.step(self.config, self.state, self.release_of(server_id)).outcome

    return _patched(cursor_mod.Cursor, "release", release)


def _cursor_keyed_draws_one() -> AbstractContextManager[None]:
    def acquire_keyed(self: Any, request_id: str) -> Any:
        return self.apply(affinity_engine.acquire_event(request_id, 1))

    return _patched(cursor_mod.Cursor, "acquire_keyed", acquire_keyed)


def _keyed_acquire_hands_no_handle() -> AbstractContextManager[None]:
    original = cursor_mod.KeyedBalancer.acquire_server

    def acquire_server(self: Any, request_id: str, *args: Any, **extra: Any) -> Any:
        server_id, _ = original(self, request_id, *args, **extra)
        return server_id, None

    return _patched(cursor_mod.KeyedBalancer, "acquire_server", acquire_server)


def _max_of_first_child() -> AbstractContextManager[None]:
    original = loads_mod._summarise

    def summarise(children: Any, mins: Any, counts: Any, maxes: Any) -> Any:
        node = original(children, mins, counts, maxes)
        return (*node[:2], maxes[0], *node[3:])

    return _patched(loads_mod, "_summarise", summarise)


def _builder_accepts_empty_id() -> AbstractContextManager[None]:
    builders = importlib.import_module("affinity_engine.builders")
    original = builders.acquire_event

    def acquire_event(request_id: object, tie_draw: object = 0, request_hash: object = None,
                      context_tokens: object = None) -> Any:
        if request_id != "":
            return original(request_id, tie_draw, request_hash, context_tokens)
        event = original("r", tie_draw, request_hash, context_tokens)
        object.__setattr__(event, "request_id", "")  # the fast path's id check forgotten
        return event

    return _patched(builders, "acquire_event", acquire_event)


@contextmanager
def _rule_changed(lookup_name: str, **changes: Any) -> Iterator[None]:
    """One row of the engine's acquire table changed (the table's binding is Final, its
    entries are not)."""
    from affinity_engine.values import evolve

    table = machine_mod.ACQUIRE_RULES
    lookup = machine_mod.Lookup[lookup_name]
    original = table[lookup]
    table[lookup] = evolve(original, **changes)
    try:
        yield
    finally:
        table[lookup] = original


def _group_hit_keeps_recency() -> AbstractContextManager[None]:
    return _rule_changed("GROUP_KEEP", group_recency=machine_mod.Recency.NONE)


def _group_eviction_unreported() -> AbstractContextManager[None]:
    return _rule_changed("GROUP_MISS", reports_group_eviction=False)


def _prefix_ignores_load() -> AbstractContextManager[None]:
    """Among the best-cached admissible servers, every one is a candidate (the load
    tie-break of R-PFX-3 forgotten)."""
    policy = importlib.import_module("affinity_engine.policy")

    def candidates(config: Config, pool: Any, event: Acquire, moving_from: str | None
                   ) -> list[str]:
        margin = config.placement_margin
        assert margin is not None
        estimate = dict(event.cached_prefix)
        admissible = [s for s, load in pool.items()
                      if load <= pool.min_load + margin and s != moving_from]
        most = max(estimate.get(s, 0) for s in admissible)
        return [s for s in admissible if estimate.get(s, 0) == most]

    return _patched(policy, "prefix_candidates", candidates)


def _prefix_repins_onto_pin() -> AbstractContextManager[None]:
    """A broken pin stays admissible (the exclusion of R-PFX-2 forgotten)."""
    original = machine_mod.prefix_placed

    def placed(config: Config, pool: Any, event: Acquire, moving_from: str | None,
               key: str | None) -> str:
        return str(original(config, pool, event, None, key))

    return _patched(machine_mod, "prefix_placed", placed)


def _only_writes_request_pin() -> AbstractContextManager[None]:
    def writes_own_pin(config: Config, rule: Any) -> bool:
        return bool(rule.write_pin)

    return _patched(machine_mod, "writes_own_pin", writes_own_pin)


ENGINE_MUTANTS = (
    EngineMutant("engine_tie_count_first_child",
                 "load table: an internal node counts only its first child's ties",
                 _ties_in_first_child),
    EngineMutant("engine_compaction_drops_live",
                 "sticky log: compaction drops the least recent live record",
                 _compaction_drops_oldest_live),
    EngineMutant("engine_old_version_keeps_evicted",
                 "sticky log: an old version re-derived from its log revives evicted keys",
                 _old_version_keeps_evicted),
    EngineMutant("engine_old_table_reads_newest",
                 "load table: an old flat version reads the newest loads (nothing undone)",
                 _old_table_reads_newest),
    EngineMutant("engine_old_table_undoes_oldest_first",
                 "load table: an old flat version undoes its writes oldest first",
                 _old_table_undoes_oldest_first),
    EngineMutant("engine_cursor_release_keeps_state",
                 "cursor: a cached release returns its outcome but keeps the old state",
                 _cursor_release_keeps_state, ("plain",)),
    EngineMutant("engine_cursor_keyed_draws_one",
                 "cursor: a keyed acquire's event carries a tie draw of 1, not 0",
                 _cursor_keyed_draws_one, ("plain",)),
    EngineMutant("engine_keyed_acquire_hands_no_handle",
                 "keyed balancer: acquire_server returns the server without its handle",
                 _keyed_acquire_hands_no_handle, ("plain",)),
    EngineMutant("engine_max_of_first_child",
                 "load table: an internal node's maximum is its first child's",
                 _max_of_first_child),
    EngineMutant("engine_builder_accepts_empty_id",
                 "event builders: the fast path builds an Acquire with an empty request id",
                 _builder_accepts_empty_id),
    EngineMutant("engine_group_hit_keeps_recency",
                 "group pins: a kept group hit does not refresh the group entry's recency",
                 _group_hit_keeps_recency, ("group",)),
    EngineMutant("engine_group_eviction_unreported",
                 "group pins: a group miss that evicts a group does not report it",
                 _group_eviction_unreported, ("group",)),
    EngineMutant("engine_prefix_ignores_load",
                 "prefix placement: the lower load among the best cached is not preferred",
                 _prefix_ignores_load, ("prefix",)),
    EngineMutant("engine_prefix_repins_onto_pin",
                 "prefix placement: a broken pin is admissible for its own re-pin",
                 _prefix_repins_onto_pin, ("prefix",)),
    EngineMutant("engine_only_writes_request_pin",
                 "group pins: 'only' writes the grouped acquire's own sticky entry",
                 _only_writes_request_pin, ("group",)),
)
