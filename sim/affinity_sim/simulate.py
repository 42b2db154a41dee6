"""One rollout generation step: trajectories, replicas and the core balancer on simpy.

Theory of operation
-------------------
:func:`simulate_step` replays the trajectories of :func:`~affinity_sim.workload.plan_step`
against ``workload.replicas`` :class:`~affinity_sim.replica.Replica` processes, routing
every turn through a :class:`~affinity_sim.routing.Balancer` (the real core).

Each trajectory is a simpy process, launched at t = 0 in plan order (verl's agent loop
starts the whole batch at once). For every turn it:

1. waits ``acquire_latency_s`` (the awaited ``acquire_server`` RPC), then acquires with
   ``context_tokens`` = the turn's prompt length (under a ``context_source = "reuse"``
   policy: that length scaled by the reuse the previous turn's replica has shown,
   :class:`~affinity_sim.routing.ReuseMeter`): the balancer's state changes at that
   instant;
2. submits the turn to the chosen replica and waits for its last token;
3. schedules the release ``release_delay_s`` later *without waiting for it* -- verl's
   ``release_server.remote`` is fire-and-forget -- so when the tool is faster than the
   release, the next acquire still sees this turn counted (the self-count hazard;
   counted in ``self_count_acquires``);
4. waits the tool latency, appends output and tool tokens to its context, and loops.

The step ends when the last trajectory finishes, as ``generate_async`` returns when its
last sequence does. Tie draws come from ``random.Random("ties:<seed>")`` and the
workload from ``random.Random("workload:<seed>")``, so a (workload, policy, seed) triple
always gives the same result, and every policy sees the same trajectories for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Generator
from typing import Any

import attrs
import simpy

from affinity_engine import Path
from affinity_runtime.prefix_index import PrefixIndex

from .replica import QueueTracker, Replica, Request
from .routing import Balancer, PolicySpec, ReuseMeter
from .workload import TrajectoryPlan, Workload, plan_step

__all__ = ["StepResult", "simulate_step"]


@attrs.frozen(kw_only=True)
class StepResult:
    """What one simulated step measured (plain numbers, JSON-ready)."""

    workload: str
    policy: str
    seed: int
    step_time_s: float
    # cached / looked-up prompt tokens of new requests, as the replica model's vLLM exports
    # it (with count_blocked_lookups: every failed-admission lookup too)
    prefix_hit_rate: float
    query_tokens: int
    hit_tokens: int
    preempted_query_tokens: int  # re-lookups after preemption, counted apart as vLLM does
    preempted_hit_tokens: int
    prefill_tokens: int
    breaks: int  # affinity_broken during the step
    kept: int  # affinity_kept during the step
    placements: int  # first placements (new) and unkeyed placements
    turns: int
    preemptions: int
    evicted_blocks: int
    idle_fraction: float  # replica-time with nothing to run / (replicas x step time)
    queue_skew: float  # time-mean of max - min per-replica queue (waiting + running)
    mean_queue: float  # time-mean of the per-replica queue length
    self_count_acquires: int  # acquires that saw the session's previous turn unreleased
    ignored_releases: int
    requests_per_replica: tuple[int, ...] = ()  # acquires routed to each replica
    # Lookups of requests whose KV allocation failed (counted with count_blocked_lookups).
    retry_query_tokens: int = 0
    retry_hit_tokens: int = 0
    admission_hit_rate: float = 0.0  # one lookup per admitted request (vLLM >= #48860)

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _extend_chain(chain: list[bytes], plan: TrajectoryPlan, shared: int, blocks: int,
                  epoch: int) -> None:
    """``chain`` becomes the block chain of a prompt of ``blocks`` full blocks: the group's
    ``shared`` prompt blocks, then the trajectory's own. A block's key names what fixes its
    content (group or trajectory, position, and for the trajectory's blocks the rewinds
    before it was written), so equal keys mean equal chained digests in vLLM."""
    del chain[blocks:]
    for i in range(len(chain), blocks):
        chain.append(b"g%d:%d" % (plan.group, i) if i < shared
                     else b"t%d:%d:%d" % (plan.index, i, epoch))


class _Step:
    """The mutable world of one simulation run."""

    def __init__(self, workload: Workload, policy: PolicySpec, seed: int,
                 plans: list[TrajectoryPlan]) -> None:
        self.workload = workload
        self.env = simpy.Environment()
        self.tracker = QueueTracker(workload.replicas)
        self.server_ids = [f"replica-{i}" for i in range(workload.replicas)]
        self.replicas = {
            sid: Replica(self.env, i, workload.model, self.tracker)
            for i, sid in enumerate(self.server_ids)
        }
        config = policy.config(workload.tie_break)
        self.balancer = Balancer(config, self.server_ids, policy.sticky,
                                 random.Random(f"ties:{seed}"))
        self.plans = plans
        self.reuse = ReuseMeter() if policy.context_source == "reuse" else None
        # prefix_source "index": the adapters' own index of routed blocks, a KV pool's size
        self.index = (PrefixIndex(workload.model.block_size, workload.model.capacity_blocks)
                      if config.prefix_placement and policy.prefix_source == "index"
                      else None)
        self.unfinished = len(plans)
        self.all_done = self.env.event()
        self.self_count = 0
        self.turns = 0
        self.slots = (simpy.Resource(self.env, capacity=workload.client_concurrency)
                      if workload.client_concurrency else None)

    def trajectory(self, plan: TrajectoryPlan) -> Generator[simpy.Event, Any, None]:
        env = self.env
        w = self.workload
        block = w.model.block_size
        shared = plan.prompt_tokens // block if w.share_prompt_prefix else 0
        group_key = -1 - plan.group
        group_id = f"g{plan.group}"  # the prompt's samples: GRPO's uid
        context = plan.prompt_tokens
        pending = [False]  # the previous turn's release has not reached the balancer yet
        chain: list[bytes] = []  # the turn's prompt blocks, for the index source
        rewound = [0]  # rewinds so far: blocks written after one are new content
        previous: str | None = None  # the replica that served the previous turn
        reuse = self.reuse
        last = len(plan.outputs) - 1
        for turn, output in enumerate(plan.outputs):
            if w.acquire_latency_s > 0:
                yield env.timeout(w.acquire_latency_s)
            slot = None
            if self.slots is not None:
                slot = self.slots.request()
                yield slot
            if pending[0]:
                self.self_count += 1
            # The turn's prompt is the conversation so far: what prompt_ids carries.
            sent = context
            if reuse is not None and previous is not None:
                sent = reuse.scaled(previous, context)
            estimate: tuple[tuple[str, int], ...] = ()
            if self.index is not None:
                _extend_chain(chain, plan, shared, context // block, rewound[0])
                estimate = self.index.estimate(chain, self.server_ids)
            elif self.balancer.reads_prefix:
                estimate = self._cached_prefix(group_key, shared, plan.index, context)
            server = self.balancer.acquire(plan.request_id, sent, group_id, estimate)
            if self.index is not None:
                self.index.record(server, chain)
            request = Request(env, plan.index, group_key, shared, context, output)
            self.replicas[server].submit(request)
            self.turns += 1
            yield request.done
            if reuse is not None and server == previous:
                reuse.record(server, context, request.cached)
            previous = server
            if slot is not None:
                assert self.slots is not None
                self.slots.release(slot)
            self._release_later(server, pending)
            context += output
            if turn < last:
                if plan.rewinds:
                    context -= plan.rewinds[turn]
                    rewound[0] += 1
                    del chain[context // block:]  # what follows is new content
                    self.replicas[server].kv.truncate(
                        plan.index, max(0, context // block - shared))
                latency = plan.tool_latency_s[turn]
                if latency > 0:
                    yield env.timeout(latency)
                context += plan.tool_tokens[turn]
        self.unfinished -= 1
        if self.unfinished == 0:
            self.all_done.succeed(env.now)

    def _cached_prefix(self, group_key: int, shared: int, traj: int,
                       tokens: int) -> tuple[tuple[str, int], ...]:
        """Each replica's cached tokens of this prompt now: a KV-event-fed router's view."""
        block = self.workload.model.block_size
        return tuple((sid, replica.kv.lookup(group_key, shared, traj, tokens) * block)
                     for sid, replica in self.replicas.items())

    def _release_later(self, server: str, pending: list[bool]) -> None:
        delay = self.workload.release_delay_s
        if delay <= 0:
            self.balancer.release(server)
            return
        pending[0] = True

        def deliver(_event: simpy.Event) -> None:
            self.balancer.release(server)
            pending[0] = False

        self.env.timeout(delay).callbacks.append(deliver)

    def run(self, policy: PolicySpec, seed: int) -> StepResult:
        env = self.env
        for plan in self.plans:
            env.process(self.trajectory(plan))
        env.run(until=self.all_done)
        end = env.now
        self.tracker.change(0, 0, end)  # close the queue integrals at the step end
        replicas = list(self.replicas.values())
        query = sum(r.query_tokens for r in replicas)
        hits = sum(r.hit_tokens for r in replicas)
        retry_query = sum(r.retry_query_tokens for r in replicas)
        retry_hits = sum(r.retry_hit_tokens for r in replicas)
        looked_up = query + retry_query
        idle = sum(r.idle_time_until(end) for r in replicas)
        paths = self.balancer.paths
        span = end if end > 0 else 1.0
        return StepResult(
            workload=self.workload.name,
            policy=policy.name,
            seed=seed,
            step_time_s=end,
            prefix_hit_rate=(hits + retry_hits) / looked_up if looked_up else 0.0,
            query_tokens=query,
            hit_tokens=hits,
            preempted_query_tokens=sum(r.preempted_query_tokens for r in replicas),
            preempted_hit_tokens=sum(r.preempted_hit_tokens for r in replicas),
            prefill_tokens=sum(r.prefill_tokens for r in replicas),
            breaks=paths[Path.BROKEN],
            kept=paths[Path.KEPT],
            placements=paths[Path.NEW] + paths[Path.UNKEYED] + paths[Path.RESELECTED],
            turns=self.turns,
            preemptions=sum(r.preemptions for r in replicas),
            evicted_blocks=sum(r.kv.evicted_blocks for r in replicas),
            idle_fraction=idle / (len(replicas) * span),
            queue_skew=self.tracker.skew_area / span,
            mean_queue=self.tracker.total_area / (span * len(replicas)),
            self_count_acquires=self.self_count,
            ignored_releases=self.balancer.ignored_releases,
            requests_per_replica=tuple(self.balancer.served.values()),
            retry_query_tokens=retry_query,
            retry_hit_tokens=retry_hits,
            admission_hit_rate=hits / query if query else 0.0,
        )


def simulate_step(workload: Workload, policy: PolicySpec, seed: int,
                  plans: list[TrajectoryPlan] | None = None) -> StepResult:
    """Simulate one step of ``workload`` under ``policy``; ``plans`` defaults to the seed's."""
    if plans is None:
        plans = plan_step(workload, seed)
    return _Step(workload, policy, seed, plans).run(policy, seed)
