"""Run black-box traces against a router and judge them against the reference core.

Theory of operation
-------------------
:func:`run_trace` plays one trace (:mod:`.trace`) against a fresh router in front of the
recording fleet and keeps the reference core in step, in refinement mode:

* **acquire**: send the request, wait for its arrival at some backend; that backend is
  the router's choice ``c``. The spec's allowed set ``allowed(S, e)`` (R-REL-1) must
  contain ``c``; then the core steps with the choice fixed to ``c`` (``draw_for``,
  R-REL-2). A choice outside the set, or a request that never reaches a backend, is a
  divergence at this step;
* **release**: complete the held request (ok or fail), wait for the client's response to
  end, *settle* (:class:`~.target.Target`), then step the core with ``Release``;
* **remove / add**: change the pool through the router's admin API, then step
  ``RemoveServers`` / ``AddServers``.

A divergence is explained from the spec's view of the pre-state
(:func:`affinity_conformance.diagnosis.explain_acquire`), plus *load views*: the loads
that the router would have seen under common accounting mistakes (streams finished at
their first chunk; failed requests never released; load = sessions placed, as
vllm-router's sticky_least_loaded; requests ever routed). Each view under which the
router's choice is a least-loaded server is listed, so a maintainer sees which counter to
look at.

:func:`shrink_ops` minimises a failing trace by delta debugging (as ``affinity check``),
re-running each candidate against a fresh router; the minimal trace is re-run once more
and written as a vector file whose expectations come from the core.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import aiohttp
import attrs

from affinity_conformance.diagnosis import explain_acquire
from affinity_conformance.scenario import Scenario
from affinity_conformance.vector_format import case_text, seal
from affinity_core import (
    Acquire,
    Acquired,
    AddServers,
    Config,
    Event,
    Lookup,
    Release,
    RemoveServers,
    State,
    allowed,
    classify,
    draw_for,
    initial_state,
    step,
)

from .claims import Claim
from .fleet import MODEL, RecordingFleet, correlation_prompt
from .target import SettlePlan, Target
from .trace import Op, describe, server_ids

__all__ = ["RunResult", "StepDivergence", "load_views", "run_trace", "shrink_ops",
           "write_vector"]

ARRIVAL_TIMEOUT = 5.0
RESPONSE_TIMEOUT = 10.0


@attrs.frozen
class StepDivergence:
    index: int                      # position of the op in the trace
    op: str                         # the op in words
    words: str
    requirements: tuple[str, ...]
    loads: dict[str, int]           # the spec's loads before the step
    views: tuple[str, ...]          # load views under which the router's choice is minimal
    context: tuple[str, ...]


@attrs.define
class RunResult:
    divergence: StepDivergence | None
    events: list[Event] = attrs.field(factory=list)
    retries: int = 0                # extra arrivals of completed requests (router retries)
    skipped: int = 0                # ops that did not apply (shrunk away, pool guard)
    ties: list[tuple[int, int]] = attrs.field(factory=list)  # (position chosen, tie size)


@attrs.define
class _Placed:
    cid: str
    server: str
    session: str
    stream: bool
    task: asyncio.Task[str]
    released: bool = False
    failed: bool = False


async def _send(http: aiohttp.ClientSession, url: str, header: str, session: str,
                cid: str, stream: bool) -> str:
    body = {"model": MODEL, "prompt": correlation_prompt(cid), "max_tokens": 1,
            "stream": stream}
    try:
        async with http.post(url + "/v1/completions", json=body, headers={header: session},
                             timeout=aiohttp.ClientTimeout(total=None)) as resp:
            await resp.read()
            return f"HTTP {resp.status}"
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return f"{type(exc).__name__}"


def load_views(state: State, placed: Sequence[_Placed], routed: dict[str, int]
               ) -> dict[str, dict[str, int]]:
    """The loads the router would see under each accounting (see the module docstring)."""
    active = [s for s, _ in state.pool.items()]
    spec = {s: state.pool.load(s) for s in active}
    live = [p for p in placed if p.server in spec]
    streams = {s: spec[s] - sum(1 for p in live if p.server == s and p.stream
                                and not p.released) for s in active}
    failed = {s: spec[s] + sum(1 for p in live if p.server == s and p.failed) for s in active}
    pins: dict[str, str] = {}
    for p in placed:
        pins[p.session] = p.server
    sessions = {s: sum(1 for v in pins.values() if v == s) for s in active}
    return {"in-flight requests (the spec)": spec,
            "streams counted finished at their first chunk": streams,
            "failed requests never released": failed,
            "sessions placed per backend (sticky_least_loaded's load)": sessions,
            "requests ever routed": {s: routed.get(s, 0) for s in active}}


def _minimal_views(views: dict[str, dict[str, int]], chosen: str) -> tuple[str, ...]:
    return tuple(name for name, loads in views.items()
                 if loads and chosen in loads and loads[chosen] == min(loads.values()))


async def run_trace(target: Target, fleet: RecordingFleet, http: aiohttp.ClientSession,
                    ops: Sequence[Op], claim: Claim, plan: SettlePlan) -> RunResult:
    """One trace against a fresh router (see the module docstring)."""
    await target.fresh(http)
    fleet.forget()
    config = claim.config
    names = server_ids(fleet.size)
    state = initial_state(config, names)
    result = RunResult(None)
    placed: dict[int, _Placed] = {}
    routed: dict[str, int] = {}
    learned: dict[tuple[str, tuple[str, ...]], str] = {}
    evicted: dict[str, tuple[int, str]] = {}  # request id -> (step, server it was pinned to)
    done: list[str] = []
    header = target.preset.session_header
    try:
        for index, op in enumerate(ops):
            words = describe(op)
            if op.kind == "acquire":
                assert op.session is not None
                cid = f"{target.namespace}{index}-{op.ident}"
                key = target.namespace + op.session
                task = asyncio.create_task(_send(http, target.url, header, key, cid, op.stream))
                arrival = await fleet.wait_arrival(cid, ARRIVAL_TIMEOUT * plan.factor)
                pool = tuple(s for s, _ in state.pool.items())
                event = Acquire(request_id=op.session)
                if claim.deterministic and pool:
                    pick = learned.get((op.session, pool))
                    if pick is None and arrival is not None:
                        pick = learned.setdefault((op.session, pool), names[arrival.backend])
                    event = Acquire(request_id=op.session,
                                    request_hash=pool.index(pick) if pick in pool else 0)
                permitted = allowed(config, state, event)
                if arrival is None:
                    outcome = await _soon(task)
                    result.divergence = _diverge(
                        index, words, done, state, f"the router did not forward the request "
                        f"to any backend within {ARRIVAL_TIMEOUT * plan.factor:g} s (client "
                        f"got {outcome}); the spec routes it to one of {sorted(permitted)}",
                        ["R-ACQ-4", "R-POOL-4"], ())
                    result.events.append(event)
                    return result
                chosen = names[arrival.backend]
                if chosen not in permitted:
                    text, reqs, views = _explain(
                        config, state, event, chosen, pool, permitted,
                        load_views(state, list(placed.values()), routed),
                        {s: sum(1 for p in placed.values() if p.server == s and p.failed)
                         for s in names}, evicted,
                        [d for d in done if d.startswith(("add(", "remove("))])
                    result.divergence = _diverge(index, words, done, state, text, reqs, views)
                    result.events.append(event)
                    return result
                if len(permitted) > 1:  # a tie: which of the tied backends did it take?
                    ordered_ties = [s for s in pool if s in permitted]
                    result.ties.append((ordered_ties.index(chosen), len(ordered_ties)))
                fed = draw_for(config, state, event, chosen)
                assert fed is not None
                transition = step(config, state, fed)
                if isinstance(transition.outcome, Acquired) and transition.outcome.evicted:
                    gone = transition.outcome.evicted
                    old = state.lru.peek(gone)
                    if old is not None:
                        evicted[gone] = (index, old)
                state = transition.state
                result.events.append(fed)
                placed[op.ident] = _Placed(cid, chosen, op.session, op.stream, task)
                routed[chosen] = routed.get(chosen, 0) + 1
            elif op.kind == "release":
                entry = placed.get(op.ident)
                if entry is None or entry.released:
                    result.skipped += 1
                    continue
                fleet.release(entry.cid, op.outcome)
                entry.released, entry.failed = True, op.outcome == "fail"
                await _soon(entry.task, RESPONSE_TIMEOUT * plan.factor)
                await target.settle(http, plan, len(fleet.held_ids()))
                release = Release(server_id=entry.server, request_id=entry.session)
                state = step(config, state, release).state
                result.events.append(release)
            else:
                name = names[op.backend]
                active = name in state.pool
                adding = op.kind == "add"
                if target.preset.pool is None or active == adding or (
                        not adding and len(state.pool) <= 1):
                    result.skipped += 1
                    continue
                problem = await target.change_pool(http, fleet.urls[op.backend], adding)
                if problem:
                    result.divergence = _diverge(index, words, done, state,
                                                 f"the pool change failed: {problem}",
                                                 ["R-POOL-1" if adding else "R-POOL-3"], ())
                    return result
                await target.settle(http, plan, len(fleet.held_ids()))
                change: Event = AddServers(server_ids=(name,)) if adding \
                    else RemoveServers(server_ids=(name,))
                state = step(config, state, change).state
                result.events.append(change)
            done.append(words)
    finally:
        fleet.release_all("ok")
        for entry in placed.values():
            await _soon(entry.task, RESPONSE_TIMEOUT)
        result.retries = sum(1 for a in fleet.arrivals if a.correlation_id is not None) \
            - len({a.correlation_id for a in fleet.arrivals if a.correlation_id is not None})
    return result


def _keep_reason(config: Config, state: State, pin: str) -> str:
    if config.full_determinism:
        return "under full_determinism every hit keeps its pin"
    margin = config.affinity_break_margin
    if margin is None:
        return "legacy: a pin is never moved for load"
    return (f"load {state.pool.load(pin)} <= min {state.pool.min_load} + margin {margin}")


def _explain(config: Config, state: State, event: Acquire, chosen: str, pool: tuple[str, ...],
             permitted: frozenset[str], views: dict[str, dict[str, int]],
             failures: dict[str, int], evicted: dict[str, tuple[int, str]],
             changes: Sequence[str] = ()) -> tuple[str, list[str], tuple[str, ...]]:
    """Words, requirement ids and consistent load views for a choice outside the set."""
    ordered = [s for s in pool if s in permitted]
    lookup, pin = classify(config, state, event.request_id, event.context_tokens)
    if lookup is Lookup.HIT_KEEP and pin is not None and not config.full_determinism \
            and config.affinity_break_margin is not None:
        gap = state.pool.load(pin) - state.pool.min_load
        text = (f"the router chose {chosen}, the spec requires {pin}: {event.request_id!r} is "
                f"pinned to {pin} at load {state.pool.load(pin)}, {gap} above the minimum "
                f"{state.pool.min_load}, inside the claimed margin "
                f"{config.affinity_break_margin} (inclusive, loads before this request): the "
                f"pin must be kept. The router moved it, as a router with margin < {gap} would")
        if state.pool.load(chosen) != state.pool.min_load:
            text += ", and not even to a least-loaded server"
        return text, ["R-KEEP-1", "R-KEEP-4"], ()
    if lookup is Lookup.HIT_KEEP and pin is not None:
        text = (f"the router chose {chosen}, the spec requires {pin}: {event.request_id!r} is "
                f"pinned to active {pin} and the claim keeps the pin "
                f"({_keep_reason(config, state, pin)}); the router re-placed the session "
                "although no pool change was made")
        failed = failures.get(pin, 0)
        if changes and not failed:
            text = text.replace("although no pool change was made",
                                f"after the pool changed ({'; '.join(changes)}), although its pin "
                                "stayed active: the spec's sticky map is untouched by pool "
                                "changes, so a pin on an active server is kept (a hash ring "
                                "that re-maps keys when a backend comes back breaks this)")
            return text, ["R-ACQ-2", "R-POOL-2", "R-DET-1" if config.full_determinism
                          else "R-POOL-3"], ()
        if failed:
            text += (f". {failed} request(s) failed on {pin} earlier in this trace: the router "
                     f"appears to take a backend out of rotation after failures (circuit "
                     f"breaker / health demotion) -- the spec knows only explicit pool changes, "
                     f"so such a router must report it as remove_servers, or keep pins")
            return text, ["R-ACQ-2", "R-POOL-3", "R-POOL-4"], ()
        return text, ["R-ACQ-2", "R-KEEP-1" if config.affinity_break_margin is not None
                      else "R-LEG-1", "R-LRU-2"], ()
    text, reqs = explain_acquire(config, state, event, chosen, ordered, None, evicted)
    text = text.replace("IMPL", "the router")
    return text, reqs, _minimal_views(views, chosen)


async def _soon(task: asyncio.Task[str], timeout: float = 1.0) -> str:
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout)
    except asyncio.TimeoutError:
        return "no response yet"


def _diverge(index: int, op: str, done: list[str], state: State, words: str,
             reqs: Sequence[str], views: tuple[str, ...]) -> StepDivergence:
    loads = {s: state.pool.load(s) for s, _ in state.pool.items()}
    return StepDivergence(index, op, words, tuple(dict.fromkeys(reqs)), loads, views,
                          tuple(done[-2:]))


async def shrink_ops(ops: Sequence[Op], fails: Callable[[Sequence[Op]], Awaitable[bool]],
                     max_runs: int, deadline: float) -> list[Op]:
    """Delta debugging (ddmin) over ops, then plainer ops (a failure made a success, a
    stream made plain) while the trace still fails; each run meets a fresh router."""
    current = list(ops)
    chunks = 2
    runs = 0
    while len(current) >= 2 and runs < max_runs and time.monotonic() < deadline:
        size = -(-len(current) // chunks)
        for start in range(0, len(current), size):
            candidate = current[:start] + current[start + size:]
            if not any(op.kind == "acquire" for op in candidate):
                continue
            runs += 1
            if await fails(candidate):
                current = candidate
                chunks = max(chunks - 1, 2)
                break
            if runs >= max_runs or time.monotonic() >= deadline:
                break
        else:
            if size == 1:
                break
            chunks = min(len(current), chunks * 2)
    for i, op in enumerate(current):  # then make each op plainer: no failure, no stream
        if runs >= max_runs or time.monotonic() >= deadline:
            break
        plainer = attrs.evolve(op, outcome="ok", stream=False)
        if plainer != op:
            runs += 1
            candidate = [*current[:i], plainer, *current[i + 1:]]
            if await fails(candidate):
                current = candidate
    return current


def write_vector(out_dir: Path, name: str, description: str, config: Config,
                 servers: list[str], events: Sequence[Event],
                 requirements: Sequence[str]) -> Path:
    """The trace as a conformance vector; expectations come from the core."""
    run = Scenario("regressions", name, description, requirements=requirements,
                   servers=servers, source="regression", config=config)
    for event in events:
        run.apply(event)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(case_text(seal(run.build())), encoding="utf-8")
    return path
