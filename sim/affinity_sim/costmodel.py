"""Replica cost model: iteration time and KV-pool capacity, derived from public specs.

Theory of operation
-------------------
A vLLM replica runs *iterations*: each one decodes one token for every running sequence
and, with chunked prefill, computes up to ``max_num_batched_tokens`` prompt tokens. The
simulator charges an iteration

    t = a + b * (decode_seqs + prefill_tokens)
          + c * (KV tokens read by the decoding sequences)
          + d * (query x key pairs of the prefill chunks)

* ``a`` (``decode_fixed_s``): reading the weights once per iteration (memory-bound decode)
  plus per-step overhead (tensor-parallel all-reduces, sampling, scheduler CPU time);
* ``b`` (``per_token_s``): the dense GEMM FLOPs of one token, ``2 * params``;
* ``c`` (``kv_read_s_per_token``): reading one context token's K and V in every layer;
* ``d`` (``prefill_attn_s_per_pair``): causal attention FLOPs of one (query, key) pair,
  ``4 * layers * q_heads * head_dim``.

Terms are added rather than overlapped (a roofline would take the max of the memory and
compute parts); at the batch sizes of a rollout step the difference is a few percent of
``a`` and the same for every routing policy.

:func:`derive` computes all five numbers from a :class:`ModelShape`, a :class:`Hardware`
description and stated efficiencies, so a reader can check each one. The preset
:data:`QWEN25_32B_TP4_H200` uses

* Qwen2.5-32B ``config.json``: 64 layers, 40 query heads, 8 KV heads, head_dim 128,
  32.5 B parameters (model card), bf16;
* NVIDIA H200 SXM datasheet: 141 GB HBM3e at 4.8 TB/s, 989 dense BF16 TFLOPS;
* vLLM defaults: 16-token KV blocks; verl rollout defaults: ``max_num_seqs=1024``,
  ``max_num_batched_tokens=8192``;
* assumed efficiencies: 70% of HBM bandwidth, 50% MFU for GEMMs, 40% for prefill
  attention, 5 ms per-step overhead at TP4.

KV bytes per token = 2 (K, V) x 64 layers x 8 heads x 128 x 2 bytes = 262,144 B. The pool
is ``gpus * 141 GB * gpu_memory_utilization - weights - gpus * reserve``, divided by that.
"""

from __future__ import annotations

import attrs

__all__ = [
    "H200_SXM",
    "QWEN25_32B",
    "QWEN25_32B_TP4_H200",
    "Hardware",
    "ModelShape",
    "ReplicaModel",
    "derive",
    "kv_capacity_tokens",
]


@attrs.frozen(kw_only=True)
class ModelShape:
    name: str
    params: float  # parameter count
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@attrs.frozen(kw_only=True)
class Hardware:
    name: str
    hbm_bytes: float  # per GPU
    hbm_bytes_per_s: float
    bf16_flops: float  # dense


QWEN25_32B = ModelShape(
    name="Qwen2.5-32B", params=32.5e9, layers=64, q_heads=40, kv_heads=8, head_dim=128
)
H200_SXM = Hardware(name="H200 SXM", hbm_bytes=141e9, hbm_bytes_per_s=4.8e12, bf16_flops=989e12)


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class ReplicaModel:
    """Everything a replica needs: iteration cost, KV pool and scheduler limits."""

    name: str
    decode_fixed_s: float
    per_token_s: float
    kv_read_s_per_token: float
    prefill_attn_s_per_pair: float
    kv_capacity_tokens: int
    block_size: int = 16
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    # vLLM before #48860 (merged 2026-07-16; 0.24.0, verl 0.9.1's pin, predates it) records
    # a prefix-cache lookup at every scheduler step that tries a waiting request, also when
    # its KV allocation then fails: a request blocked at the head of the queue is counted
    # once per iteration until admitted. True reproduces that exported hit rate.
    count_blocked_lookups: bool = False
    # vLLM V1's scheduler admits no waiting request in a step that preempted a running one
    # (``if not preempted_reqs``); False keeps the calibrated presets' older behaviour.
    skip_waiting_after_preemption: bool = False

    def __attrs_post_init__(self) -> None:
        _positive("decode_fixed_s", self.decode_fixed_s)
        for flag in ("count_blocked_lookups", "skip_waiting_after_preemption"):
            value = getattr(self, flag)
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be true or false, got {value!r}")
        for key in ("per_token_s", "kv_read_s_per_token", "prefill_attn_s_per_pair"):
            value = getattr(self, key)
            if not value >= 0:
                raise ValueError(f"{key} must be >= 0, got {value!r}")
        for key in ("kv_capacity_tokens", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
        if self.max_num_batched_tokens <= self.max_num_seqs:
            # Every running sequence takes one token of the iteration budget; at least one
            # must be left for prefill or a full batch would starve its own prefills.
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be > "
                f"max_num_seqs ({self.max_num_seqs})"
            )

    @property
    def capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    def iteration_time(
        self, decode_seqs: int, decode_context: int, prefill_tokens: int, prefill_pairs: float
    ) -> float:
        return (
            self.decode_fixed_s
            + self.per_token_s * (decode_seqs + prefill_tokens)
            + self.kv_read_s_per_token * decode_context
            + self.prefill_attn_s_per_pair * prefill_pairs
        )

    def with_capacity(self, kv_capacity_tokens: int) -> ReplicaModel:
        return attrs.evolve(self, kv_capacity_tokens=kv_capacity_tokens)


def kv_capacity_tokens(
    model: ModelShape,
    hardware: Hardware,
    gpus: int,
    gpu_memory_utilization: float,
    reserve_bytes_per_gpu: float = 2.5e9,
) -> int:
    """vLLM's KV pool: the memory share left after weights and activations/CUDA graphs."""
    free = gpus * hardware.hbm_bytes * gpu_memory_utilization - model.weight_bytes
    free -= gpus * reserve_bytes_per_gpu
    if free <= 0:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} leaves no KV memory for "
            f"{model.name} on {gpus} x {hardware.name}"
        )
    return int(free // model.kv_bytes_per_token)


def derive(
    model: ModelShape,
    hardware: Hardware,
    *,
    gpus: int,
    gpu_memory_utilization: float = 0.9,
    bandwidth_efficiency: float = 0.7,
    gemm_mfu: float = 0.5,
    attention_mfu: float = 0.4,
    step_overhead_s: float = 0.005,
) -> ReplicaModel:
    """The cost model of ``model`` at tensor parallelism ``gpus`` (see the module docstring)."""
    bandwidth = gpus * hardware.hbm_bytes_per_s * bandwidth_efficiency
    flops = gpus * hardware.bf16_flops
    return ReplicaModel(
        name=f"{model.name} TP{gpus} {hardware.name}",
        decode_fixed_s=model.weight_bytes / bandwidth + step_overhead_s,
        per_token_s=2 * model.params / (flops * gemm_mfu),
        kv_read_s_per_token=model.kv_bytes_per_token / bandwidth,
        prefill_attn_s_per_pair=4 * model.layers * model.q_heads * model.head_dim
        / (flops * attention_mfu),
        kv_capacity_tokens=kv_capacity_tokens(model, hardware, gpus, gpu_memory_utilization),
    )


QWEN25_32B_TP4_H200 = derive(QWEN25_32B, H200_SXM, gpus=4)
