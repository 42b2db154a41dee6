"""The pr7435-scale preset: inputs derived from sources, one full-size step within budget."""

from __future__ import annotations

import math
import time

import attrs
import pytest
import simpy
from affinity_sim.costmodel import ReplicaModel
from affinity_sim.distributions import parse
from affinity_sim.kvcache import KvPool
from affinity_sim.presets import preset
from affinity_sim.prscale import ABLATIONS, SCALE_POLICIES, replica_model, scale_workloads
from affinity_sim.replica import QueueTracker, Replica, Request
from affinity_sim.routing import parse_policy
from affinity_sim.simulate import simulate_step
from affinity_sim.workload import TrajectoryPlan, plan_step

STEP_BUDGET_S = 30.0  # the issue's bar for one PR-scale step on one core


def test_pool_is_derived_from_the_model_not_fitted() -> None:
    # (4 GPUs x 141 GB x utilization - 65 GB weights - 4 x 2.5 GB) / 262,144 B per token
    assert replica_model(0.5).kv_capacity_tokens == int((4 * 141e9 * 0.5 - 65e9 - 10e9)
                                                        // 262_144) == 789_642
    assert replica_model(0.9).kv_capacity_tokens == 1_650_238
    assert replica_model(0.5).max_num_seqs == 256  # verl 0.9.1's rollout default
    names = {w.name: w for w in scale_workloads()}
    assert names["ctx9k-bigkv"].model.kv_capacity_tokens == 1_650_238
    for name in ("ctx2k", "ctx9k", "ctx20k"):
        assert names[name].model.kv_capacity_tokens == 789_642
    for w in names.values():
        assert (w.replicas, w.prompts, w.samples, w.trajectories) == (16, 512, 16, 8192)
        assert w.tie_break == "first" and w.agent_workers == 8


def test_preset_runs_the_issue_policies() -> None:
    sweep = preset("pr7435-scale")
    assert [p.name for p in sweep.policies] == list(SCALE_POLICIES)
    assert sweep.seeds >= 10
    assert {w.name for w in sweep.workloads} == {"ctx2k", "ctx9k", "ctx20k", "ctx9k-bigkv"}
    ablation = preset("pr7435-scale-ablation")
    features = {w.name.partition("/")[2] for w in ablation.workloads} - {""}
    assert features == set(ABLATIONS)


def test_worker_interleave_is_a_permutation_keeping_each_workers_order() -> None:
    w = attrs.evolve(scale_workloads(prompts=8)[0], agent_workers=4)
    plans = plan_step(w, 3)
    plain = plan_step(attrs.evolve(w, agent_workers=1), 3)
    assert sorted(p.index for p in plans) == list(range(len(plain)))
    assert [p.request_id for p in sorted(plans, key=lambda p: p.index)] == \
        [p.request_id for p in plain]  # same trajectories, only the order differs
    chunk = len(plain) // 4
    for worker in range(4):
        order = [p.index for p in plans if p.index // chunk == worker]
        assert order == sorted(order)
    assert [p.index for p in plans] != [p.index for p in plain]


def test_one_pr_scale_step_within_budget() -> None:
    """Full size, not a smoke variant: 8,192 trajectories on 16 replicas, ctx9k, seed 0."""
    workload = next(w for w in scale_workloads() if w.name == "ctx9k")
    plans = plan_step(workload, 0)
    cpu = time.process_time()
    result = simulate_step(workload, parse_policy("margin-2"), 0, plans)
    cpu = time.process_time() - cpu
    assert cpu <= STEP_BUDGET_S, f"one PR-scale step took {cpu:.1f} s of CPU"
    assert result.turns == sum(len(p.outputs) for p in plans) > 8192
    assert 0.0 < result.prefix_hit_rate < 1.0
    assert result.breaks > 0 and result.step_time_s > 0
    assert sum(result.requests_per_replica) == result.turns


def test_truncate_drops_a_dead_branch() -> None:
    pool = KvPool(capacity_blocks=10, block_size=16)
    pool.admit(-1, 0, 0, own_blocks=5)
    pool.release(-1, 0, 0, own_blocks=5, cached_own=5)
    pool.truncate(0, 3)
    assert (dict(pool.lru), pool.evictable) == ({0: 3}, 3)
    pool.truncate(0, 0)
    assert (dict(pool.lru), pool.evictable) == ({}, 0)


@pytest.mark.parametrize("limit", [1, 2])
def test_client_concurrency_serializes_turns(limit: int) -> None:
    base = scale_workloads(prompts=1)[0]
    w = attrs.evolve(base, replicas=2, prompts=2, samples=1, client_concurrency=limit,
                     model=base.model.with_capacity(16_384))
    plans = [TrajectoryPlan(i, i, f"s{i}", 100, (50, 50), (10,), (0.0,), rewinds=(20,))
             for i in range(2)]
    result = simulate_step(w, parse_policy("legacy"), 0, plans)
    alone = simulate_step(attrs.evolve(w, client_concurrency=0), parse_policy("legacy"), 0,
                          plans)
    assert result.turns == 4
    if limit == 1:
        assert result.step_time_s > alone.step_time_s  # one request at a time
    else:
        assert result.step_time_s == pytest.approx(alone.step_time_s)
    # The second turn's prompt is 100 + 50 - 20 + 10 = 140 tokens, 8 cached blocks of 16
    # survive the rewind (130 tokens kept): a hit of 128 tokens per session.
    assert result.hit_tokens == 2 * 128


def test_difficulty_is_shared_by_a_prompts_samples_and_turns() -> None:
    base = attrs.evolve(scale_workloads(prompts=6)[0], agent_workers=1, difficulty_sigma=0.0,
                        output_tokens=parse("o", {"dist": "constant", "value": 100}))
    plain = plan_step(base, 5)
    assert {o for p in plain for o in p.outputs} == {100}
    hard = plan_step(attrs.evolve(base, difficulty_sigma=0.5), 5)
    # Only the outputs change: every other draw comes from the same stream as before.
    assert [(p.request_id, p.prompt_tokens, len(p.outputs)) for p in hard] == \
        [(p.request_id, p.prompt_tokens, len(p.outputs)) for p in plain]
    by_group: dict[int, set[int]] = {}
    for p in hard:
        by_group.setdefault(p.group, set()).update(p.outputs[:-1])  # the last may be cut
    assert all(len(lengths) <= 1 for lengths in by_group.values())
    assert len({min(v) for v in by_group.values() if v}) > 1  # groups differ
    assert plan_step(attrs.evolve(base, difficulty_sigma=0.0), 5) == plain
    with pytest.raises(ValueError, match="difficulty_sigma must be a number >= 0, got -1"):
        attrs.evolve(base, difficulty_sigma=-1)


def test_the_scale_preset_keeps_the_marginal_output_spread() -> None:
    w = scale_workloads()[1]
    within = dict(w.output_tokens.params)["sigma"]
    assert math.isclose(within**2 + w.difficulty_sigma**2, 0.8**2)
    assert math.isclose(within, w.difficulty_sigma)  # the a-priori even split
    assert w.model.count_blocked_lookups and w.model.skip_waiting_after_preemption


def _hand_model(**changes: object) -> ReplicaModel:
    fields: dict[str, object] = {
        "name": "hand", "decode_fixed_s": 0.01, "per_token_s": 0.001,
        "kv_read_s_per_token": 0.0, "prefill_attn_s_per_pair": 0.0,
        "kv_capacity_tokens": 16 * 3, "block_size": 16, "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
    }
    fields.update(changes)
    return ReplicaModel(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [False, True])
def test_blocked_head_lookups_are_counted_every_iteration(count: bool) -> None:
    # Pool of 3 blocks. A (prompt 32 = 2 shared blocks, output 15) pins all 3 and never
    # grows past them. B, a sibling (same group, prompt 32), arrives during A's prefill and
    # needs one own block: it is blocked for A's 14 decode iterations. vLLM 0.24 looks it up
    # at each (1 after the prefill iteration + 13 more in the decode run), every time
    # finding 1 cached block (the lookup never covers the last prompt token: 16 tokens).
    env = simpy.Environment()
    replica = Replica(env, 0, _hand_model(count_blocked_lookups=count), QueueTracker(1))

    def client(at: float, traj: int):  # type: ignore[no-untyped-def]
        yield env.timeout(at)
        request = Request(env, traj, -1, 2, 32, 15)
        replica.submit(request)
        yield request.done

    env.process(client(0.0, 0))
    env.process(client(0.001, 1))
    env.run()
    assert (replica.query_tokens, replica.hit_tokens) == (64, 16)  # one per admission
    expected = (14 * 32, 14 * 16) if count else (0, 0)
    assert (replica.retry_query_tokens, replica.retry_hit_tokens) == expected


def test_no_admission_in_a_preempting_step_changes_no_result() -> None:
    # The victim heads the queue and needs a block more than it freed, so it could not be
    # re-admitted in that step anyway: only the (unexported) preempted lookups differ, and
    # time sums round differently (a decode run is split after each preempting step).
    w = attrs.evolve(scale_workloads(prompts=4)[1], replicas=2,
                     model=replica_model(0.5).with_capacity(40_000))
    on = simulate_step(w, parse_policy("margin-2"), 1)
    off = simulate_step(attrs.evolve(w, model=attrs.evolve(
        w.model, skip_waiting_after_preemption=False)), parse_policy("margin-2"), 1)
    assert on.preemptions > 0
    ignore = {"preempted_query_tokens", "preempted_hit_tokens"}
    a, b = on.as_dict(), off.as_dict()
    for key in set(a) - ignore:
        if isinstance(a[key], float):
            assert a[key] == pytest.approx(b[key], rel=1e-9), key
        else:
            assert a[key] == b[key], key
