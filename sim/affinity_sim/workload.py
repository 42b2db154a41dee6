"""Workloads: what one rollout step asks of the fleet, drawn up front from a seed.

Theory of operation
-------------------
A step is ``prompts x samples`` trajectories (DAPO-style: every prompt is sampled ``n``
times). A trajectory is a multi-turn conversation: its turn count, each turn's output
length, the tool response that follows each non-final turn and the tool latency are drawn
from the workload's distributions. Turn ``k``'s prompt is the whole conversation so far::

    prompt_1 = P
    prompt_{k+1} = prompt_k + output_k + tool_k

so its KV prefix is exactly the previous turn's context, which is what makes sticky
routing pay. ``max_context`` plays verl's response-length limit: an output is cut to fit,
and a trajectory that reaches the limit ends there.

:func:`plan_step` draws every trajectory of a step from ``random.Random(seed)`` before
the simulation starts. The routing policy can therefore never change the workload: for a
given seed every policy replays the same trajectories (the pairing of the comparison).

**Difficulty.** With ``difficulty_sigma`` > 0 every prompt draws a factor
``D = exp(N(0, difficulty_sigma))`` (its own RNG stream, ``difficulty:<seed>``) that
multiplies every output length of all its samples: a hard prompt is long in every turn
and for every sample, as GRPO groups are. With ``difficulty_sigma = 0`` (the default) no
factor is drawn and the plans are exactly those of a workload without the feature.

Samples of one prompt share its token content. The KV cache model uses that: the full
blocks of the prompt are one shared segment per prompt group, so two samples on one
replica hit each other's prompt blocks, as vLLM's hashed prefix cache does.
"""

from __future__ import annotations

import random
from typing import Any

import attrs

from .costmodel import ReplicaModel
from .distributions import Distribution

__all__ = ["TrajectoryPlan", "Workload", "plan_step", "plan_summary"]


def _non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def _count(name: str, value: object, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


@attrs.frozen(kw_only=True)
class Workload:
    """One workload: fleet, trajectory shape, replica model and routing-call timing."""

    name: str
    replicas: int
    prompts: int
    samples: int
    turns: Distribution
    prompt_tokens: Distribution
    output_tokens: Distribution
    tool_tokens: Distribution
    tool_latency_s: Distribution
    max_context: int
    model: ReplicaModel
    # The awaited acquire RPC and the fire-and-forget release (verl: release_server.remote
    # is not awaited), measured from the moment the turn's generation ends.
    acquire_latency_s: float = 0.001
    release_delay_s: float = 0.002
    tie_break: str = "draw"
    description: str = ""
    target_hit_rate: float | None = None  # the PR's baseline, for calibration reports
    # verl's AgentLoopManager splits the batch into ``agent_workers`` contiguous chunks, one
    # per AgentLoopWorker, and the workers' acquires reach the balancer interleaved. 1 keeps
    # the plain prompt-major launch order.
    agent_workers: int = 1
    # Samples of one prompt share its full prompt blocks in a replica's prefix cache (GRPO's
    # n samples of one prompt). False gives every trajectory a private prompt (ablation).
    share_prompt_prefix: bool = True
    # At most this many turns in flight across the step (a client-side semaphore, as in
    # affinity_vllm.workload.drive); 0 = unbounded (verl launches the whole batch).
    client_concurrency: int = 0
    # Log-sigma of a per-prompt difficulty factor multiplying every output length of the
    # prompt's samples (correlated lengths within a GRPO group); 0 = independent draws.
    difficulty_sigma: float = 0.0

    def __attrs_post_init__(self) -> None:
        _count("replicas", self.replicas)
        _count("prompts", self.prompts)
        _count("samples", self.samples)
        _count("max_context", self.max_context, 2)
        _count("agent_workers", self.agent_workers)
        _count("client_concurrency", self.client_concurrency, 0)
        if not isinstance(self.share_prompt_prefix, bool):
            raise ValueError(
                f"share_prompt_prefix must be true or false, got {self.share_prompt_prefix!r}"
            )
        _non_negative("acquire_latency_s", self.acquire_latency_s)
        _non_negative("difficulty_sigma", self.difficulty_sigma)
        _non_negative("release_delay_s", self.release_delay_s)
        if self.tie_break not in ("first", "draw", "hashed"):
            raise ValueError(
                f"tie_break must be 'first', 'draw' or 'hashed', got {self.tie_break!r}"
            )
        need = self.max_context + 2 * self.model.block_size
        if self.model.kv_capacity_tokens < need:
            # A replica must hold at least one full-length conversation, or it deadlocks.
            raise ValueError(
                f"kv_capacity_tokens ({self.model.kv_capacity_tokens}) must be >= "
                f"max_context + 2 blocks ({need}) for workload {self.name!r}"
            )

    @property
    def trajectories(self) -> int:
        return self.prompts * self.samples

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "replicas": self.replicas,
            "prompts": self.prompts,
            "samples": self.samples,
            "max_context": self.max_context,
            "turns": self.turns.describe(),
            "prompt_tokens": self.prompt_tokens.describe(),
            "output_tokens": self.output_tokens.describe(),
            "tool_tokens": self.tool_tokens.describe(),
            "tool_latency_s": self.tool_latency_s.describe(),
            "acquire_latency_s": self.acquire_latency_s,
            "release_delay_s": self.release_delay_s,
            "tie_break": self.tie_break,
            "target_hit_rate": self.target_hit_rate,
            "agent_workers": self.agent_workers,
            "share_prompt_prefix": self.share_prompt_prefix,
            "client_concurrency": self.client_concurrency,
            "difficulty_sigma": self.difficulty_sigma,
            "model": attrs.asdict(self.model),
        }


@attrs.frozen
class TrajectoryPlan:
    """One conversation, fully drawn: the simulator only replays it."""

    index: int
    group: int
    request_id: str
    prompt_tokens: int
    outputs: tuple[int, ...]  # one per turn
    tool_tokens: tuple[int, ...]  # one per non-final turn
    tool_latency_s: tuple[float, ...]  # one per non-final turn
    # Tokens dropped from the end of the conversation before each non-final turn's new
    # tokens (a client that re-sends history but not the last query/answer); () = none.
    rewinds: tuple[int, ...] = ()

    @property
    def final_context(self) -> int:
        return self.prompt_tokens + sum(self.outputs) + sum(self.tool_tokens) - sum(self.rewinds)


def plan_step(workload: Workload, seed: int) -> list[TrajectoryPlan]:
    """All trajectories of one step, in the order the agent loop launches them."""
    rng = random.Random(f"workload:{seed}")
    # A separate stream, so the other draws are the same with and without the feature.
    hardness = random.Random(f"difficulty:{seed}")
    sigma = workload.difficulty_sigma
    limit = workload.max_context
    plans: list[TrajectoryPlan] = []
    for group in range(workload.prompts):
        prompt = min(max(1, workload.prompt_tokens.sample_int(rng)), limit - 1)
        factor = hardness.lognormvariate(0.0, sigma) if sigma > 0 else 1.0
        for _ in range(workload.samples):
            turns = max(1, workload.turns.sample_int(rng))
            context = prompt
            outputs: list[int] = []
            tools: list[int] = []
            latencies: list[float] = []
            for turn in range(turns):
                if sigma > 0:
                    drawn = round(workload.output_tokens.sample(rng) * factor)
                else:
                    drawn = workload.output_tokens.sample_int(rng)
                out = min(max(1, drawn), limit - context)
                outputs.append(out)
                context += out
                if turn == turns - 1:
                    break
                tool = max(0, workload.tool_tokens.sample_int(rng))
                latency = max(0.0, workload.tool_latency_s.sample(rng))
                if context + tool >= limit:
                    break  # the response-length limit ends the conversation
                tools.append(tool)
                latencies.append(latency)
                context += tool
            request_id = f"{rng.getrandbits(128):032x}"  # uuid4().hex-like, one per trajectory
            plans.append(
                TrajectoryPlan(len(plans), group, request_id, prompt, tuple(outputs),
                               tuple(tools), tuple(latencies))
            )
    return _interleave(plans, workload.agent_workers, random.Random(f"launch:{seed}"))


def _interleave(plans: list[TrajectoryPlan], workers: int,
                rng: random.Random) -> list[TrajectoryPlan]:
    """Launch order of ``workers`` agent-loop workers, each given a contiguous chunk.

    Each worker starts its chunk's trajectories in order; the workers' acquires reach the
    balancer in a uniformly random interleaving (their own RNG, so the trajectories and
    their draws are unchanged -- only the order is).
    """
    if workers <= 1:
        return plans
    size = -(-len(plans) // workers)
    chunks = [iter(plans[i:i + size]) for i in range(0, len(plans), size)]
    turns = [c for c, chunk in enumerate(range(0, len(plans), size))
             for _ in range(min(size, len(plans) - chunk))]
    rng.shuffle(turns)
    return [next(chunks[c]) for c in turns]


def plan_summary(plans: list[TrajectoryPlan]) -> dict[str, float]:
    """Means that calibration compares with the PR's "approximate context"."""
    n = len(plans)
    turns = sum(len(p.outputs) for p in plans)
    return {
        "trajectories": n,
        "mean_turns": turns / n,
        "mean_final_context": sum(p.final_context for p in plans) / n,
        "mean_output_per_turn": sum(sum(p.outputs) for p in plans) / turns,
        "max_final_context": max(p.final_context for p in plans),
    }
