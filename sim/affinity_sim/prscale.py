"""The ``pr7435-scale`` preset: PR #7435's four rows at the PR's scale, predicted, not fitted.

Theory of operation
-------------------
The ``pr7435`` preset reproduces the PR's baseline hit rates by shrinking each replica's
KV pool until they match (a fit), at 512 trajectories a step. This preset instead
*derives* every input from a source or from an assumption stated here before any run,
and then *predicts* the baseline hit rates and every policy's change. Nothing is tuned
against a hit rate or a policy's result. The one input taken from the PR's table is its
"approximate context" per row, which sets the output-length median (the mean final
context of the drawn trajectories matches it within 1%; :func:`fit_contexts`, no
simulation involved).

Sources and a-priori assumptions (sim/studies/README.md, "PR scale", repeats them with reasons):

* **Scale** -- verl's ReTool recipe for Qwen2.5-32B on DAPO-Math-17k
  (``recipe/retool/run_qwen2-32b_dapo.sh``): ``train_batch_size=512``, ``n=16``, so
  8,192 trajectories a step; ``max_turns=8``; TP4 (the PR: 16 replicas on 8 H200 nodes).
* **KV pool** -- from the model (64 layers x 8 KV heads x 128 x bf16 = 256 KiB/token) and
  ``gpu_memory_utilization``: verl 0.9.1's default 0.5 for the three ordinary rows, the
  ReTool recipe's 0.9 for the "large KV pool" row (:func:`costmodel.kv_capacity_tokens`).
* **Scheduler limits** -- verl 0.9.1's rollout defaults: ``max_num_seqs=256``,
  ``max_num_batched_tokens=8192``.
* **Turns** -- ReTool-style tool use: 1-5 assistant turns, uniform (mean 3; the ReTool
  recipe's SFT model reports ``num_turns/mean`` 7.2 = user + assistant turns + 1, i.e.
  ~3.1 assistant turns). The same for every row.
* **Prompt** -- a DAPO-Math question with its instruction plus a Hermes tool-schema
  system prompt: lognormal, median 400 tokens, sigma 0.3.
* **Tool responses** -- code-interpreter output with the chat-template wrapper:
  lognormal median 64 tokens, sigma 1.0, 12-268 (verl truncates at 256).
* **Tool latency** -- the PR did not exercise real tool latency: lognormal median 20 ms.
* **Request ids** -- one id per trajectory (ToolAgentLoop), which the sticky map keys on;
  every turn is a fresh vLLM request whose blocks return to the prefix cache when it
  ends. ``max_cache_size`` 10,000 >= 8,192, so no sticky entry is evicted in a step.
* **Launch order** -- 8 agent-loop workers (verl's default ``agent.num_workers``), each
  with a contiguous 1,024-trajectory chunk; their acquires interleave at random.
* **Ties** -- PR #7435's balancer resolves tied minima to the first registered replica,
  for new placements and re-pins alike (it predates verl's random ties, #7613), and both
  arms of its A/B ran its code: ``tie_break = "first"``.
* **GRPO sharing** -- the 16 samples of a prompt share its prompt blocks in a replica's
  prefix cache.
* **Output lengths** -- lognormal, log-sigma 0.8 per turn, median set per row by the
  context (above). Half of the log-variance is a per-prompt *difficulty* shared by the 16
  samples in every turn (a hard prompt is long for all of them), half is drawn per turn:
  an even split fixed a priori (no source gives the intra-group share for this model).
* **The engine** -- vLLM 0.24.0, verl 0.9.1's pin: its exported prefix-cache hit rate
  counts every lookup of a queue head whose KV allocation fails, once per scheduler step
  (fixed after 0.24 by vLLM #48860; ``StepResult.admission_hit_rate`` is the fixed
  metric), and a step that preempts admits no waiting request.

:data:`ABLATIONS` removes one modelled feature at a time (``affinity simulate --preset
pr7435-scale-ablation``), the evidence for which feature moves which number.
:mod:`affinity_sim.prscale_context` reads the PR's context as the mean prompt per
request instead (``--preset pr7435-scale-context-per-request``, a sensitivity run).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import attrs

from .costmodel import H200_SXM, QWEN25_32B, ReplicaModel, derive
from .distributions import parse
from .routing import parse_policies
from .sweep import Sweep
from .workload import Workload, plan_step, plan_summary

__all__ = ["ABLATIONS", "SCALE_POLICIES", "ablation_sweep", "fit_contexts", "fit_shape_medians",
           "scale_sweep", "scale_workloads", "sensitivity_sweep"]

# verl 0.9.1 rollout defaults (verl/trainer/config/rollout/rollout.yaml).
VERL_DEFAULT_UTILIZATION = 0.5
VERL_MAX_NUM_SEQS = 256
RETOOL_UTILIZATION = 0.9  # recipe/retool/run_qwen2-32b_dapo.sh
AGENT_WORKERS = 8  # verl rollout.agent.num_workers default


# Output length per turn: lognormal with log-sigma 0.8 overall (the calibrated preset's
# assumption), half of its variance between prompts (a per-prompt difficulty shared by the
# 16 samples, every turn) and half within: an a-priori even split, not fitted.
OUTPUT_SIGMA = 0.8
DIFFICULTY_SIGMA = OUTPUT_SIGMA / math.sqrt(2)
WITHIN_SIGMA = math.sqrt(OUTPUT_SIGMA**2 - DIFFICULTY_SIGMA**2)


def replica_model(gpu_memory_utilization: float, max_num_seqs: int = VERL_MAX_NUM_SEQS
                  ) -> ReplicaModel:
    """The Qwen2.5-32B TP4 H200 replica as verl 0.9.1 runs it on vLLM 0.24.0 (its pin).

    vLLM 0.24.0 exports a hit rate that counts every lookup of a KV-blocked queue head
    (fixed after it, #48860) and its scheduler admits nobody in a step that preempted.
    """
    model = derive(QWEN25_32B, H200_SXM, gpus=4, gpu_memory_utilization=gpu_memory_utilization)
    return attrs.evolve(model, max_num_seqs=max_num_seqs, count_blocked_lookups=True,
                        skip_waiting_after_preemption=True)


# (name, description, PR context, output median fitted to that context with correlated
#  lengths, the same fitted with independent lengths (the no-difficulty ablation),
#  max_context, gpu_memory_utilization, the PR's baseline hit rate -- reported, never used)
_ROWS = (
    ("ctx2k", "~2.2K context, verl default pool", 2200, 450, 408, 4096,
     VERL_DEFAULT_UTILIZATION, 0.087),
    ("ctx9k", "~8.7K context, verl default pool", 8700, 2_370, 2_116, 16_384,
     VERL_DEFAULT_UTILIZATION, 0.053),
    ("ctx20k", "~19.8K context, verl default pool", 19800, 6_198, 5_487, 32_768,
     VERL_DEFAULT_UTILIZATION, 0.016),
    ("ctx9k-bigkv", "~8.7K context, large KV pool (0.9)", 8700, 2_370, 2_116, 16_384,
     RETOOL_UTILIZATION, 0.997),
)
_PR_REFERENCE = (
    ("ctx2k", (("context", "2.2K"), ("hit_rate", 0.087), ("steps", 39), ("change", -0.038))),
    ("ctx9k", (("context", "8.7K"), ("hit_rate", 0.053), ("steps", 9), ("change", -0.086))),
    ("ctx20k", (("context", "19.8K"), ("hit_rate", 0.016), ("steps", 17), ("change", -0.101))),
    ("ctx9k-bigkv", (("context", "8.7K, large KV"), ("hit_rate", 0.997), ("steps", 39),
                     ("change", -0.054))),
)
CONTEXTS = {name: context for name, _, context, *_ in _ROWS}

# The sweep the issue asks for: legacy, margin 0/1/2/4, #6533 abs 4/8.
SCALE_POLICIES = ("legacy", "margin-0", "margin-1", "margin-2", "margin-4", "dual-4", "dual-8")


def _workload(name: str, description: str, output_median: float, max_context: int,
              utilization: float, target: float, prompts: int = 512) -> Workload:
    return Workload(
        name=name,
        description=description,
        replicas=16,
        prompts=prompts,
        samples=16,
        turns=parse("turns", {"dist": "uniform_int", "low": 1, "high": 5}),
        prompt_tokens=parse("prompt_tokens", {"dist": "lognormal", "median": 400, "sigma": 0.3,
                                              "min": 128, "max": 2048}),
        output_tokens=parse("output_tokens", {"dist": "lognormal", "median": output_median,
                                              "sigma": WITHIN_SIGMA}),
        difficulty_sigma=DIFFICULTY_SIGMA,
        tool_tokens=parse("tool_tokens", {"dist": "lognormal", "median": 64, "sigma": 1.0,
                                          "min": 12, "max": 268}),
        tool_latency_s=parse("tool_latency_s", {"dist": "lognormal", "median": 0.02,
                                                "sigma": 1.0, "max": 1.0}),
        max_context=max_context,
        model=replica_model(utilization),
        agent_workers=AGENT_WORKERS,
        tie_break="first",
        target_hit_rate=target,
    )


_INDEPENDENT_MEDIAN = {name: median for name, _, _, _, median, *_ in _ROWS}


def scale_workloads(prompts: int = 512) -> tuple[Workload, ...]:
    return tuple(_workload(n, d, m, mc, u, t, prompts) for n, d, _, m, _, mc, u, t in _ROWS)


def scale_sweep(name: str = "pr7435-scale") -> Sweep:
    return Sweep(name=name, workloads=scale_workloads(), policies=tuple(
        parse_policies(SCALE_POLICIES)), seeds=10, reference=_PR_REFERENCE,
        description="PR #7435's rows at 512 x 16 trajectories on 16 replicas, the pool "
                    "derived from the model; predicted, not fitted")


def _independent(w: Workload) -> Workload:
    """Independent lengths, log-sigma 0.8, the median fitted to the same context."""
    median = _INDEPENDENT_MEDIAN[w.name.partition("/")[0]]
    return attrs.evolve(w, difficulty_sigma=0.0, output_tokens=parse(
        "output_tokens", {"dist": "lognormal", "median": median, "sigma": OUTPUT_SIGMA}))


def _ablate(w: Workload, feature: str) -> Workload:
    if feature == "no-prefix-sharing":
        return attrs.evolve(w, share_prompt_prefix=False)
    if feature == "no-worker-interleave":
        return attrs.evolve(w, agent_workers=1)
    if feature == "max-seqs-1024":
        return attrs.evolve(w, model=attrs.evolve(w.model, max_num_seqs=1024))
    if feature == "pool-0.9":
        return attrs.evolve(w, model=attrs.evolve(w.model, kv_capacity_tokens=replica_model(
            RETOOL_UTILIZATION).kv_capacity_tokens))
    if feature == "ties-draw":
        return attrs.evolve(w, tie_break="draw")
    if feature == "small-step":
        return attrs.evolve(w, prompts=32)
    if feature == "single-turn":
        return attrs.evolve(w, turns=parse("turns", {"dist": "constant", "value": 1}))
    if feature == "no-difficulty":
        return _independent(w)
    raise ValueError(f"unknown ablation {feature!r}; accepted: {', '.join(ABLATIONS)}")


# Each removes one modelled feature (or replaces an a-priori choice by its alternative).
# The two vLLM 0.24 behaviours of replica_model() have no row: the hit-rate metric does not
# change a run (every result also carries admission_hit_rate, the metric without it), and
# skipping admission in a preempting step cannot change one here (the victim heads the
# queue and needs a block more than it freed; tests/sim/test_sim_prscale.py).
ABLATIONS = ("no-difficulty", "no-prefix-sharing", "no-worker-interleave", "ties-draw",
             "max-seqs-1024", "pool-0.9", "small-step", "single-turn")


def ablation_sweep() -> Sweep:
    """Every row with each feature removed in turn (legacy and margin-2, 3 seeds)."""
    base = scale_workloads()
    workloads = list(base)
    for feature in ABLATIONS:
        for w in base:
            if feature == "pool-0.9" and w.name == "ctx9k-bigkv":
                continue  # already the 0.9 pool
            workloads.append(attrs.evolve(_ablate(w, feature), name=f"{w.name}/{feature}",
                                          description=f"{w.description}; ablation {feature}"))
    return Sweep(name="pr7435-scale-ablation", workloads=tuple(workloads),
                 policies=tuple(parse_policies(("legacy", "margin-2"))), seeds=3,
                 description="pr7435-scale with one modelled feature removed at a time")


def fit_contexts(seeds: Sequence[int] = (1000, 1001), independent: bool = False
                 ) -> dict[str, tuple[float, float]]:
    """Per row: (output median, achieved mean final context), bisected to the PR's context.

    ``independent``: for the no-difficulty ablation's lengths.
    """
    from .calibrate import fit_output_median

    out: dict[str, tuple[float, float]] = {}
    for w in scale_workloads():
        if independent:
            w = _independent(w)
        fitted, achieved = fit_output_median(w, CONTEXTS[w.name], seeds)
        out[w.name] = (dict(fitted.output_tokens.params)["median"], achieved)
    return out


def fit_shape_medians(shape: Callable[[Workload, float], Workload], values: Sequence[float],
                      seeds: Sequence[int] = (1000, 1001)
                      ) -> dict[tuple[str, float], tuple[float, float]]:
    """Per (row, value): the output median that keeps the row's PR context under
    ``shape(row, value)``, and the mean final context it gives (within 1%; plans only)."""
    from .calibrate import fit_output_median

    out: dict[tuple[str, float], tuple[float, float]] = {}
    for w in scale_workloads():
        for value in values:
            fitted, achieved = fit_output_median(shape(w, value), CONTEXTS[w.name], seeds)
            out[(w.name, value)] = (dict(fitted.output_tokens.params)["median"], achieved)
    return out


def sensitivity_sweep(name: str, workloads: tuple[Workload, ...], description: str) -> Sweep:
    """A sensitivity run's sweep: legacy and margin 2, 10 seeds, the PR's numbers attached
    (for the rows the run keeps the names of; report tables read them from the preset's)."""
    return Sweep(name=name, workloads=workloads,
                 policies=tuple(parse_policies(("legacy", "margin-2"))), seeds=10,
                 reference=_PR_REFERENCE, description=description)


def mean_context(workload: Workload, seeds: Sequence[int] = (0, 1)) -> float:
    return statistics.fmean(
        plan_summary(plan_step(workload, s))["mean_final_context"] for s in seeds)


if __name__ == "__main__":
    for label, independent in (("correlated (the preset)", False),
                               ("independent (no-difficulty)", True)):
        print(label)
        for row, (median, context) in fit_contexts(independent=independent).items():
            print(f"  {row}: output median {median:,.0f} -> mean final context {context:,.0f}")
