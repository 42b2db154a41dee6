"""Run black-box traces against a router and judge them against the reference core.

Theory of operation
-------------------
:func:`run_trace` plays one trace (:mod:`.trace`) against a fresh router in front of the
recording fleet and keeps the reference core in step, in refinement mode:

* **acquire**: send the request, wait for its arrival at some backend; that backend is
  the router's choice ``s``. An op with a context (a band trace) sends a prompt of that
  many token ids and gives the core the same number as ``context_tokens`` (R-BAND-1).
  The spec's allowed set ``allowed(S, e)`` (R-REL-1) must contain ``s``; then the core
  steps with the choice fixed to ``s`` (``draw_for``, R-REL-2). A choice outside the
  set, or a request that never reaches a backend, is a divergence at this step;
* **release**: complete the held request (ok or fail), wait for the client's response to
  end, *settle* (:class:`~.target.Target`), then step the core with ``Release``;
* **remove / add**: change the pool through the router's admin API, then step
  ``RemoveServers`` / ``AddServers``.

A divergence is explained by :mod:`.explain`: the spec's view of the pre-state (with the
context band's numbers under a band claim), plus the *load views* under which the
router's choice would have been least-loaded.

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

from affinity_conformance.scenario import Scenario
from affinity_conformance.vector_format import case_text, seal
from affinity_engine import (
    Acquire,
    Acquired,
    AddServers,
    Config,
    Event,
    Release,
    RemoveServers,
    State,
    allowed,
    draw_for,
    initial_state,
    step,
)

from .claims import Claim
from .explain import Placed, count_band, explain_choice, load_views
from .fleet import MODEL, RecordingFleet, correlation_prompt
from .target import SettlePlan, Target
from .trace import Op, describe, server_ids

__all__ = ["RunResult", "StepDivergence", "request_body", "run_trace", "shrink_ops",
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
    band: dict[str, int] = attrs.field(factory=dict)  # band decisions met (see _count_band)


def request_body(cid: str, stream: bool, context: int | None) -> dict[str, object]:
    """The completions body of one acquire: a text prompt carrying the correlation id, or,
    with a context ``c``, a prompt of exactly ``c`` token ids (what a router counts exactly,
    as ``affinity serve`` does) with the id in the ``user`` field. The ids are arbitrary
    small integers; the stub backends never tokenize."""
    body: dict[str, object] = {"model": MODEL, "max_tokens": 1, "stream": stream}
    if context is None:
        body["prompt"] = correlation_prompt(cid)
    else:
        body["prompt"] = [1 + i % 1000 for i in range(context)]
        body["user"] = correlation_prompt(cid)
    return body


async def _send(http: aiohttp.ClientSession, url: str, header: str, session: str,
                cid: str, stream: bool, context: int | None = None) -> str:
    body = request_body(cid, stream, context)
    try:
        async with http.post(url + "/v1/completions", json=body, headers={header: session},
                             timeout=aiohttp.ClientTimeout(total=None)) as resp:
            await resp.read()
            return f"HTTP {resp.status}"
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return f"{type(exc).__name__}"


async def run_trace(target: Target, fleet: RecordingFleet, http: aiohttp.ClientSession,
                    ops: Sequence[Op], claim: Claim, plan: SettlePlan) -> RunResult:
    """One trace against a fresh router (see the module docstring)."""
    await target.fresh(http)
    fleet.forget()
    config = claim.config
    names = server_ids(fleet.size)
    state = initial_state(config, names)
    result = RunResult(None)
    placed: dict[int, Placed] = {}
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
                task = asyncio.create_task(_send(http, target.url, header, key, cid, op.stream,
                                                 op.context))
                arrival = await fleet.wait_arrival(cid, ARRIVAL_TIMEOUT * plan.factor)
                pool = tuple(s for s, _ in state.pool.items())
                event = Acquire(request_id=op.session, context_tokens=op.context)
                if claim.deterministic and pool:
                    pick = learned.get((op.session, pool))
                    if pick is None and arrival is not None:
                        pick = learned.setdefault((op.session, pool), names[arrival.backend])
                    event = Acquire(request_id=op.session, context_tokens=op.context,
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
                    text, reqs, views = explain_choice(
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
                count_band(config, state, event, result.band)
                fed = draw_for(config, state, event, chosen)
                assert fed is not None
                # Read the entry the write would evict before stepping: once stepped, this
                # state's sticky map is no longer its log's tip and the next read of it
                # re-derives the whole map (StickyLru, "a non-tip version").
                gone = state.lru.evicts_on_put(fed.request_id) if fed.request_id else None
                old = None if gone is None else state.lru.peek(gone)
                transition = step(config, state, fed)
                if isinstance(transition.outcome, Acquired) and transition.outcome.evicted:
                    assert transition.outcome.evicted == gone, "the core evicts the oldest key"
                    if old is not None:
                        evicted[gone] = (index, old)
                state = transition.state
                result.events.append(fed)
                placed[op.ident] = Placed(cid, chosen, op.session, op.stream, task)
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
